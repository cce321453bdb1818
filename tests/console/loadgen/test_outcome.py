"""An error line says what happened: httpx raises a connection reset mid-answer as `ReadError('')` (its message
lives in the causes, or nowhere), which the demo's summary printed as `first error: ReadError:`."""

import httpx
import pytest

from fleetctl.console.loadgen.outcome import http_error_text


def raised(exc: Exception, *causes: BaseException) -> Exception:
    """`exc` raised from the chain `causes` (innermost last), as httpx and anyio chain them."""
    for outer, inner in zip((exc, *causes), causes, strict=False):
        outer.__cause__ = inner
    return exc


def test_the_message_comes_from_the_first_cause_that_has_one() -> None:
    reset = raised(httpx.ReadError(""), httpx.ReadError(""), ConnectionResetError(104, "Connection reset by peer"))
    assert http_error_text(reset) == "ReadError: [Errno 104] Connection reset by peer"


def test_with_no_message_anywhere_it_says_what_the_error_means() -> None:
    class BrokenResourceError(Exception):  # anyio's, which carries no message
        pass

    bare = raised(httpx.ReadError(""), httpx.ReadError(""), BrokenResourceError())
    assert http_error_text(bare) == "ReadError: the connection was closed or reset while reading the answer"
    assert http_error_text(httpx.ConnectError("")) == \
        "ConnectError: the connection was closed or reset while talking to the fleet"


@pytest.mark.parametrize("message", ["timed out", "HTTP 500"])
def test_a_message_of_its_own_is_kept(message: str) -> None:
    assert http_error_text(httpx.ReadTimeout(message)) == f"ReadTimeout: {message}"
