"""The pynvml simulator: a fake NVML at the nvml.api Protocol, failures included, and its node files."""
