"""fleetctl.engine.model."""
