"""The error a model's weights on disk give when they do not match its config.json. Torch-free, so the CLI can
name it among the errors it reports in one line without importing torch (seconds at start and at exit)."""

from fleetctl.errors import UserError


class WeightLoadError(UserError):
    """The weights on disk do not match what config.json describes."""
