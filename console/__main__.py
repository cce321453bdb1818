"""`python -m fleetctl.console` runs the CLI (used by tests to run the exact CLI in a subprocess)."""

from fleetctl.console.cli.app import main

if __name__ == "__main__":  # spawned worker processes re-import this module as __mp_main__
    main()
