"""What one advertised resource answers kubelet: its backend, Allocate as named steps, preferences."""
