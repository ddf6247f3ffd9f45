"""Project exceptions. Each message is written for a cluster operator, naming the thing that is wrong."""


class DevicePluginError(Exception):
    """Base class for every error this project raises on purpose."""


class ConfigError(DevicePluginError):
    """A config file, flag or environment variable is invalid; the message names the field and value."""


class NvmlError(DevicePluginError):
    """NVML failed (or is missing); wraps pynvml.NVMLError with an operator-readable message."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class InventoryError(DevicePluginError):
    """The discovered devices cannot be advertised as configured (for example a MIG strategy mismatch)."""


class AllocationError(DevicePluginError):
    """A kubelet request cannot be honoured; translated to gRPC INVALID_ARGUMENT at the server edge."""
