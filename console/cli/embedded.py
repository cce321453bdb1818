"""The embedded fleet that `fleetctl console` and `fleetctl demo` start when no fleet is given: `fleetctl serve`
as a child process on this machine's devices (its layout: `embedded_fleet_args`), stopped when the command ends."""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fleetctl.console.cli.common import fail
from fleetctl.console.cli.models import resolve_model
from fleetctl.console.loadgen.local_fleet import CPU_DECODE_WORKERS
from fleetctl.domain import Quantization

EMBEDDED_GRACE_S = 4.0  # the embedded fleet's --grace: quitting the console ends it, workers and all, within this


def embedded_fleet_args(store: Path | None = None) -> list[str]:
    """The `fleetctl serve` arguments (all but --model) of the embedded fleet on this machine's devices:
    one worker per GPU, 1 prefill + the rest decode (one GPU: a prefill and a decode worker on two slots of it);
    without GPUs 1 prefill + 2 decode on the logical slots cpu:0..2. `store` defaults to $FLEET_HOME/fleet.db.
    Its grace is short: the person who quits the console is not serving anyone else."""
    from fleetctl.engine.core.local_devices import gpu_count
    from fleetctl.engine.paths import default_store_path

    gpus = gpu_count()
    if gpus == 1:
        devices = ["cuda:0", "cuda:0"]
    else:
        devices = [f"cuda:{i}" for i in range(gpus)] if gpus else [f"cpu:{i}" for i in range(1 + CPU_DECODE_WORKERS)]
    layout = ["--prefill", "1", "--decode", str(len(devices) - 1), "--devices", ",".join(devices)]
    return [*layout, "--grace", f"{EMBEDDED_GRACE_S:g}", "--store", str(store or default_store_path())]


@contextmanager
def embedded_fleet(model: str, store: Path, quantization: Quantization = Quantization.NONE) -> Iterator[str]:
    """Yields the URL of an embedded fleet of `model` (its linear weights in `quantization`) writing the
    metrics store `store`; a store or a model that
    cannot be had, or a fleet that does not start, is one error line (the store is opened first: its error comes
    before a model is loaded)."""
    from fleetctl.console.loadgen.local_fleet import FleetStartError, local_fleet
    from fleetctl.store.db import open_db

    open_db(store).close()
    model_dir = resolve_model(model)
    try:
        with local_fleet(model_dir, *embedded_fleet_args(store), "--quantization", quantization.value) as url:
            yield url
    except FleetStartError as exc:
        raise fail(f"the embedded fleet did not start: {exc.reason}") from None
