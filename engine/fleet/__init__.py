"""The fleet controller and what it composes: config, router, dispatch, handoff, recovery, operations,
worker links, live stats and the store recorder. Holds no tensors and imports no torch. May import worker
and below."""
