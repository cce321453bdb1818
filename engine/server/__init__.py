"""The HTTP face of one fleet: the FastAPI app, OpenAI-compatible routes, /fleet/* routes, admin auth and
the typed /fleet/* contract (`schemas`). Imports no torch. May import fleet and below."""
