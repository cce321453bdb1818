"""fleetctl.store."""
