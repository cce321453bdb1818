"""A deterministic fleet for console tests: a FleetSource with fixed status, history, host and
events (no wall clock in the picture), whose operations advance one stage per poll."""

import math

from fleetctl.console.client import FleetRefused
from fleetctl.console.tui.snapshot import FleetSnapshot

NOW = 1_764_400_000.0  # a fixed "now": event times and chart buckets derive from it


def _worker(wid: str, role: str, device: str, pid: int, state: str = "running", sessions: int = 0,
            kv: float = 0.0, busy: float = 0.0, mfu: float = 0.0, mbu: float = 0.0) -> dict:
    return {"id": wid, "role": role, "device": device, "state": state, "pid": pid, "sessions": sessions,
            "kv_usage": kv, "busy": busy, "mfu": mfu, "mbu": mbu}


WORKERS = [
    _worker("prefill-0", "prefill", "cpu:0", 4101, sessions=2, kv=0.05, busy=0.42, mfu=0.31, mbu=0.02),
    _worker("prefill-1", "prefill", "cpu:1", 4102, sessions=1, kv=0.02, busy=0.35, mfu=0.27, mbu=0.01),
    _worker("decode-0", "decode", "cpu:2", 4103, sessions=12, kv=0.61, busy=0.97, mfu=0.18, mbu=0.16),
    _worker("decode-1", "decode", "cpu:3", 4104, sessions=11, kv=0.58, busy=0.95, mfu=0.17, mbu=0.15),
    _worker("decode-2", "decode", "cpu:4", 4105, sessions=9, kv=0.44, busy=0.9, mfu=0.15, mbu=0.13),
    _worker("decode-3", "decode", "cpu:5", 4106, state="draining", sessions=3, kv=0.12, busy=0.4, mfu=0.05,
            mbu=0.06),
    _worker("decode-4", "decode", "cpu:6", 4107, state="checkpointed"),
    _worker("decode-5", "decode", "cpu:7", 4108, state="failed"),
]
POOLS = {"prefill": {"workers": 2, "busy": 0.385, "mfu": 0.29, "mbu": 0.015, "queue": 0},
         "decode": {"workers": 4, "busy": 0.805, "mfu": 0.1375, "mbu": 0.125, "queue": 0}}


def _series(level: float, swing: float, phase: float) -> list[dict]:
    points = []
    for i in range(60):
        value = max(0.0, min(1.0, level + swing * math.sin(i / 6 + phase)))
        points.append({"ts": NOW - 300 + 5 * i, "busy": value, "mfu": value * 0.7, "mbu": value * 0.3,
                       "tokens_per_s": 100 * value})
    return points


HISTORY = {
    "now": NOW, "window_s": 300.0, "bucket_s": 5.0,
    "pools": {"prefill": _series(0.4, 0.3, 0.0), "decode": _series(0.8, 0.15, 1.0)},
    "workers": {w["id"]: _series(w["busy"], 0.1, i) for i, w in enumerate(WORKERS)},
    "traffic": {"requests": 412, "requests_per_s": 1.37, "ttft_s": {"p50": 0.412, "p99": 2.31},
                "tpot_s": {"p50": 0.061, "p99": 0.118}, "prefill_share": 0.22, "decode_share": 0.78,
                "handoff_bytes_per_s": 3.4e6, "handoff_share_of_e2e": 0.0031},
    "events": [
        {"ts": NOW - 240, "kind": "start", "worker": "decode-5", "details": {"device": "cpu:7"}},
        {"ts": NOW - 200, "kind": "failure", "worker": "decode-5", "details": {"requests": 3}},
        {"ts": NOW - 120, "kind": "migrate", "worker": "decode-1",
         "details": {"from": "cpu:8", "to": "cpu:3", "mode": "restored"}},
        {"ts": NOW - 60, "kind": "restore", "worker": "decode-4",
         "details": {"device": "cpu:6", "mode": "cold-start", "reason": "torch: checkpoint has '2.12'"}},
    ],
}
for _w in WORKERS:  # the live rate in /fleet/status: what the charts' newest bucket shows
    _w["tokens_per_s"] = HISTORY["workers"][_w["id"]][-1]["tokens_per_s"]
HOST = {"host": "lab-node", "gpus": [], "processes": {4101: 41.0, 4102: 35.0, 4103: 97.0, 4104: 95.0, 4105: 90.0,
                                                      4106: 40.0, 4107: None, 4108: None}}
MIGRATE_STAGES = ("starting destination", "pausing source", "restoring", "first step")


def _layout(prefill: int, decode: int, goodput: float, good: int, ttft: float, tpot: float | None) -> dict:
    return {"prefill": prefill, "decode": decode, "mixed": 0, "layout": f"{prefill}:{decode}", "goodput": goodput,
            "ttft_p90_s": ttft, "tpot_p90_s": tpot, "good_requests": good, "requests": 412, "e2e_mean_s": 3.1}


PLAN = {  # /fleet/plan's shape (engine/planner/plan.py), for the fixture's 2:4 fleet
    "recommended": {"prefill": 3, "decode": 3, "mixed": 0, "layout": "3:3"},
    "current": {"prefill": 2, "decode": 4, "mixed": 0, "layout": "2:4"},
    "candidates": [_layout(3, 3, 1.284, 385, 0.912, 0.081), _layout(2, 4, 1.087, 326, 2.43, 0.064),
                   _layout(4, 2, 0.958, 287, 0.51, 0.212), _layout(1, 5, 0.402, 120, 9.7, 0.058)],
    "reason": "3:3 serves 385 of 412 requests within the SLOs against 326 at 2:4: a third prompt worker "
              "brings the TTFT p90 from 2.43 s to 0.91 s while the TPOT p90 stays at 81 ms",
    "best_split": {"prefill": 3, "decode": 3, "mixed": 0, "layout": "3:3"}, "gain_pct": 18.1,
    "window_s": 600.0, "source": "store", "requests": 412, "slo": {"ttft_s": 2.0, "tpot_s": 0.2},
    "devices": [f"cpu:{i}" for i in range(6)], "what_if": None, "fit": {}, "notes": [],
}


class FixtureSource:
    url = "http://fixture:8700"

    def __init__(self, reachable: bool = True, hold_at: int | None = None) -> None:
        self.reachable = reachable
        self.hold_at = hold_at  # an operation stays at this stage (a picture of the progress dialog)
        self.posted: list[tuple[str, dict]] = []
        self._polls = 0

    async def snapshot(self) -> FleetSnapshot:
        if not self.reachable:
            return FleetSnapshot(reachable=False, error=f"no fleet answers at {self.url} (ConnectError)")
        status = {"model": "smollm2-135m", "url": self.url, "workers": WORKERS, "pools": POOLS}
        return FleetSnapshot(reachable=True, status=status, history=HISTORY, host=HOST)

    async def post(self, path: str, body: dict) -> dict:
        self.posted.append((path, body))
        if path.endswith("/migrate"):
            return self._operation("migrate", path.split("/")[3], 0, body["to"])
        if path == "/fleet/rebalance" and body["apply"]:
            return {"id": "op-2", "kind": "rebalance", "worker": "fleet", "state": "done", "stage": "done",
                    "error": None, "result": {"split": body["split"], "moves": 1}}
        if path == "/fleet/rebalance":
            return {"split": body["split"], "current": "2:4", "force": False, "evacuation": "move",
                    "moves": [{"worker": "decode-2", "device": "cpu:4", "from": "decode", "to": "prefill",
                               "sessions": 9}]}
        raise FleetRefused("POST", path, 409, "refused by the fixture")

    async def get(self, path: str) -> dict:
        if path.startswith("/fleet/operations/"):
            self._polls = self._polls + 1 if self.hold_at is None else min(self._polls + 1, self.hold_at)
            return self._operation("migrate", "decode-0", self._polls, "cpu:9")
        if path.startswith("/fleet/plan?"):
            return PLAN
        if path.endswith("/sessions"):
            return {"sessions": [{"id": f"req-{i:04d}", "stage": "decode", "prompt_tokens": 100 + i,
                                  "output_tokens": 10 * i, "age_s": 1.5 * i} for i in range(3)]}
        raise FleetRefused("GET", path, 404, "not in the fixture")

    def _operation(self, kind: str, worker: str, polls: int, to: str) -> dict:
        if polls < len(MIGRATE_STAGES):
            return {"id": "op-1", "kind": kind, "worker": worker, "state": "running",
                    "stage": MIGRATE_STAGES[polls], "result": {"to": to}, "error": None}
        return {"id": "op-1", "kind": kind, "worker": worker, "state": "done", "stage": "done", "error": None,
                "result": {"worker": worker, "from": "cpu:2", "to": to, "mode": "restored", "reason": None,
                           "sessions": 12, "bytes": 188_743_680, "downtime_s": 0.043}}

    async def close(self) -> None:
        pass
