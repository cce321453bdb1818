"""The store's reports as a fleet answers them: `/fleet/plan` (`plan --json`), `/fleet/classify` (`classify
--json`) and `/fleet/devices` (`devices --json`); a layout's label as every report writes it."""

from typing import Any

from pydantic import Field

from fleetctl.engine.api.open_model import OpenModel


def layout_label(prefill: int, decode: int, mixed: int) -> str:
    """'2:1', 'colocated 3', or '1:1:1' (any counts: a fleet losing workers may have an empty role)."""
    if not mixed:
        return f"{prefill}:{decode}"
    return f"{prefill}:{decode}:{mixed}" if prefill or decode else f"colocated {mixed}"


class SplitInfo(OpenModel):
    prefill: int
    decode: int
    mixed: int
    layout: str
    devices: int = 0  # workers in all (0 from a fleet that predates it)


class PlanCandidate(SplitInfo):
    goodput: float | str  # requests meeting both SLOs per second
    ttft_p90_s: float
    tpot_p90_s: float | None
    good_requests: int
    requests: int
    e2e_mean_s: float
    goodput_band: list[float] | None = None  # [low, high]: replayed at the cost models' error ends (None: older)


class PlanAdvice(OpenModel):
    """What the plan advises (planner/advice.py): move only when a layout's band clears the current one's."""

    verdict: str  # keep, move or unknown
    layout: str  # the layout to run
    sentence: str
    since: float | None = None  # move: time.time() of the replay that first advised it


class PlanSlo(OpenModel):
    ttft_s: float
    tpot_s: float


class FleetPlan(OpenModel):
    """`plan --json`: `recommended`, `current`, `candidates`, `reason`, and more."""

    recommended: SplitInfo
    current: SplitInfo | None
    candidates: list[PlanCandidate]  # best first
    reason: str
    best_split: SplitInfo | None
    gain_pct: float | str | None
    window_s: float
    source: str
    requests: int
    slo: PlanSlo
    devices: list[str]
    what_if: dict[str, Any] | None
    fit: dict[str, Any]
    notes: list[str]
    elastic: bool = False  # the candidates use any number of `devices`
    advice: PlanAdvice | None = None  # None: a fleet from before it


class ClassificationBucket(OpenModel):
    prompt_tokens: str  # a length bucket's label, e.g. "128-512"
    output_tokens: str
    requests: int
    prefill_share: float


class FleetClassification(OpenModel):
    """`classify --json` (`store.classify.Classification`): the window's model time by phase."""

    window_s: float
    requests: int
    prefill_share: float
    decode_share: float
    prefill_model_s: float
    decode_model_s: float
    buckets: list[ClassificationBucket]  # non-empty buckets only
    prefill_cached_tokens: int
    prefill_computed_tokens: int
    prefix_hit_ratio: float
    local_prefills: int
    # of the cached tokens, what each KV tier served (none: absent)
    tier_tokens: dict[str, int] = Field(default_factory=dict)


class DevicePeak(OpenModel):
    identity: str
    dtype: str
    kind: str
    name: str
    peak_flops: float
    peak_bytes_per_s: float
    how: str  # calibrated or spec-table
    measured_at: float  # unix seconds


class DeviceWorker(OpenModel):
    """A live worker on a device, in the weight format it serves (`devices` asked of a fleet)."""

    id: str
    role: str
    device: str
    device_name: str  # the device as the worker named it when ready ("" while it starts)
    weights: str  # bfloat16, int8, int4-g64, int4-gguf; "" while it starts
    kv_dtype: str = ""  # its KV pool's stored format: bfloat16, int8; "" while it starts
    kv_tokens: int = 0  # its KV pool's capacity in tokens


class DevicePeaks(OpenModel):
    """`devices --json`: the store's peaks per device identity and dtype (the MFU and MBU denominators), and, from
    a fleet, its workers on those devices with their weight formats."""

    devices: list[DevicePeak]
    not_recalibrated: list[str]  # identities `devices --recalibrate` left as they were (always empty from a fleet)
    workers: list[DeviceWorker] = Field(default_factory=list)  # empty from a store file
