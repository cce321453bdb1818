"""fleetctl: a fleet console and serving engine for disaggregated LLM inference."""

__version__ = "0.1.0"
