"""The Textual console: a dashboard of the fleet's pools, workers, devices, traffic and events, and the
worker lifecycle (migrate, checkpoint, restore, drain, stop, start) from the keyboard."""
