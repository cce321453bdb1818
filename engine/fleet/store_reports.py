"""What the fleet's metrics store says, for clients on another machine: its history (series, traffic, events),
its traffic by phase (`classify`), the device peaks it holds beside the workers on those devices (`devices`),
and the planner's recommendation for this fleet (`plan`) — each as the JSON the CLI command prints when it reads
the store file itself. Each read runs in a thread over a connection of its own (a replay and a classification
are CPU work). A fleet that keeps no store has none of them: NotFound, saying what it therefore lacks."""

import asyncio
import time
from pathlib import Path

from fleetctl.domain import WorkerState
from fleetctl.engine.api.history import FleetHistory
from fleetctl.engine.api.reports import DevicePeak, DevicePeaks, DeviceWorker, FleetClassification, FleetPlan
from fleetctl.engine.fleet.ops.rebalance import Rebalancer
from fleetctl.engine.fleet.ops.split_regret import REGRET_WINDOW_S, SplitRegret
from fleetctl.engine.fleet.state import FleetState
from fleetctl.engine.planner.durations import parse_window
from fleetctl.engine.planner.plan import PlanRequest, plan_from_store
from fleetctl.engine.planner.simulator import EngineLimits
from fleetctl.engine.planner.slo import Slo
from fleetctl.errors import NotFound, UserError
from fleetctl.store.classify import classify
from fleetctl.store.db import read_store
from fleetctl.store.device_peak_cache import all_devices, peak_report
from fleetctl.store.history import history
from fleetctl.store.plan_inputs import LiveWorker


class StoreReports:
    def __init__(self, state: FleetState, rebalancer: Rebalancer, split_regret: SplitRegret | None) -> None:
        self.state = state
        self.rebalancer = rebalancer
        self.split_regret = split_regret

    def store(self, missing: str) -> Path:
        """The fleet's metrics store; NotFound saying it keeps none, so it has `missing`."""
        path = self.state.config.store_path
        if path is None:
            raise NotFound(f"this fleet keeps no metrics store, so it has {missing}")
        return path

    async def history(self, since_s: float, bucket_s: float) -> FleetHistory:
        """The last `since_s` seconds in buckets of `bucket_s` (`store.history`)."""
        path = self.store("no history")
        if bucket_s > since_s:
            raise UserError(f"bucket ({bucket_s:g} s) must not be longer than since ({since_s:g} s)")
        return FleetHistory.model_validate(
            await asyncio.to_thread(read_store, path, lambda db: history(db, since_s, bucket_s)))

    async def classify(self, since: str) -> FleetClassification:
        """Model time by phase over the last `since` (a window as `--since` takes it), overall and by length."""
        path = self.store("no traffic to classify")
        window_s = parse_window(since)
        classified = await asyncio.to_thread(read_store, path, lambda db: classify(db, window_s))
        return FleetClassification.model_validate(classified.as_json())

    async def device_peaks(self) -> DevicePeaks:
        """The peaks the store holds per device identity and dtype (calibrated or from the spec table), and the
        workers on the devices with the weight format each serves."""
        records = await asyncio.to_thread(read_store, self.store("no device peaks"), all_devices)
        views = sorted(self.state.views.values(), key=lambda v: v.worker_id)
        workers = [DeviceWorker(id=v.worker_id, role=v.role.value, device=v.device, device_name=v.device_name,
                                weights=v.weights, kv_dtype=v.kv_dtype, kv_tokens=v.kv.num_blocks * v.kv.block_size)
                   for v in views]
        peaks = [DevicePeak.model_validate(peak_report(record)) for record in records]
        return DevicePeaks(devices=peaks, not_recalibrated=[], workers=workers)

    async def plan(self, since: str, slo: tuple[str, str], devices: str | None, elastic: bool) -> FleetPlan:
        """The plan over the last `since` for this fleet's live workers (or `devices`, as `--devices` takes them;
        `slo`: TTFT and TPOT as written); elastic (layouts on any number of the devices) when asked, or over the
        free devices of its pool too when it has some and no `devices` are given."""
        path = self.store("nothing to plan from")
        config = self.state.config
        workers = [LiveWorker(v.worker_id, v.role, v.device) for v in self.state.views.values()
                   if v.state in (WorkerState.RUNNING, WorkerState.DRAINING)]
        pool = None if devices else self.rebalancer.elastic_devices(
            config.autoplan.max_workers if config.autoplan else None)
        request = PlanRequest(Slo.parse(*slo), ",".join(pool) if pool else devices,
                              limits=EngineLimits(config.engine.max_num_seqs, config.engine.max_num_batched_tokens),
                              elastic=elastic or pool is not None)
        window_s = parse_window(since)
        shared = self._regret_replay(window_s, request)
        if shared is not None:
            return shared
        result = await asyncio.to_thread(plan_from_store, path, window_s, request, workers)
        return FleetPlan.model_validate(result.as_json())

    def _regret_replay(self, window_s: float, request: PlanRequest) -> FleetPlan | None:
        """The split regret's newest replay when it answers this very question (its window, SLOs and limits, no
        devices asked): the pool panels' answer, word for word, rather than a second replay a moment later."""
        regret = self.split_regret
        fresh = regret.fresh_plan() if regret is not None else None
        if fresh is None or window_s != REGRET_WINDOW_S or request != regret.request:
            return None
        at, plan = fresh
        answer = FleetPlan.model_validate(plan.as_json())
        clock = time.strftime("%H:%M:%S", time.gmtime(at))
        answer.notes.append(f"the split regret's replay of {clock} UTC (every {regret.interval_s:g} s): the answer "
                            f"the pool panels show")
        return answer
