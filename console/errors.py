"""One clear line on stderr and a non-zero exit for every error a user can cause."""

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import typer

EXIT_FAILURE = 1
EXIT_USAGE = 2


def fail(message: str, code: int = EXIT_FAILURE) -> typer.Exit:
    print(f"fleetctl: error: {message}", file=sys.stderr)
    return typer.Exit(code)


def _user_errors() -> tuple[type[Exception], ...]:
    # imported here so `fleetctl --help` does not pay for torch
    from fleetctl.engine.core.device_names import DeviceError
    from fleetctl.engine.core.prompt import PromptError
    from fleetctl.engine.core.sequence import SamplingError
    from fleetctl.engine.model.config import ModelConfigError
    from fleetctl.engine.model.loader import WeightLoadError
    from fleetctl.engine.model.store import ModelStoreError
    from fleetctl.engine.model.tokenizer import TokenizerError

    return (DeviceError, PromptError, ModelConfigError, WeightLoadError, ModelStoreError, TokenizerError,
            SamplingError)


@contextmanager
def user_errors(on_error: Callable[[], None] | None = None) -> Iterator[None]:
    """Turn the engine's user-facing exceptions into `fail(...)`."""
    errors = _user_errors()
    try:
        yield
    except errors as exc:
        if on_error:
            on_error()
        raise fail(str(exc)) from None
    except KeyboardInterrupt:
        raise fail("interrupted", 130) from None
