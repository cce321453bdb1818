"""`/fleet/status`, `/fleet/workers`, a worker's sessions and the fleet's log lines: the `status --json` and
`workers --json` contract and what the console's panels read."""

from pydantic import Field

from fleetctl.engine.api.open_model import OpenModel


class WorkerInfo(OpenModel):
    id: str
    role: str
    device: str
    node: str | None  # a Ray fleet's node (None: this machine)
    node_lost: bool
    state: str
    pid: int | None
    sessions: int
    kv_usage: float
    kv_blocks: int
    weights: str = ""  # the layers' weight format: the dtype (bfloat16) or int8, int4-g64, int4-gguf; "" starting
    kv_dtype: str = ""  # the KV pool's stored format: the dtype (bfloat16) or int8; "" starting
    kv_tokens: int = 0  # the KV pool's capacity in tokens (kv_blocks x the block size)
    free_blocks: int
    busy: float
    mfu: float
    mbu: float
    tokens_per_s: float
    prefix_hit_ratio: float
    was: str | None = None  # its id before it switched role in place (`fleetctl switch`)
    # speculative decoding since it started: the share of draft tokens that stood, and the tokens a verifying
    # sequence gained per step (None: it verified no draft)
    spec_acceptance: float | None = None
    spec_tokens_per_step: float | None = None
    # seconds since its last step while it holds work, once past its stall bound (engine/fleet/stalls.py);
    # None: it steps as it should
    stalled_s: float | None = None

    @property
    def shown_state(self) -> str:
        """Its state as a table shows it: with how long it has been stalled, if it is."""
        if self.stalled_s is None:
            return self.state
        return f"{'' if self.state == 'running' else f'{self.state} · '}stalled {self.stalled_s:.0f}s"


class PoolInfo(OpenModel):
    workers: int
    busy: float
    mfu: float
    mbu: float
    queue: int
    prefix_hit_ratio: float
    # prompt tokens each KV tier read back for its workers (part of the cached)
    tier_tokens: dict[str, int] = Field(default_factory=dict)
    spec_acceptance: float | None = None  # its workers' speculative decoding together, as WorkerInfo's
    spec_tokens_per_step: float | None = None
    outlier: str | None = None  # the running worker apart from its peers (busy, sessions), in a sentence
    # finished requests its workers computed whose output a grammar held, by kind (json_object, json_schema, tools,
    # grammar), since they started
    structured_requests: dict[str, int] = Field(default_factory=dict)


class TierInfo(OpenModel):
    """One KV tier under the pools (node-wide): what it holds against its bound, as last measured."""

    used_bytes: int
    capacity_bytes: int


class StoreInfo(OpenModel):
    """The metrics store the fleet writes: failing while its file refuses writes (a full disk, an I/O error), the
    rows kept meanwhile; requests never wait on it."""

    path: str
    failing: bool
    problem: str | None = None  # "disk full", "I/O error", "read-only", …
    error: str | None = None  # the whole line: the file, what is wrong, what to do
    failing_since: float | None = None  # time.time() of the first refused write
    kept_rows: int = 0


class SplitRegretInfo(OpenModel):
    """The current layout's goodput as a share of the best layout's, replayed over the last 5 minutes every
    interval (fleet/ops/split_regret.py): the newest replay, and the series of its ratios, oldest first."""

    ratio: float
    current: str
    best: str
    at: float
    series: list[float]
    verdict: str = ""  # the replay's advice (planner/advice.py): keep, move or unknown ("": a fleet before it)
    target: str = ""  # the layout it advises running
    advice: str = ""  # its sentence, word for word the plan's `advice.sentence` for the same replay


class RouteInfo(OpenModel):
    """One prefill → decode route's handoffs over the flow's window."""

    prefill: str
    decode: str
    handoffs: int
    bytes_per_s: float  # KV bytes adopted over the window, per second
    p99_s: float  # the slowest 1 % of its handoffs (publish and adopt)


class FlowInfo(OpenModel):
    """How prompts reached the worker that decodes them over the last `window_s` (engine/fleet/kv_flow.py)."""

    window_s: float
    handoffs: int  # prefilled on a prefill worker, KV adopted by a decode worker
    local_prefills: int  # a decode worker prefilled it itself (it cached all but `--local-prefill-tokens`)
    colocated: int  # a mixed worker prefills and decodes it
    recomputes: int  # KV rebuilt from tokens (a death, a lost handoff, a refused move)
    decode_recomputes: int  # of those, the ones a decode worker prefilled itself
    routes: list[RouteInfo] = Field(default_factory=list)  # by bytes per second, busiest first

    @property
    def local_share(self) -> float | None:
        """The share of prompts that reached their decoding worker without a handoff; None: none arrived."""
        local = self.local_prefills + self.colocated + self.decode_recomputes
        return local / (local + self.handoffs) if local + self.handoffs else None


class FleetStatus(OpenModel):
    model: str
    url: str
    pid: int
    window_s: float
    workers: list[WorkerInfo]
    pools: dict[str, PoolInfo]  # by role
    local_prefills: int
    store: StoreInfo | None = None  # None: the fleet keeps no store
    # by tier (host, disk), once a worker reported one; {}: the fleet has none
    kv_tiers: dict[str, TierInfo] = Field(default_factory=dict)
    split_regret: SplitRegretInfo | None = None  # None: no store, or no window replayed yet
    flow: FlowInfo | None = None  # None: a fleet from before it was reported


class WorkerList(OpenModel):
    workers: list[WorkerInfo]


class LogLineInfo(OpenModel):
    seq: int  # increasing across sources: ask `since` the last one seen for only newer lines
    time: float  # time.time() when the controller read it
    source: str  # "fleet" (the controller) or a worker id
    level: str  # info, warning, error
    text: str


class FleetLogLines(OpenModel):
    lines: list[LogLineInfo]  # oldest first
    next: int  # the `since` that asks for lines after these


class SessionInfo(OpenModel):
    id: str
    stage: str
    prompt_tokens: int
    output_tokens: int
    age_s: float


class WorkerSessions(OpenModel):
    worker: str
    sessions: list[SessionInfo]
