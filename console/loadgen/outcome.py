"""What the load generator measured of one request (at the client), and the summaries `fleetctl bench` reports of
many: latency percentiles, and for agent sessions speaking the chat API the constrained turns' schema-valid rate
and their TPOT beside the unconstrained turns'."""

from dataclasses import dataclass

import httpx

from fleetctl.store.queries import percentiles


def http_error_text(exc: httpx.HTTPError) -> str:
    """`ReadError: [Errno 104] Connection reset by peer` — the first message along the exception's causes, since
    httpx raises a reset connection as `ReadError('')`; with none anywhere, what the error means."""
    message, cause = str(exc), exc.__cause__ or exc.__context__
    while not message and cause is not None:
        message, cause = str(cause), cause.__cause__ or cause.__context__
    if not message:
        kind = "reading the answer" if isinstance(exc, httpx.ReadError) else "talking to the fleet"
        message = f"the connection was closed or reset while {kind}"
    return f"{exc.__class__.__name__}: {message}"


@dataclass
class Outcome:
    ttft_s: float = 0.0
    e2e_s: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None
    start_s: float = 0.0  # when it was sent, seconds after its run (warm-up or measured) began
    text: str = ""  # the answer (a session's next turn appends it); a chat answer's content
    turn: int = 0  # the turn of its session (0 for a single request)
    tool_calls: tuple[dict, ...] = ()  # a chat answer's calls, as OpenAI's message lists them
    constrained: bool = False  # it asked for tool calls or a JSON schema
    schema_problem: str | None = None  # a constrained answer's first departure from the schema asked (None: valid)

    @property
    def tpot_s(self) -> float:
        return (self.e2e_s - self.ttft_s) / (self.completion_tokens - 1) if self.completion_tokens > 1 else 0.0

    @property
    def schema_valid(self) -> bool | None:
        """Whether a constrained answer is valid under its schema (None: unconstrained, or the request failed)."""
        return self.schema_problem is None if self.constrained and not self.error else None

    def as_json(self) -> dict:
        seconds = {name: round(getattr(self, name), 5) for name in ("start_s", "ttft_s", "tpot_s", "e2e_s")}
        return seconds | {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                          "error": self.error, "constrained": self.constrained, "schema_valid": self.schema_valid,
                          "schema_problem": self.schema_problem}


def percentile_json(values: list[float]) -> dict[str, float]:
    """{"p50", "p90", "p99"} in seconds (0.0 when nothing succeeded)."""
    cuts = percentiles(values)
    return {name: round(getattr(cuts, name) or 0.0, 5) for name in ("p50", "p90", "p99")}


def constrained_summary(outcomes: list[Outcome]) -> dict[str, object]:
    """The constrained answers' schema-valid rate (None when there were none) and TPOT percentiles of the
    constrained and the unconstrained requests that succeeded."""
    ok = [o for o in outcomes if not o.error]
    constrained = [o for o in ok if o.constrained]
    valid = sum(1 for o in constrained if o.schema_valid)
    return {"constrained_requests": len(constrained), "schema_valid_requests": valid,
            "schema_valid_rate": round(valid / len(constrained), 4) if constrained else None,
            "tpot_constrained_s": percentile_json([o.tpot_s for o in constrained]),
            "tpot_unconstrained_s": percentile_json([o.tpot_s for o in ok if not o.constrained])}
