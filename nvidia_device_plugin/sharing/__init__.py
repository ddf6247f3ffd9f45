"""Sharing GPUs between containers: time-slicing needs nothing here; MPS needs its contract and daemons."""
