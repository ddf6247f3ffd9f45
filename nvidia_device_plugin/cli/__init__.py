"""Every command and its flags: the only code that parses argv or chooses real or simulated NVML."""

from nvidia_device_plugin.base import dataclass_code

# Before any command's module makes its dataclasses: their compiled methods come from the cache.
dataclass_code.install()
