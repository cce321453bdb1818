"""Traffic classification: the share of model time spent in prefill vs decode over a window,
overall and by prompt-length × output-length bucket (`fleetctl classify`).

Model time is each request's attributed share of its workers' busy time (`prefill_model_s`,
`decode_model_s` on the request row), not its wall-clock phase latency: that is what tells an
operator how much device each phase consumes. A step's time is shared by the tokens each sequence
computed in it, so prompt tokens a prefix cache served cost nothing (agent traffic is decode-heavy
only with the cache in play); the window's cached and computed prompt tokens are reported beside the
shares. Every request that arrived in the window counts, whatever its outcome, since its steps ran
either way.
"""

import itertools
import time
from dataclasses import asdict, dataclass, field

from sqlite_utils import Database

LENGTH_EDGES = (0, 128, 512, 2048)  # bucket i holds lengths in [edge i, edge i+1); the last is open


def bucket_labels(edges: tuple[int, ...] = LENGTH_EDGES) -> list[str]:
    """["0-128", "128-512", "512-2048", "2048+"] for the default edges."""
    return [f"{lo}-{hi}" for lo, hi in itertools.pairwise(edges)] + [f"{edges[-1]}+"]


@dataclass(frozen=True)
class ClassifyBucket:
    prompt_tokens: str  # bucket label, e.g. "128-512"
    output_tokens: str
    requests: int
    prefill_share: float


@dataclass(frozen=True)
class Classification:
    window_s: float
    requests: int
    prefill_share: float  # prefill_share + decode_share == 1 (both 0 when no model time was spent)
    decode_share: float
    prefill_model_s: float  # the totals behind the shares, so that windows can be added up
    decode_model_s: float
    buckets: list[ClassifyBucket]  # non-empty buckets only, by prompt bucket then output bucket
    prefill_cached_tokens: int = 0  # prompt tokens the prefix cache served (no model time)
    prefill_computed_tokens: int = 0  # tokens prefill steps computed
    prefix_hit_ratio: float = 0.0  # cached / (cached + computed)
    local_prefills: int = 0  # requests their decode worker prefilled (conditional disaggregation)
    tier_tokens: dict[str, int] = field(default_factory=dict)  # of the cached tokens, what each KV tier served

    def as_json(self) -> dict[str, object]:
        """Exactly the `fleetctl classify --json` object."""
        return asdict(self)


def _bucket_case(column: str, edges: tuple[int, ...]) -> str:
    whens = " ".join(f"WHEN {column} < {hi} THEN {i}" for i, hi in enumerate(edges[1:]))
    return f"CASE {whens} ELSE {len(edges) - 1} END"


def _share(prefill_s: float, decode_s: float) -> float:
    total = prefill_s + decode_s
    return prefill_s / total if total > 0 else 0.0


def classify(db: Database, window_s: float, now: float | None = None) -> Classification:
    now = time.time() if now is None else now
    labels = bucket_labels()
    rows = db.execute(
        f"SELECT {_bucket_case('prompt_tokens', LENGTH_EDGES)} AS pb, {_bucket_case('output_tokens', LENGTH_EDGES)} "
        "AS ob, COUNT(*), TOTAL(prefill_model_s), TOTAL(decode_model_s), TOTAL(prefill_cached_tokens), "
        "TOTAL(prefill_computed_tokens), TOTAL(local_prefill), TOTAL(host_tier_tokens), TOTAL(disk_tier_tokens) "
        "FROM requests "
        "WHERE ts >= ? AND ts < ? GROUP BY pb, ob ORDER BY pb, ob",
        [now - window_s, now],
    ).fetchall()
    buckets = [ClassifyBucket(labels[pb], labels[ob], count, _share(pre, dec)) for pb, ob, count, pre, dec, *_ in rows]
    prefill = sum(r[3] for r in rows)
    decode = sum(r[4] for r in rows)
    prefill_share = _share(prefill, decode)
    decode_share = 1.0 - prefill_share if prefill + decode > 0 else 0.0
    cached, computed, local, host, disk = (int(sum(r[i] for r in rows)) for i in (5, 6, 7, 8, 9))
    tiers = {tier: tokens for tier, tokens in (("host", host), ("disk", disk)) if tokens}
    return Classification(window_s, sum(r[2] for r in rows), prefill_share, decode_share, prefill, decode, buckets,
                          cached, computed, _share(cached, computed), local, tiers)
