"""The fleet controller: starts workers, routes each request through prefill → KV handoff → decode,
streams tokens to clients, and recomputes a dead worker's sequences on a survivor. It holds no
tensors; it runs on one asyncio loop, with a reader and a writer thread per worker pipe."""

import asyncio
import dataclasses
import time
import uuid
from collections import deque

from fleetctl.engine import messages as m
from fleetctl.engine.fleet_config import FleetConfig, worker_specs
from fleetctl.engine.fleet_handoff import HandoffRouting
from fleetctl.engine.fleet_recorder import FleetRecorder
from fleetctl.engine.fleet_recovery import FleetRecovery
from fleetctl.engine.fleet_stats import FleetStats
from fleetctl.engine.launcher import Launcher, LocalLauncher
from fleetctl.engine.llm_engine import check_prompt
from fleetctl.engine.model.config import ModelConfig
from fleetctl.engine.model.tokenizer import Tokenizer
from fleetctl.engine.operations import FleetOperations
from fleetctl.engine.output import TextStream
from fleetctl.engine.router import Router, WorkerState, WorkerView
from fleetctl.engine.sequence import SamplingParams
from fleetctl.engine.tracked_request import Phase, StreamEvent, TrackedRequest
from fleetctl.engine.transport import KVTransport
from fleetctl.engine.worker import WorkerSpec
from fleetctl.engine.worker_link import WorkerLink
from fleetctl.store.records import EventKind, WorkerRole


class FleetBusy(RuntimeError):
    """The controller's queue is full (HTTP 429)."""


class NoWorkers(RuntimeError):
    """No live worker is left for a role the request needs (HTTP 503)."""


class Fleet(HandoffRouting, FleetRecovery):
    def __init__(self, config: FleetConfig, launcher: Launcher | None = None) -> None:
        self.config = config
        self.model_config = ModelConfig.from_file(config.model_dir / "config.json")
        self.tokenizer = Tokenizer(config.model_dir, self.model_config.eos_token_ids)
        self.max_model_len = self.model_config.max_position_embeddings
        self.model_name = config.model_dir.name
        self.url = ""
        self.router = Router()
        self.stats = FleetStats()
        self._launcher = launcher or LocalLauncher()
        self._specs = {s.worker_id: s for s in worker_specs(config)}
        self.views = {wid: WorkerView(wid, s.role, s.device) for wid, s in self._specs.items()}
        self.links: dict[str, WorkerLink] = {}  # the current process of each worker id
        self.requests: dict[str, TrackedRequest] = {}
        self._queued: deque[TrackedRequest] = deque()
        self._pending_handoffs: deque[TrackedRequest] = deque()
        self._transport = KVTransport()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self.recorder = FleetRecorder(config.store_path) if config.store_path else None
        self._ticker: asyncio.Task | None = None
        self.operations = FleetOperations(self)

    # ---- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        for wid, spec in self._specs.items():
            self._spawn(wid, spec)
        deadline = time.monotonic() + self.config.ready_timeout_s
        while not all(v.state is not WorkerState.STARTING for v in self.views.values()):
            if time.monotonic() > deadline:
                raise RuntimeError("workers did not become ready in time")
            await asyncio.sleep(0.05)
        dead = [v.worker_id for v in self.views.values() if v.state is WorkerState.FAILED]
        if dead:
            await self.stop()
            raise RuntimeError(f"workers failed to start: {', '.join(dead)}")
        if self.recorder:
            self._ticker = asyncio.create_task(self._tick())

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            self.recorder.tick()

    def launch(self, spec: WorkerSpec) -> WorkerLink:
        """Start a worker process; its messages arrive at _on_link_message on this loop."""
        assert self._loop is not None
        return WorkerLink(self._launcher.launch(spec), self._loop, self._on_link_message, self._on_link_exit)

    def spec(self, wid: str) -> WorkerSpec:
        return self._specs[wid]

    def default_spec(self, wid: str, role: WorkerRole) -> WorkerSpec:
        """A spec for a worker this fleet did not start (restoring another fleet's checkpoint)."""
        return dataclasses.replace(next(iter(self._specs.values())), worker_id=wid, role=role)

    def adopt_link(self, wid: str, link: WorkerLink, spec: WorkerSpec, ready: m.WorkerReady) -> None:
        """Make `link` the process of `wid` (a restore, or the destination of a migration)."""
        self.links[wid], self._specs[wid] = link, spec
        view = self.views.get(wid)
        if view is None:
            view = self.views[wid] = WorkerView(wid, spec.role, spec.device)
        view.device = spec.device
        self._on_message(wid, ready)

    def record_event(self, kind: EventKind, wid: str, details: dict) -> None:
        if self.recorder:
            self.recorder.event(kind, wid, details)

    def operations_changed(self) -> None:
        """A worker's state changed outside a message: route what was waiting."""
        self._dispatch_handoffs()
        self._dispatch_queued()

    def _spawn(self, wid: str, spec: WorkerSpec) -> None:
        link = self.launch(spec)
        self.links[wid] = link
        self.views[wid].pid = link.pid

    async def stop(self) -> None:
        self._stopping = True
        for link in self.links.values():
            link.send(m.Shutdown())
        for link in self.links.values():
            await asyncio.to_thread(link.join, 10.0)
        await asyncio.sleep(0.1)  # let the reader threads' exit notices run
        for req in list(self.requests.values()):
            self._fail(req, "the fleet is shutting down")
        if self._ticker:
            self._ticker.cancel()
        if self.recorder:
            for view in self.views.values():
                if view.state is WorkerState.RUNNING:
                    view.state = WorkerState.STOPPED
                    self.recorder.worker_stopped(view, WorkerState.STOPPED)
            self.recorder.close()

    def kill_worker(self, worker_id: str) -> None:
        """Test and operator hook: SIGKILL a worker (it is then handled as a failure)."""
        self.links[worker_id].kill()

    def _send(self, wid: str, msg: object) -> None:
        self.links[wid].send(msg)

    # ---- requests ----------------------------------------------------------------------------

    def submit(self, prompt_token_ids: list[int], params: SamplingParams, request_id: str = "") -> TrackedRequest:
        """Admit a request (raises PromptError, NoWorkers, FleetBusy); read its events with `stream`."""
        check_prompt(prompt_token_ids, self.model_config.vocab_size, self.max_model_len)
        for role in self.needed_roles():
            if not self.has_role(role):
                raise NoWorkers(f"no {role.value} worker is available")
        if len(self._queued) >= self.config.max_queue:
            raise FleetBusy(f"{len(self._queued)} requests are already queued")
        request_id = request_id or f"req-{uuid.uuid4().hex[:16]}"
        eos = frozenset() if params.ignore_eos else self.tokenizer.eos_token_ids
        req = TrackedRequest(
            request_id=request_id, prompt_token_ids=list(prompt_token_ids), params=params,
            seed=params.request_seed(), stream=TextStream(self.tokenizer, params.stop, eos),
        )
        self.requests[request_id] = req
        self._queued.append(req)
        self._dispatch_queued()
        return req

    async def stream(self, req: TrackedRequest):
        while True:
            event = await req.events.get()
            yield event
            if event.final:
                return

    def cancel(self, req: TrackedRequest) -> None:
        """The client went away: stop the work wherever it is."""
        if not req.done:
            self._release_everywhere(req)
            self._finish(req, "abort")

    def needed_roles(self) -> tuple[WorkerRole, ...]:
        return (WorkerRole.MIXED,) if self.config.colocated else (WorkerRole.PREFILL, WorkerRole.DECODE)

    def has_role(self, role: WorkerRole) -> bool:
        return Router.has_role(list(self.views.values()), role)

    def queue_length(self, role: WorkerRole) -> int:
        """Requests waiting for a worker of `role` in the controller (prompts, or handoffs for decode)."""
        if role is WorkerRole.DECODE:
            return sum(1 for r in self._pending_handoffs if not r.done)
        return sum(1 for r in self._queued if not r.done)

    def _prompt_role(self) -> WorkerRole:
        return WorkerRole.MIXED if self.config.colocated else WorkerRole.PREFILL

    def _dispatch_queued(self) -> None:
        while self._queued:
            req = self._queued[0]
            if req.done:
                self._queued.popleft()
                continue
            view = self.router.pick_prompt_worker(list(self.views.values()), self._prompt_role())
            if view is None:
                return
            self._queued.popleft()
            self._run_on(req, view)

    def _run_on(self, req: TrackedRequest, view: WorkerView) -> None:
        req.phase = Phase.PREFILL
        req.prompt_worker = view.worker_id
        req.times.dispatched = req.times.dispatched or time.time()
        view.requests.add(req.request_id)
        self._send(view.worker_id, m.RunRequest(req.request_id, req.prompt_token_ids, req.params, req.seed,
                                                list(req.output_token_ids)))

    # ---- messages from workers (event loop) -------------------------------------------------

    def _on_link_message(self, link: WorkerLink, msg: object) -> None:
        if self.links.get(link.worker_id) is link:
            self._on_message(link.worker_id, msg)
        else:
            self.operations.on_foreign_message(link, msg)

    def _on_link_exit(self, link: WorkerLink) -> None:
        if self.links.get(link.worker_id) is link:
            self._on_worker_exit(link.worker_id)
        else:
            self.operations.on_foreign_exit(link)

    def _on_message(self, wid: str, msg: object) -> None:
        view = self.views[wid]
        match msg:
            case m.WorkerReady():
                view.state, view.pid = WorkerState.RUNNING, msg.pid
                view.num_kv_blocks, view.block_size = msg.num_kv_blocks, msg.block_size
                view.free_blocks = msg.num_kv_blocks
                view.device_name, view.peak_flops, view.peak_bytes_per_s = (
                    msg.device_name, msg.peak_flops, msg.peak_bytes_per_s)
                if self.recorder:
                    self.recorder.worker_started(view)
                self._dispatch_queued()
            case m.StepReport():
                view.free_blocks, view.running, view.waiting = msg.free_blocks, msg.running, msg.waiting
                self.stats.on_step(view, msg)
                if self.recorder:
                    self.recorder.on_step(view, msg)
                if msg.tokens:
                    self.operations.on_tokens(wid)
                self._attribute_model_time(msg)
                for event in msg.tokens:
                    self._on_token(wid, event)
                self._dispatch_handoffs()
            case m.Prefilled():
                self._on_prefilled(wid, msg)
            case m.Adopted():
                self._on_adopted(wid, msg)
            case m.AdoptFailed():
                self._on_adopt_failed(wid, msg)
            case m.RequestFailed():
                req = self.requests.get(msg.request_id)
                view.requests.discard(msg.request_id)
                if req:
                    self._fail(req, msg.message)
            case m.Capacity():
                view.free_blocks = msg.free_blocks
                self._dispatch_handoffs()
                self._dispatch_queued()
            case m.CheckpointStarted() | m.CheckpointDone() | m.CheckpointFailed():
                self.operations.on_worker_message(wid, msg)

    def _attribute_model_time(self, report: m.StepReport) -> None:
        """Split the step's seconds among its sequences by their tokens in it (for `classify`)."""
        total = sum(report.seq_tokens) or 1
        for event, tokens in zip(report.tokens, report.seq_tokens, strict=True):
            req = self.requests.get(event.request_id)
            if req is None:
                continue
            share = report.seconds * tokens / total
            if report.phase == "prefill":
                req.prefill_model_s += share
            else:
                req.decode_model_s += share

    def _on_token(self, wid: str, event: m.TokenEvent) -> None:
        req = self.requests.get(event.request_id)
        if req is None or req.done or req.holder() != wid:
            if not event.finished:  # a session continued elsewhere (or cancelled): stop this copy
                self._send(wid, m.Abort(event.request_id))
            return
        req.output_token_ids.append(event.token_id)
        req.times.first_token = req.times.first_token or time.time()
        delta = req.stream.push(event.token_id)
        if req.stream.stopped:
            self._release_everywhere(req)
            self._finish(req, "stop", StreamEvent(event.token_id, delta, finish_reason="stop"))
        elif event.finished:
            self.views[wid].requests.discard(req.request_id)
            reason = event.finish_reason or "stop"
            self._finish(req, reason, StreamEvent(event.token_id, delta + req.stream.flush(), finish_reason=reason))
        else:
            if req.phase is Phase.PREFILL and self.views[wid].role is WorkerRole.PREFILL:
                req.phase = Phase.HANDOFF
            req.events.put_nowait(StreamEvent(token_id=event.token_id, text=delta))

    # ---- endings ---------------------------------------------------------------------------------

    def _finish(self, req: TrackedRequest, reason: str, last: StreamEvent | None = None) -> None:
        req.phase, req.finish_reason = Phase.DONE, reason
        req.times.finished = time.time()
        if req.handle is not None:
            self._release_prefill_copy(req)
        req.events.put_nowait(last or StreamEvent(finish_reason=reason))
        self._retire(req)

    def _fail(self, req: TrackedRequest, message: str) -> None:
        if req.done:
            return
        req.phase, req.error = Phase.DONE, message
        req.times.finished = time.time()
        req.events.put_nowait(StreamEvent(error=message))
        self._retire(req)

    def _retire(self, req: TrackedRequest) -> None:
        self.requests.pop(req.request_id, None)
        self.stats.on_request_done(req)
        if self.recorder:
            self.recorder.on_request_done(req)
        self._dispatch_queued()
