"""Sharing GPUs between containers: time-slicing needs nothing here; MPS needs its contract and daemons."""

CONTROL_EXECUTABLE = "nvidia-cuda-mps-control"  # the MPS control program, looked up on PATH
# All the `quit`s of one config change, and the exits of their daemons, within this (sharing/mps_daemon.py):
# a reload, and SIGTERM waiting behind it, never waits longer on control daemons that hang.
QUIT_TIMEOUT_S = 10.0
