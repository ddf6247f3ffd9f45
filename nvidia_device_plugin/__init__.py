"""Kubernetes device plugin for NVIDIA GPUs: whole GPUs, time-slicing, MPS and MIG."""

__version__ = "0.2.0"
