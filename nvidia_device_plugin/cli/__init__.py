"""Every command and its flags: the only code that parses argv or chooses real or simulated NVML."""
