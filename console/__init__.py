"""fleetctl.console: the command line (cli/) over the demo (demo/), the load generator (loadgen/) and the Textual
console (tui/), all over one client of the fleet's API (client.py)."""
