"""fleetctl.themes."""
