"""What the tests share: a tiny random Llama, in-process fake workers and their checkpoints, a fleet
harness that starts real workers and a server, a synthetic metrics store, the console's fixture source."""
