"""A deterministic fleet for console tests: a FleetSource with fixed status, history, host and
events (no wall clock in the picture), all of them the contract's models (`engine/api/`), whose
operations advance one of their kind's stages (`engine/api/stages.py`) per poll and end with a real result model."""

import math
import time
from collections.abc import Callable, Mapping

from textual.app import App
from textual.pilot import Pilot
from textual.widgets._footer import FooterKey

from fleetctl.console.client import FleetRefused
from fleetctl.console.tui.reading import FleetReading
from fleetctl.engine.api.checkpoints import CheckpointList
from fleetctl.engine.api.history import FleetHistory
from fleetctl.engine.api.operation_results import (
    LiveMigrateResult,
    OperationResult,
    RebalancePreview,
    RebalanceResult,
    RoleChange,
    RoleChanged,
    SessionMoved,
    SwitchResult,
)
from fleetctl.engine.api.operations import OperationInfo, OpKind, OpState
from fleetctl.engine.api.reports import FleetPlan
from fleetctl.engine.api.requests import RecentRequests, RequestRecord
from fleetctl.engine.api.stages import STAGES, CheckpointMigrateStage, LiveMigrateStage, progress
from fleetctl.engine.api.status import (
    FleetLogLines,
    FleetStatus,
    FlowInfo,
    LogLineInfo,
    PoolInfo,
    RouteInfo,
    SessionInfo,
    SplitRegretInfo,
    StoreInfo,
    TierInfo,
    WorkerInfo,
    WorkerSessions,
)

NOW = 1_764_400_000.0  # a fixed "now": event times and chart buckets derive from it


def worker(wid: str, role: str, device: str, pid: int | None = None, state: str = "running", sessions: int = 0,
           kv: float = 0.0, busy: float = 0.0, mfu: float = 0.0, mbu: float = 0.0, node: str | None = None,
           node_lost: bool = False, tokens_per_s: float = 0.0, weights: str = "", stalled_s: float | None = None,
           kv_dtype: str = "") -> WorkerInfo:
    """A worker as `/fleet/status` lists it (a pool of 256 KV blocks)."""
    return WorkerInfo(id=wid, role=role, device=device, node=node, node_lost=node_lost, state=state, pid=pid,
                      weights=weights, kv_dtype=kv_dtype, kv_tokens=256 * 16,
                      sessions=sessions, kv_usage=kv, kv_blocks=256, free_blocks=round(256 * (1 - kv)), busy=busy,
                      mfu=mfu, mbu=mbu, tokens_per_s=tokens_per_s, prefix_hit_ratio=0.0, stalled_s=stalled_s)


def _series(level: float, swing: float, phase: float) -> list[dict]:
    points = []
    for i in range(60):
        value = max(0.0, min(1.0, level + swing * math.sin(i / 6 + phase)))
        points.append({"ts": NOW - 300 + 5 * i, "busy": value, "mfu": value * 0.7, "mbu": value * 0.3,
                       "tokens_per_s": 100 * value})
    return points


def _latency() -> list[dict]:
    """TTFT and TPOT percentiles per bucket: a queue building up a minute ago (TTFT p99 near 2.3 s), a gap with no
    requests."""
    points = []
    for i in range(60):
        busy = 1 + 4 * math.exp(-((i - 45) / 4) ** 2)
        idle = 20 <= i < 23
        points.append({"ts": NOW - 300 + 5 * i, "ttft_p50": None if idle else 0.09 * busy,
                       "ttft_p99": None if idle else 0.45 * busy, "tpot_p50": None if idle else 0.061,
                       "tpot_p99": None if idle else 0.09 + 0.01 * math.sin(i / 5)})
    return points


# 16-bit prefill beside int4 decode, whose KV is int8
DENSE, INT4 = {"weights": "bfloat16", "kv_dtype": "bfloat16"}, {"weights": "int4-gguf", "kv_dtype": "int8"}
_WORKERS = [  # (id, role, device, pid, and what `worker` takes)
    ("prefill-0", "prefill", "cpu:0", 4101, {"sessions": 2, "kv": 0.05, "busy": 0.42, "mfu": 0.31, "mbu": 0.02,
                                             **DENSE}),
    ("prefill-1", "prefill", "cpu:1", 4102, {"sessions": 1, "kv": 0.02, "busy": 0.35, "mfu": 0.27, "mbu": 0.01,
                                             **DENSE}),
    ("decode-0", "decode", "cpu:2", 4103, {"sessions": 12, "kv": 0.61, "busy": 0.97, "mfu": 0.18, "mbu": 0.16,
                                           **INT4}),
    ("decode-1", "decode", "cpu:3", 4104, {"sessions": 11, "kv": 0.58, "busy": 0.95, "mfu": 0.17, "mbu": 0.15,
                                           **INT4}),
    ("decode-2", "decode", "cpu:4", 4105, {"sessions": 9, "kv": 0.44, "stalled_s": 77.0, **INT4}),  # no step for 77 s
    ("decode-3", "decode", "cpu:5", 4106, {"state": "draining", "sessions": 3, "kv": 0.12, "busy": 0.4, "mfu": 0.05,
                                           "mbu": 0.06, **INT4}),
    ("decode-4", "decode", "cpu:6", 4107, {"state": "checkpointed"}),
    ("decode-5", "decode", "cpu:7", 4108, {"state": "failed"}),
]
_WORKER_SERIES = {wid: _series(float(kw.get("busy", 0.0)), 0.1, i) for i, (wid, *_, kw) in enumerate(_WORKERS)}
# the live rate in /fleet/status: what the charts' newest bucket shows
WORKERS = [worker(wid, role, device, pid, tokens_per_s=_WORKER_SERIES[wid][-1]["tokens_per_s"], **kw)
           for wid, role, device, pid, kw in _WORKERS]
POOLS = {"prefill": PoolInfo(workers=2, busy=0.385, mfu=0.29, mbu=0.015, queue=0, prefix_hit_ratio=0.0),
         "decode": PoolInfo(workers=4, busy=0.805, mfu=0.1375, mbu=0.125, queue=0, prefix_hit_ratio=0.0,
                            spec_acceptance=0.62, spec_tokens_per_step=1.91)}
def _token_counts(tokens: int, span: float, gap: float) -> tuple[float, list[int]]:
    """(bucket seconds, counts) as the fleet keeps them (engine/fleet/token_buckets.py) for `tokens` after the first
    over `span` seconds: none for `gap` seconds (the handoff), a warm-up, an even pace and a crowded stretch at a
    third of the pace halfway."""
    bucket = 0.01
    while span / bucket >= 64:
        bucket *= 2
    n = math.ceil(span / bucket)
    weights = [0.0 if (i + 1) * bucket <= gap else 0.3 if 0.45 < i / n < 0.6 else min(1.0, (i + 1) / 6) * (
        1.15 if i % 3 == 0 else 0.9) * min(1.0, span / bucket - i) for i in range(n)]  # the last bucket cut short
    ends = [round(tokens * sum(weights[: i + 1]) / sum(weights)) for i in range(n)]
    return bucket, [end - start for start, end in zip([0, *ends[:-1]], ends, strict=True)]


def _request(rid: str, stage: str, arrival: float, queue: float, prefill: float, e2e: float, output: int,
             decode: str | None, **more: object) -> RequestRecord:
    handed = decode is not None
    if output > 1:
        bucket, counts = _token_counts(output - 1, e2e - queue - prefill, 0.063)
        more = {"token_bucket_s": bucket, "token_counts": counts, **more}
    return RequestRecord(request_id=rid, arrival=NOW - arrival, queue_s=queue, prefill_s=prefill,
                         ttft_s=queue + prefill, handoff_s=0.004, handoff_bytes=1_474_560 if handed else 0,
                         handoff_wall_s=0.011 if handed else 0, first_decode_s=0.052 if handed else 0,
                         decode_s=e2e - queue - prefill, e2e_s=e2e,
                         prompt_tokens=480, output_tokens=output, decode_worker=decode,
                         prefill_worker=None if stage == "queued" else "prefill-0",
                         outcome="stop" if stage == "done" else "running", recomputes=0, prefill_cached_tokens=320,
                         prefill_computed_tokens=160, local_prefill=False, stage=stage, **more)


# what /fleet/requests answers: three finished (one that waited 4.6 s in the queue), two decoding, one queued
REQUESTS = RecentRequests(
    requests=[_request("req-0017", "done", 41.0, 0.021, 0.180, 3.10, 48, "decode-0"),
              _request("req-0018", "done", 38.5, 4.612, 0.201, 7.95, 52, "decode-1", tier_cached_tokens={"host": 160}),
              _request("req-0019", "done", 30.2, 0.018, 0.175, 2.40, 40, "decode-2", session="agent-7")],
    live=[_request("req-0020", "decode", 6.0, 0.030, 0.190, 6.0, 71, "decode-0", constraint="tools:required",
                   mask_s=0.0123),
          _request("req-0021", "decode", 3.5, 0.025, 0.185, 3.5, 40, "decode-1"),
          _request("req-0022", "queued", 0.4, 0.4, 0.0, 0.4, 0, None)])
# what /fleet/logs answers: the controller's lines, a warning, and decode-5's last words before it failed
LOG_LINES = [LogLineInfo(seq=i + 1, time=NOW - 60 + 3 * i, source=source, level=level, text=text)
             for i, (source, level, text) in enumerate([
                 ("fleet", "info", "6 workers ready in 7.4 s: prefill-0, prefill-1, decode-0 … decode-5"),
                 ("decode-5", "warning", "UserWarning: TypedStorage is deprecated"),
                 ("fleet", "info", "112 requests, 1.4 req/s; prefill busy 38 %, decode busy 80 %"),
                 ("decode-5", "error", "Traceback (most recent call last):"),
                 ("decode-5", "error", '  File "engine/worker/loop.py", line 212, in _step'),
                 ("decode-5", "error", "RuntimeError: [enforce fail at alloc_cpu.cpp:117] not enough memory"),
                 ("fleet", "warning", "decode-5 failed (exit 1): 9 sessions recomputed on decode-0..2"),
             ])]
# a fleet with a host tier over a disk tier under its pools: how full each is, what each read back per pool
KV_TIERS = {"host": TierInfo(used_bytes=13_421_772, capacity_bytes=268_435_456),
            "disk": TierInfo(used_bytes=107_374_182, capacity_bytes=10_737_418_240)}
TIER_TOKENS = {"prefill": {"host": 1104, "disk": 240}, "decode": {"host": 336}}
# the planner's replays every 30 s: the 2:4 layout fell behind 3:3 as the traffic turned prompt-heavy (PLAN's numbers)
ADVICE = ("move to 3:3: it serves +18.1 % against the current 2:4, beyond the error (1.21–1.35 req/s against "
          "1.02–1.15 req/s)")
SPLIT_REGRET = SplitRegretInfo(ratio=0.847, current="2:4", best="3:3", at=NOW - 12,
                               series=[round(min(1.0, 1.02 - 0.006 * max(0, i - 10)), 3) for i in range(40)],
                               verdict="move", target="3:3", advice=ADVICE)
FLOW = FlowInfo(window_s=60.0, handoffs=38, local_prefills=2, colocated=0, recomputes=1, decode_recomputes=0,
                routes=[RouteInfo(prefill=p, decode=d, handoffs=n, bytes_per_s=b, p99_s=t) for p, d, n, b, t in (
                    ("prefill-0", "decode-0", 12, 2_457_600.0, 0.0041), ("prefill-1", "decode-1", 11, 2_252_800.0,
                                                                         0.0038),
                    ("prefill-0", "decode-2", 9, 1_843_200.0, 3.2), ("prefill-1", "decode-3", 6, 1_228_800.0,
                                                                        0.0036))])
STATUS = FleetStatus(model="smollm2-135m", url="http://fixture:8700", pid=4100, window_s=5.0, workers=WORKERS,
                     pools=POOLS, local_prefills=0, split_regret=SPLIT_REGRET, flow=FLOW)
HISTORY = FleetHistory.model_validate({
    "now": NOW, "window_s": 300.0, "bucket_s": 5.0,
    "pools": {"prefill": _series(0.4, 0.3, 0.0), "decode": _series(0.8, 0.15, 1.0)},
    "workers": _WORKER_SERIES,
    "latency": _latency(),
    "traffic": {"requests": 412, "requests_per_s": 1.37, "ttft_s": {"p50": 0.412, "p99": 2.31},
                "tpot_s": {"p50": 0.061, "p99": 0.118}, "prefill_share": 0.22, "decode_share": 0.78,
                "handoff_bytes_per_s": 3.4e6, "handoff_share_of_e2e": 0.0031},
    "events": [
        {"ts": NOW - 240, "kind": "start", "worker": "decode-5", "details": {"device": "cpu:7"}},
        {"ts": NOW - 200, "kind": "failure", "worker": "decode-5", "details": {"requests": 3}},
        {"ts": NOW - 120, "kind": "migrate", "worker": "decode-1",
         "details": {"from": "cpu:8", "to": "cpu:3", "mode": "restored"}},
        {"ts": NOW - 75, "kind": "stall", "worker": "decode-2",  # in a step that does not end: its heartbeat goes on
         "details": {"stalled": True, "silent_s": 5.4, "bound_s": 5.0, "sessions": 9}},
        {"ts": NOW - 60, "kind": "restore", "worker": "decode-4",
         "details": {"device": "cpu:6", "mode": "cold-start", "reason": "torch: checkpoint has '2.12'"}},
    ],
})
HOST = {"host": "lab-node", "gpus": [], "processes": {4101: 41.0, 4102: 35.0, 4103: 97.0, 4104: 95.0, 4105: 90.0,
                                                      4106: 40.0, 4107: None, 4108: None}}
def _layout(prefill: int, decode: int, goodput: float, good: int, ttft: float, tpot: float | None,
            band: tuple[float, float]) -> dict:
    return {"prefill": prefill, "decode": decode, "mixed": 0, "layout": f"{prefill}:{decode}", "goodput": goodput,
            "ttft_p90_s": ttft, "tpot_p90_s": tpot, "good_requests": good, "requests": 412, "e2e_mean_s": 3.1,
            "goodput_band": list(band)}


PLAN = FleetPlan.model_validate({  # /fleet/plan (engine/planner/plan.py) for the fixture's 2:4 fleet
    "recommended": {"prefill": 3, "decode": 3, "mixed": 0, "layout": "3:3"},
    "current": {"prefill": 2, "decode": 4, "mixed": 0, "layout": "2:4"},
    "candidates": [_layout(3, 3, 1.284, 385, 0.912, 0.081, (1.21, 1.35)),
                   _layout(2, 4, 1.087, 326, 2.43, 0.064, (1.02, 1.15)),
                   _layout(4, 2, 0.958, 287, 0.51, 0.212, (0.88, 1.04)),
                   _layout(1, 5, 0.402, 120, 9.7, 0.058, (0.35, 0.46))],
    "reason": "3:3 serves 385 of 412 requests within the SLOs against 326 at 2:4: a third prompt worker "
              "brings the TTFT p90 from 2.43 s to 0.91 s while the TPOT p90 stays at 81 ms",
    "best_split": {"prefill": 3, "decode": 3, "mixed": 0, "layout": "3:3"}, "gain_pct": 18.1,
    "window_s": 300.0, "source": "store", "requests": 412, "slo": {"ttft_s": 2.0, "tpot_s": 0.2},
    "devices": [f"cpu:{i}" for i in range(6)], "what_if": None, "fit": {},
    "notes": ["the split regret's replay of 07:06:28 UTC (every 30 s): the answer the pool panels show"],
    "advice": {"verdict": "move", "layout": "3:3", "sentence": ADVICE, "since": NOW - 72},
})
SESSIONS = [SessionInfo(id=f"req-{i:04d}", stage="decode", prompt_tokens=100 + i, output_tokens=10 * i, age_s=1.5 * i)
            for i in range(3)]
PREVIEW = RebalancePreview(split="3:3", current="2:4", force=False, evacuation="move",
                           moves=[RoleChange(worker="decode-2", device="cpu:4", from_="decode", to="prefill",
                                             sessions=9)])
# what the fixture's operations end with, by kind (a test passes others)
RESULTS: dict[OpKind, OperationResult] = {
    OpKind.MIGRATE: LiveMigrateResult(worker="decode-0", from_="cpu:2", to="cpu:8", sessions=12, bytes=188_743_680,
                                      downtime_s=0.043, seconds=2.4,
                                      moves=[SessionMoved(request=f"req-{i:04d}", downtime_s=0.043 - i / 1000,
                                                          resumed_at=NOW) for i in range(12)]),
    OpKind.REBALANCE: RebalanceResult(split="3:3", from_="2:4", evacuation="move", seconds=6.2,
                                      moves=[RoleChanged(worker="decode-2", device="cpu:4", from_="decode",
                                                         to="prefill", sessions=9, new_worker="prefill-2",
                                                         sessions_finished=0, sessions_moved=9, seconds=6.1)]),
    OpKind.SWITCH: SwitchResult(worker="mixed-0", was="decode-1", from_="decode", to="mixed", pid=4104,
                                sessions_finished=0, sessions_moved=0, sessions_kept=7, switch_s=0.31,
                                out_of_service_s=0.35, seconds=0.35),
}
# the operation each route starts, and the position of the worker (or session) it acts on in the path
ROUTES = {"checkpoint": OpKind.CHECKPOINT, "migrate": OpKind.MIGRATE, "drain": OpKind.DRAIN,
          "resume": OpKind.RESUME, "stop": OpKind.STOP, "move": OpKind.MOVE, "switch": OpKind.SWITCH}


def _steps(kind: OpKind, result: OperationResult | None) -> list[str]:
    """The stages an operation of `kind` passes through before it is done (a migration's by its result's path;
    the stage a migration calls itself off in is left out)."""
    stages = STAGES[kind]
    if kind is OpKind.MIGRATE:
        stages = (LiveMigrateStage,) if isinstance(result, LiveMigrateResult) else (CheckpointMigrateStage,)
    return [s.value for s in stages[0] if s.value not in ("done", LiveMigrateStage.CALLING_OFF.value)]


def operation(kind: OpKind, worker: str, result: OperationResult | None, step: int | None = None,
              error: str | None = None) -> OperationInfo:
    """An operation as `/fleet/operations/{id}` reports it: at its `step`-th stage, or (None) ended: done with
    `result`, or failed with `error`."""
    steps = _steps(kind, result)
    if step is not None:
        state, at = OpState.RUNNING, steps[min(step, len(steps) - 1)]
    else:
        state, at = (OpState.DONE, "done") if error is None else (OpState.FAILED, steps[-1])
    return OperationInfo(id="op-1", kind=kind, worker=worker, device=None, state=state, step=at, stage=at,
                         progress=progress(kind, at) if state is OpState.RUNNING else 1.0, started=NOW,
                         result=result if state is OpState.DONE else None, error=error, writer_pid=None,
                         destination_pid=None)


class FixtureSource:
    url = "http://fixture:8700"

    def __init__(self, reachable: bool = True, hold_at: int | None = None,
                 results: Mapping[OpKind, OperationResult] | None = None, store: StoreInfo | None = None,
                 plan: FleetPlan = PLAN, tiers: bool = False) -> None:
        self.reachable = reachable
        self.tiers = tiers  # the fleet runs KV tiers under its pools (KV_TIERS, TIER_TOKENS)
        self.fleet_plan = plan  # what /fleet/plan answers
        self.more_pools: dict[str, PoolInfo] = {}  # pools a test adds while the console runs (a switch to mixed)
        self.store = store  # what /fleet/status says of the metrics store (None: the fleet keeps none)
        self.hold_at = hold_at  # an operation stays at this stage (a picture of the progress dialog)
        self.results = {**RESULTS, **(results or {})}
        self.posted: list[tuple[str, dict[str, object]]] = []
        self._polls = 0
        self._following: tuple[OpKind, str] = (OpKind.MIGRATE, "decode-0")

    async def read(self) -> FleetReading:
        if not self.reachable:
            return FleetReading(reachable=False, error=f"no fleet answers at {self.url} (ConnectError)")
        pools = {**POOLS, **self.more_pools}
        if self.tiers:
            pools = {role: pool.model_copy(update={"tier_tokens": TIER_TOKENS.get(role, {})})
                     for role, pool in pools.items()}
        status = STATUS.model_copy(update={"store": self.store, "pools": pools,
                                           "kv_tiers": KV_TIERS if self.tiers else {}})
        return FleetReading(reachable=True, status=status, history=HISTORY, host=HOST)

    async def start(self, path: str, body: dict[str, object]) -> OperationInfo:
        """The operation a route starts, at its first stage; refused (409) for one the fixture has no result of."""
        self.posted.append((path, body))
        parts = path.split("/")  # "", "fleet", "workers" | "requests", its id, the action
        if path == "/fleet/workers":
            kind, worker = OpKind.START, f"{body['role']}-9"
        elif path == "/fleet/restore":
            kind, worker = OpKind.RESTORE, "decode-4"
        elif path == "/fleet/rebalance":
            kind, worker = OpKind.REBALANCE, "fleet"
        else:
            kind, worker = ROUTES.get(parts[-1]), parts[3]
        if kind is None or kind not in self.results:
            raise FleetRefused("POST", path, 409, "refused by the fixture")
        return self.begin(kind, worker)

    def begin(self, kind: OpKind, worker: str) -> OperationInfo:
        """Follow an operation of `kind` on `worker` from its first stage (what `start` and a test use)."""
        self._following, self._polls = (kind, worker), 0
        return operation(kind, worker, self.results[kind], 0)

    async def operation(self, op_id: str) -> OperationInfo:
        self._polls = self._polls + 1 if self.hold_at is None else min(self._polls + 1, self.hold_at)
        kind, worker = self._following
        result = self.results[kind]
        return operation(kind, worker, result, self._polls if self._polls < len(_steps(kind, result)) else None)

    async def sessions(self, worker: str) -> WorkerSessions:
        return WorkerSessions(worker=worker, sessions=SESSIONS)

    async def requests(self, limit: int) -> RecentRequests:
        return REQUESTS

    async def logs(self, worker: str | None, since: int) -> FleetLogLines:
        lines = [line for line in LOG_LINES if line.seq > since and worker in (None, line.source)]
        return FleetLogLines(lines=lines, next=max([since, *(line.seq for line in lines)]))

    async def checkpoints(self) -> CheckpointList:
        raise FleetRefused("GET", "/fleet/checkpoints", 404, "not in the fixture")

    async def plan(self, since: str) -> FleetPlan:
        return self.fleet_plan

    async def rebalance_preview(self, split: str) -> RebalancePreview:
        self.posted.append(("/fleet/rebalance", {"split": split, "apply": False}))
        return PREVIEW.model_copy(update={"split": split})

    async def close(self) -> None:
        pass


async def pilot_until(pilot: Pilot, condition: Callable[[], object], what: str = "the state awaited",
                      timeout: float = 60.0) -> None:
    """Let the app run until `condition()` holds; fail saying `what` it never showed (a picture taken early
    would differ from the committed one only on a slow machine)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"the console never showed {what} within {timeout:.0f} s")
        await pilot.pause(0.05)


# the terminal sizes every new screen's picture is taken at, and their test ids
PICTURE_SIZES = [(120, 40), (80, 24), (200, 60)]
PICTURE_IDS = ["120x40", "80x24", "200x60"]


def footer_fitted(app: App) -> bool:
    """The footer shows only keys that fit whole (console/tui/widgets/footer.py does it once laid out)."""
    width = app.screen.region.right
    return all(key.region.right <= width for key in app.screen.query(FooterKey) if key.display)
