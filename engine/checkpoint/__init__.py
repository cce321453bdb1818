"""Checkpoint format v1 (torch-free: the controller lists and checks checkpoints) and the engine's
side of writing and restoring one. May import core and below."""
