"""`/fleet/requests`: finished requests' timing breakdowns, and those in flight."""

from pydantic import Field

from fleetctl.engine.api.open_model import OpenModel


class RequestRecord(OpenModel):
    """A finished request's timing breakdown (`TrackedRequest.record`)."""

    request_id: str
    arrival: float
    queue_s: float
    prefill_s: float
    ttft_s: float
    handoff_s: float
    handoff_bytes: int
    handoff_wall_s: float
    first_decode_s: float
    decode_s: float
    e2e_s: float
    prompt_tokens: int
    output_tokens: int
    prefill_worker: str | None
    decode_worker: str | None
    outcome: str
    recomputes: int
    prefill_cached_tokens: int
    prefill_computed_tokens: int
    local_prefill: bool
    tier_cached_tokens: dict[str, int] = Field(default_factory=dict)  # of the cached ones, what a KV tier served
    session: str = ""  # the agent session it was a turn of (X-Session-Id or `user`)
    constraint: str = ""  # what its output was held to: json_object, json_schema:NAME, tools:CHOICE ("" none)
    mask_s: float = 0.0  # its grammar masks' compute time (beside its steps' forward passes)
    stage: str = "done"  # a live one's: queued, prefill, handoff, decode (its times so far, up to now)
    # its tokens after the first over time: how many came in each bucket of token_bucket_s seconds from its first
    # token (the last bucket runs to its end, or to now); at most 64 buckets, wider as it runs longer
    token_bucket_s: float = 0.0
    token_counts: list[int] = Field(default_factory=list)


class RecentRequests(OpenModel):
    requests: list[RequestRecord]  # finished, newest last
    live: list[RequestRecord] = Field(default_factory=list)  # not finished yet, oldest first
