"""fleetctl.kernels."""
