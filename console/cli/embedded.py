"""The embedded fleet that `fleetctl console` and `fleetctl demo` start when no fleet is given: `fleetctl serve`
as a child process on this machine's devices (the layout is loadgen/local_fleet.py's), stopped when the command
ends."""

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fleetctl.console.cli.common import fail, user_errors
from fleetctl.console.cli.models import resolve_model
from fleetctl.domain import Quantization


@contextmanager
def embedded_fleet(model: str, store: Path, quantization: Quantization = Quantization.NONE) -> Iterator[str]:
    """Yields the URL of an embedded fleet of `model` (its linear weights in `quantization`) writing the
    metrics store `store`; a store or a model that
    cannot be had, or a fleet that does not start, is one error line (the store is opened first: its error comes
    before a model is loaded)."""
    from fleetctl.console.loadgen.local_fleet import FleetStartError, embedded_fleet_args, local_fleet
    from fleetctl.store.db import open_db

    open_db(store).close()
    with user_errors():
        model_dir = resolve_model(model)
    try:
        with local_fleet(model_dir, *embedded_fleet_args(store), "--quantization", quantization.value) as url:
            yield url
    except FleetStartError as exc:
        raise fail(f"the embedded fleet did not start: {exc.reason}") from None
