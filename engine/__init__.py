"""The serving engine, one subpackage per concern. Imports flow one way:
server → fleet → worker → checkpoint → core → metrics → model → kernels (any of them may use
`fleetctl.store`; `paths` is for all). `tests/test_layers.py` enforces it."""
