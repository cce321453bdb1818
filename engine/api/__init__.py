"""The wire contract: every `/fleet/*` request and response model, the operations' kinds, states, stages and
results, the store's history as a remote console reads it, device names and trace files — what the server and the
fleet produce and the console, the CLI and the load generator parse. Torch-free, and importing nothing of fleetctl
but the vocabulary (`fleetctl.domain`, `fleetctl.errors`), so the console can be read, tested and shipped apart from
the engine's insides."""
