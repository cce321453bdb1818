"""The `fleetctl` command line (typer): `app.py` builds it, one module per command group, `common.py` what they
share. Commands import heavy things (torch, Textual, the engine) inside their functions, so that `--help` is fast."""
