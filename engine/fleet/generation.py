"""A request the fleet admitted, as its caller follows it (`Fleet.generate`): its id, its events as they come,
its token counts and how it ended, and `cancel` to stop it wherever it runs. The controller's own record of the
request (`TrackedRequest`: where it lives, its KV, its timing) stays inside the fleet."""

from collections.abc import AsyncIterator, Callable

from fleetctl.engine.fleet.request import StreamEvent, TrackedRequest


async def stream_events(req: TrackedRequest) -> AsyncIterator[StreamEvent]:
    """The request's events as they come, up to and including the final one (its end or its error)."""
    while True:
        event = await req.events.get()
        yield event
        if event.final:
            return


class Generation:
    def __init__(self, req: TrackedRequest, cancel: Callable[[TrackedRequest], None]) -> None:
        self._req = req
        self._cancel = cancel

    @property
    def id(self) -> str:
        return self._req.request_id

    @property
    def prompt_tokens(self) -> int:
        return len(self._req.prompt_token_ids)

    @property
    def output_tokens(self) -> int:
        """Tokens generated so far."""
        return len(self._req.output_token_ids)

    @property
    def finish_reason(self) -> str | None:
        """"stop", "length" or "abort" once it finished; None while it runs or when it failed."""
        return self._req.finish_reason

    @property
    def done(self) -> bool:
        return self._req.done

    def events(self) -> AsyncIterator[StreamEvent]:
        """Its events, read once: text deltas with their tokens, then the end (a finish reason or an error)."""
        return stream_events(self._req)

    def cancel(self) -> None:
        """The client went away: stop the work wherever it is (a no-op once it ended)."""
        self._cancel(self._req)
