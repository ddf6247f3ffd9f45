"""Device health: XID policy, the NVML monitor thread, and the registry of unhealthy devices."""
