"""Sharing GPUs between containers: time-slicing needs nothing here; MPS needs its contract and daemons."""

CONTROL_EXECUTABLE = "nvidia-cuda-mps-control"  # the MPS control program, looked up on PATH
