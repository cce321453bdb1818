"""fleetctl.engine."""
