"""The fleet's long operations, each a task an operator polls (`/fleet/operations/{id}`): the runner every
kind shares, their stages and result models, and the kinds themselves (checkpoint, restore, migrate, a
session's live move, the pool changes, rebalance, autoplan)."""
