"""The fleet controller, `Fleet`: it assembles the fleet's parts — dispatch (prompts, endings), token
streams, handoff routing, recovery, the watchdog, stall watch and supervisor (hung, stalled, dead workers), operations
(`ops/`: checkpoint, restore, migrate, session moves, the pool changes start / drain / resume / stop,
rebalance) and the inbox that routes each worker message to one of them (`worker_inbox`) — starts and stops
the fleet, and admits requests and streams their tokens back. It is the one face the server sees: the routes
call its methods (those `facade.FleetFacade` declares), never its parts; each façade method is one line into the
part that does the work and answers in the wire contract's models (`engine.api`), plain values, or a request's
handle (`generation.Generation`). It holds no tensors and imports no torch; it runs on one asyncio loop, with a
reader and a writer thread per worker pipe."""

import asyncio
import dataclasses
import logging
import os
import time
from collections.abc import AsyncIterator

from fleetctl.domain import WorkerRole, WorkerState
from fleetctl.engine.api.checkpoints import CheckpointList
from fleetctl.engine.api.device_names import DeviceError
from fleetctl.engine.api.history import FleetHistory
from fleetctl.engine.api.operation_results import RebalancePreview
from fleetctl.engine.api.operations import OperationInfo
from fleetctl.engine.api.reports import DevicePeaks, FleetClassification, FleetPlan
from fleetctl.engine.api.requests import RecentRequests
from fleetctl.engine.api.status import FleetLogLines, FleetStatus, WorkerInfo, WorkerSessions
from fleetctl.engine.core.grammar import Grammars
from fleetctl.engine.core.sequence import SamplingParams
from fleetctl.engine.fleet.admission import Admission
from fleetctl.engine.fleet.dispatch import Dispatcher
from fleetctl.engine.fleet.errors import FleetStartFailed
from fleetctl.engine.fleet.fleet_config import FleetConfig, worker_specs
from fleetctl.engine.fleet.generation import Generation, stream_events
from fleetctl.engine.fleet.handoff import HandoffRouting
from fleetctl.engine.fleet.logs import FleetLogs, sweep_dead_log_folders
from fleetctl.engine.fleet.ops.autoplan import Autoplanner
from fleetctl.engine.fleet.ops.checkpoint import Checkpoints
from fleetctl.engine.fleet.ops.checkpoint_catalog import catalog
from fleetctl.engine.fleet.ops.lifecycle import WorkerLifecycle
from fleetctl.engine.fleet.ops.migrate import Migrations
from fleetctl.engine.fleet.ops.migrate_live import LiveMigration
from fleetctl.engine.fleet.ops.moves_in_flight import MovesInFlight
from fleetctl.engine.fleet.ops.rebalance import Rebalancer
from fleetctl.engine.fleet.ops.restore import Restores
from fleetctl.engine.fleet.ops.runner import OperationRunner
from fleetctl.engine.fleet.ops.session_move import SessionMoves
from fleetctl.engine.fleet.ops.split_regret import SplitRegret
from fleetctl.engine.fleet.ops.switch import RoleSwitches
from fleetctl.engine.fleet.recorder import FleetRecorder
from fleetctl.engine.fleet.recovery import Recovery
from fleetctl.engine.fleet.request import StreamEvent, TrackedRequest
from fleetctl.engine.fleet.served_model import ServedModel
from fleetctl.engine.fleet.shutdown_budget import WORKER_EXIT_S
from fleetctl.engine.fleet.stalls import StallWatch
from fleetctl.engine.fleet.state import FleetState
from fleetctl.engine.fleet.stats import FleetStats
from fleetctl.engine.fleet.status_view import Health, StatusView
from fleetctl.engine.fleet.store_reports import StoreReports
from fleetctl.engine.fleet.supervisor import Supervisor
from fleetctl.engine.fleet.tokens import TokenStreams
from fleetctl.engine.fleet.tracing import RequestTracer
from fleetctl.engine.fleet.watchdog import Watchdog
from fleetctl.engine.fleet.worker_inbox import WorkerInbox
from fleetctl.engine.fleet.worker_link import WorkerLink
from fleetctl.engine.fleet.worker_view import WorkerView
from fleetctl.engine.model.model_config import ModelConfig
from fleetctl.engine.model.tokenizer import Tokenizer
from fleetctl.engine.paths import fleet_home
from fleetctl.engine.worker import protocol as m
from fleetctl.engine.worker.launcher import Launcher, LocalLauncher
from fleetctl.engine.worker.shm_files import sweep, sweep_dead_fleets
from fleetctl.engine.worker.spec import WorkerSpec

log = logging.getLogger("fleetctl.stats")
STATS_LOG_S = 10.0


class Fleet(ServedModel):
    def __init__(self, config: FleetConfig, launcher: Launcher | None = None) -> None:
        self.config = config
        self.model_config = ModelConfig.from_file(config.model_dir / "config.json")
        self.tokenizer = Tokenizer(config.model_dir, self.model_config.eos_token_ids)
        self.grammars = Grammars(self.tokenizer, self.model_config.vocab_size)  # checks requests' grammars
        # an exact pool (--kv-blocks) caps every worker's sequences at what it holds: admission says so first
        self.max_model_len = config.engine.context_limit(self.model_config.max_context)
        self.model_name = config.served_model_name or config.model_dir.name
        self.url = ""
        specs = {s.worker_id: s for s in worker_specs(config)}
        self.state = FleetState(
            config=config, specs=specs, views={wid: WorkerView(wid, s.role, s.device) for wid, s in specs.items()},
            stats=FleetStats(config.kept_requests),
            recorder=FleetRecorder(config.store_path) if config.store_path else None,
            # workers on this machine write their output to files the controller reads (a Ray actor's stays there)
            logs=FleetLogs(fleet_home() / "logs" / f"fleet-{os.getpid()}" if launcher is None else None),
            tracer=RequestTracer(config.otlp_endpoint) if config.otlp_endpoint else None,
        )
        self.dispatcher = Dispatcher(self.state)
        self.admission = Admission(self.state, self.dispatcher, self.tokenizer, self.model_config.vocab_size,
                                   self.max_model_len)
        self.handoffs = HandoffRouting(self.state, self.dispatcher)
        self.tokens = TokenStreams(self.state, self.dispatcher, self.handoffs)
        self.recovery = Recovery(self.state, self.dispatcher, self.handoffs)
        self.operations = OperationRunner(self.state, self, MovesInFlight())
        self.moves = SessionMoves(self.operations, self.dispatcher.recompute)
        self.checkpoints = Checkpoints(self.operations)
        self.restores = Restores(self.operations, self.checkpoints)
        self.migrations = Migrations(self.operations, self.checkpoints, self.restores,
                                     LiveMigration(self.operations, self.moves))
        self.lifecycle = WorkerLifecycle(self.operations, self.moves)
        self.switches = RoleSwitches(self.operations, self.lifecycle)
        self.rebalancer = Rebalancer(self.operations, self.lifecycle, self.switches)
        self.supervisor = Supervisor(self.operations, self.dispatcher.fail_stranded)
        self.watchdog = Watchdog(self.state.views, self.state.links, config.supervision.heartbeat_timeout_s)
        self.stalls = StallWatch(self.state.views, self.state.record_event, self.operations.busy_with)
        self.inbox = WorkerInbox(
            self.state, tokens=self.tokens, handoffs=self.handoffs, recovery=self.recovery,
            operations=self.operations, restores=self.restores, moves=self.moves, checkpoints=self.checkpoints,
            supervisor=self.supervisor, watchdog=self.watchdog, routing_changed=self.routing_changed)
        self._launcher = launcher or LocalLauncher()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task] = []
        self._stopped: asyncio.Task | None = None  # Fleet.stop under way or done: a second call waits on it
        self._log_handler = self.state.logs.handler()  # the controller's own records, while it runs
        store, every = config.store_path, config.split_regret_interval_s
        self.split_regret = SplitRegret(self.state, store, every) if store is not None and every > 0 else None
        self.status_view = StatusView(self.state, self.dispatcher, self.split_regret)
        self.reports = StoreReports(self.state, self.rebalancer, self.split_regret)

    @property
    def views(self) -> dict[str, WorkerView]:
        return self.state.views

    @property
    def stats(self) -> FleetStats:
        return self.state.stats

    # ---- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Launch every configured worker and wait for all to be ready: the fleet starts whole or raises
        FleetStartFailed, so the server never listens with a configured worker missing."""
        self._loop = asyncio.get_running_loop()
        started = time.monotonic()
        fleet_log = logging.getLogger("fleetctl")
        fleet_log.addHandler(self._log_handler)
        if fleet_log.getEffectiveLevel() > logging.INFO:  # an embedded fleet (no logging set up): its lines still
            fleet_log.setLevel(logging.INFO)  # reach the logs view; only warnings reach stderr (logging's last resort)
        if swept := sweep_dead_fleets(self.config.shm_dir):
            log.info("removed %d KV handoff buffer(s) left by fleets that were killed", swept)
        if self.state.logs.folder is not None:
            sweep_dead_log_folders(self.state.logs.folder.parent)
        for spec in self.state.specs.values():
            try:
                self.check_device(spec.device)
            except DeviceError as exc:
                raise FleetStartFailed(f"{spec.worker_id}: {exc}") from None
        for wid, spec in self.state.specs.items():
            link = self.launch(spec)
            self.state.links[wid] = link
            self.views[wid].pid, self.views[wid].node = link.pid, link.launched.node
        deadline = time.monotonic() + self.config.ready_timeout_s
        while any(v.state is WorkerState.STARTING for v in self.views.values()):
            if time.monotonic() > deadline:
                raise FleetStartFailed("workers did not become ready in time")
            await asyncio.sleep(0.05)
        dead = [f"{v.worker_id} ({v.last_error or 'exited'})" for v in self.views.values()
                if v.state is WorkerState.FAILED]
        if dead:
            await self.stop()
            raise FleetStartFailed(f"workers failed to start: {'; '.join(dead)}")
        log.info("%d workers ready in %.1f s: %s", len(self.views), time.monotonic() - started,
                 ", ".join(f"{v.worker_id} on {v.device}" for v in self.views.values()))
        self._tasks = [asyncio.create_task(self._tick()), asyncio.create_task(self.watchdog.run())]
        if self.config.autoplan:
            autoplan = Autoplanner(self.state, self.rebalancer, self.config.autoplan)
            self._tasks.append(asyncio.create_task(autoplan.run()))
        if self.split_regret is not None:
            self._tasks.append(asyncio.create_task(self.split_regret.run()))

    async def _tick(self) -> None:
        """Once a second: the store's rows, stalled workers, requests left without a worker (a catch-all: each
        change of a worker's state checks too); every STATS_LOG_S a line on the log."""
        logged_at = time.monotonic()
        while True:
            await asyncio.sleep(1.0)
            self.state.logs.poll()
            self.dispatcher.fail_stranded()
            self.stalls.check()
            if self.state.recorder:
                self.state.recorder.tick()
            if time.monotonic() - logged_at >= STATS_LOG_S:
                log.info("%s", self.stats.summary(self.state.all_views()))
                logged_at = time.monotonic()

    async def drain(self, grace_s: float) -> None:
        """Shutting down: admit nothing new (503), let the requests in flight finish for up to `grace_s`
        seconds, then end the rest with one clear error."""
        self.state.closing = True
        deadline = time.monotonic() + grace_s
        while self.state.requests and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for req in list(self.state.requests.values()):
            self.dispatcher.abandon(req, f"the fleet shut down before this request finished ({grace_s:g} s grace)")

    async def stop(self, worker_exit_s: float = WORKER_EXIT_S) -> None:
        """Shut every worker down (one that has not exited `worker_exit_s` after being asked is killed) and fail
        what is still in flight; workers exiting now are stopped, not failed (nothing restarts them), and the
        store's rows say so. Once: a later call waits for the first one's end."""
        if self._stopped is None:
            self._stopped = asyncio.create_task(self._stop(worker_exit_s))
        await asyncio.shield(self._stopped)

    async def _stop(self, worker_exit_s: float) -> None:
        self.state.stopping = True
        for task in self._tasks:
            task.cancel()
        self.supervisor.stop()
        self.checkpoints.stop()
        links = list(self.state.links.values())
        for link in links:
            link.send(m.Shutdown())
        await asyncio.gather(*(asyncio.to_thread(link.join, worker_exit_s) for link in links))
        await asyncio.sleep(0.1)  # let the reader threads' exit notices run
        for req in list(self.state.requests.values()):
            self.dispatcher.fail(req, "the fleet is shutting down")
        sweep(self.config.shm_dir, lambda buffer: buffer.fleet_pid == os.getpid())  # whatever a killed worker left
        self.state.logs.poll()
        self.state.logs.remove_files()
        logging.getLogger("fleetctl").removeHandler(self._log_handler)
        if self.state.tracer:
            await asyncio.to_thread(self.state.tracer.close)  # the last traces out (the exporter may wait on a socket)
        recorder = self.state.recorder
        if recorder:
            for view in self.views.values():
                if view.state in (WorkerState.RUNNING, WorkerState.DRAINING):
                    view.state = WorkerState.STOPPED
                    recorder.worker_stopped(view, WorkerState.STOPPED)
            recorder.close()

    @property
    def in_flight(self) -> int:
        """Requests accepted and not yet ended."""
        return len(self.state.requests)

    # ---- operations: each validated at once (raises OperationRefused), then run (poll `operation`) ----

    def operation(self, op_id: str) -> OperationInfo:
        return self.operations.get(op_id).info()

    def start_worker(self, role: str, device: str) -> OperationInfo:
        return self.lifecycle.start(role, device).info()

    def drain_worker(self, worker_id: str, move: bool = False) -> OperationInfo:
        return self.lifecycle.drain(worker_id, move).info()

    def resume_worker(self, worker_id: str) -> OperationInfo:
        return self.lifecycle.resume(worker_id).info()

    def stop_worker(self, worker_id: str, force: bool = False) -> OperationInfo:
        return self.lifecycle.stop(worker_id, force).info()

    def switch_worker(self, worker_id: str, role: str) -> OperationInfo:
        return self.switches.switch(worker_id, role).info()

    def checkpoint(self, worker_id: str, hold_s: float | None = None) -> OperationInfo:
        return self.checkpoints.checkpoint(worker_id, hold_s).info()

    def migrate(self, worker_id: str, to: str, via_checkpoint: bool = False) -> OperationInfo:
        return self.migrations.migrate(worker_id, to, via_checkpoint).info()

    async def restore(self, checkpoint: str, device: str, force: bool = False) -> OperationInfo:
        return (await self.restores.restore(checkpoint, device, force)).info()

    def move_session(self, request_id: str, to: str) -> OperationInfo:
        return self.moves.move(request_id, to).info()

    def rebalance_preview(self, split: str, force: bool = False, via: str | None = None) -> RebalancePreview:
        return self.rebalancer.preview(split, force, via)

    def rebalance(self, split: str, force: bool = False, via: str | None = None) -> OperationInfo:
        return self.rebalancer.start(split, force, via).info()

    # ---- what it reports (the wire contract's models) ------------------------------------------

    def status(self) -> FleetStatus:
        return self.status_view.status(self.model_name, self.url)

    def workers(self) -> list[WorkerInfo]:
        return self.status_view.workers()

    def sessions(self, worker_id: str) -> WorkerSessions:
        return self.status_view.sessions(worker_id)

    def recent_requests(self, limit: int) -> RecentRequests:
        return self.status_view.recent_requests(limit)

    def health(self) -> Health:
        return self.status_view.health()

    def metrics(self) -> bytes:
        return self.stats.exposition(self.state.all_views())

    def log_lines(self, source: str | None, since: int, limit: int) -> FleetLogLines:
        return self.status_view.log_lines(source, since, limit)

    async def checkpoint_catalog(self) -> CheckpointList:
        """Every checkpoint on disk, each verified (hashed: in a thread)."""
        return CheckpointList.model_validate({"checkpoints": await asyncio.to_thread(catalog)})

    async def history(self, since_s: float, bucket_s: float) -> FleetHistory:
        return await self.reports.history(since_s, bucket_s)

    async def classify(self, since: str) -> FleetClassification:
        return await self.reports.classify(since)

    async def device_peaks(self) -> DevicePeaks:
        return await self.reports.device_peaks()

    async def plan(self, since: str, slo: tuple[str, str], devices: str | None, elastic: bool) -> FleetPlan:
        return await self.reports.plan(since, slo, devices, elastic)

    # ---- what operations ask of the controller (runner.WorkerHost) ----------------------------

    def check_device(self, device: str) -> None:
        self._launcher.check_device(device)

    def launch(self, spec: WorkerSpec) -> WorkerLink:
        assert self._loop is not None, "the fleet is not started"
        path = self.state.logs.path_for(spec.worker_id)
        if path is not None:
            spec = dataclasses.replace(spec, log_path=path)
            self.state.logs.follow(spec.worker_id, path)
        return WorkerLink(self._launcher.launch(spec), self._loop, self.inbox.on_link_message,
                          self.inbox.on_link_exit)

    def take_over(self, wid: str, link: WorkerLink, ready: m.WorkerReady) -> None:
        self.state.take_over(wid, link)
        self.inbox.deliver(wid, ready)

    def routing_changed(self) -> None:
        self.handoffs.dispatch()
        self.dispatcher.dispatch_queued()
        self.dispatcher.fail_stranded()

    def recompute_held(self, wid: str, kv_kept: bool = True) -> None:
        self.recovery.recompute_held(wid, kv_kept)

    # ---- requests ----------------------------------------------------------------------------

    def generate(self, prompt_token_ids: list[int], params: SamplingParams, request_ids: list[str],
                 session: str = "") -> list[Generation]:
        """Admit one request per id ("" for a generated one), each followed through its handle: independent
        samples of one prompt (parallel sampling, `n`), all admitted or none (`Admission.admit`). A `session` (an
        agent's) has its KV retained on the workers for `--session-ttl`."""
        admitted = self.admission.admit(prompt_token_ids, params, request_ids, session)
        return [Generation(req, self.dispatcher.cancel) for req in admitted]

    def submit(self, prompt_token_ids: list[int], params: SamplingParams, request_id: str = "",
               session: str = "") -> TrackedRequest:
        """Admit one request, as the controller follows it (where it runs, its KV, its times); read its events
        with `stream`."""
        return self.admission.admit(prompt_token_ids, params, [request_id], session)[0]

    @staticmethod
    def stream(req: TrackedRequest) -> AsyncIterator[StreamEvent]:
        return stream_events(req)

    def cancel(self, req: TrackedRequest) -> None:
        """The client went away: stop the work wherever it is (a no-op for a request that ended)."""
        self.dispatcher.cancel(req)

    def queue_full(self, arriving: int) -> int | None:
        """How many requests wait when `arriving` more would pass `--max-queue` (the refusal counts as any 429);
        None while they fit. For a refusal before a request is read."""
        return self.admission.refuse_early(arriving)

    def queue_length(self, role: WorkerRole) -> int:
        return self.dispatcher.queue_length(role)
