"""fleetctl.console."""
