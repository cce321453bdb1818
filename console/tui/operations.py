"""Reading operations for the operator: how far one has got (from its stage) and what it did, in a
sentence — the console's progress bar and result line, and the same words the CLI prints."""

# Stages each operation passes through, in order (engine/fleet/operations.py and live_migrate.py set them):
# a kind may have several paths (migrate: live by default, through a checkpoint with --via checkpoint).
STAGES = {
    "migrate": (("queued", "starting destination", "moving sessions", "switching over"),
                ("queued", "starting destination", "pausing source", "writing", "restoring", "first step")),
    "restore": (("queued", "starting destination", "restoring", "first step"),),
    "checkpoint": (("queued", "pausing", "writing"),),
}


def progress_of(op: dict) -> float | None:
    """A fraction for the progress bar; None (indeterminate) for a stage this console does not know."""
    if op["state"] != "running":
        return 1.0
    stage = op["stage"].split(":")[0]
    for stages in STAGES.get(op["kind"], ()):
        if stage in stages:
            return (stages.index(stage) + 1) / (len(stages) + 1)
    return None


def describe_result(op: dict) -> str:
    if op["state"] == "failed":
        return f"{op['kind']} of {op['worker']} failed: {op['error']}"
    result = op.get("result") or {}
    if op["kind"] in ("migrate", "restore"):
        mode = result["mode"] + (f" ({result['reason']})" if result.get("reason") else "")
        return (f"{result['worker']} {result.get('from') or '-'} → {result['to']}: {mode}; {result['sessions']} "
                f"session(s), {result['bytes']:,} bytes, downtime {result['downtime_s']:.3f} s")
    if op["kind"] == "checkpoint":
        return f"{result['worker']}: {result['sessions']} session(s) saved to {result['checkpoint']}"
    details = ", ".join(f"{k} {v}" for k, v in result.items() if k != "worker")
    return f"{op['kind']} {op['worker']}: done" + (f" ({details})" if details else "")
