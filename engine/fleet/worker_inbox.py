"""Where each message from a worker process goes, and what its exit sets off. One table, so that "who handles
a StepReport?" has one answer: the worker's view (free blocks, prefix digests), live numbers and the store,
token streams, handoff routing, recovery, the watchdog's clock, and the operations waiting on the worker
(restores, session moves, checkpoints). Messages from a process that is not (yet) its worker id's current one
— a standby an operation started — go to the operation runner. Nothing here decides anything: it routes, on
the event loop, what the pipe readers hand it."""

import os
from collections.abc import Callable

from fleetctl.domain import WorkerState
from fleetctl.engine.fleet.handoff import HandoffRouting
from fleetctl.engine.fleet.ops.checkpoint import Checkpoints
from fleetctl.engine.fleet.ops.restore import Restores
from fleetctl.engine.fleet.ops.runner import Awaited, OperationRunner
from fleetctl.engine.fleet.ops.session_move import SessionMoves
from fleetctl.engine.fleet.recovery import Recovery
from fleetctl.engine.fleet.state import FleetState
from fleetctl.engine.fleet.supervisor import Supervisor
from fleetctl.engine.fleet.tokens import TokenStreams
from fleetctl.engine.fleet.watchdog import Watchdog
from fleetctl.engine.fleet.worker_link import WorkerLink
from fleetctl.engine.worker import move_messages as mv
from fleetctl.engine.worker import protocol as m
from fleetctl.engine.worker.shm_files import sweep


class WorkerInbox:
    def __init__(self, state: FleetState, *, tokens: TokenStreams, handoffs: HandoffRouting, recovery: Recovery,
                 operations: OperationRunner, restores: Restores, moves: SessionMoves, checkpoints: Checkpoints,
                 supervisor: Supervisor, watchdog: Watchdog, routing_changed: Callable[[], None]) -> None:
        self.state = state
        self.tokens = tokens
        self.handoffs = handoffs
        self.recovery = recovery
        self.operations = operations
        self.restores = restores
        self.moves = moves
        self.checkpoints = checkpoints
        self.supervisor = supervisor
        self.watchdog = watchdog
        self._routing_changed = routing_changed  # a worker came, went or freed room: route what waits

    def on_link_message(self, link: WorkerLink, msg: object) -> None:
        """A message read from `link`'s pipe."""
        if self.state.links.get(link.worker_id) is link:
            self.watchdog.heard(link.worker_id)
            self.deliver(link.worker_id, msg)
        elif isinstance(msg, m.Restored | m.RestoreFailed):
            self.restores.on_restore_message(link, msg)
        else:
            self.operations.on_foreign_message(link, msg)

    def on_link_exit(self, link: WorkerLink) -> None:
        """`link`'s process exited (on purpose or not): what waited on it is told, and a worker that died has
        its sessions recomputed and its restart scheduled."""
        wid = link.worker_id
        self.state.logs.poll()  # its last words, before anything acts on its exit
        if self.state.links.get(wid) is not link:
            self.operations.on_foreign_exit(link)
            return
        view = self.state.views[wid]
        if link.exit_cause is not None:  # its placement's word (Ray: the actor died, or its node was lost)
            view.last_error, view.node_lost = view.last_error or link.exit_cause.reason, link.exit_cause.node_lost
        self.operations.resolve(wid, Awaited.CHECKPOINT, m.CheckpointFailed("the worker exited"))
        self.operations.resolve(wid, Awaited.SWITCHED, m.SwitchFailed("the worker exited"))
        self.moves.on_worker_exit(wid)  # before recovery: a session past its final stage goes on at its destination
        if self.recovery.on_worker_exit(wid):
            self.supervisor.on_failure(wid)  # first: requests for its role may wait for the restart
            self.recovery.recompute_held(wid, failed=True)
            self._sweep_buffers_of(view.pid)
        self._routing_changed()

    def _sweep_buffers_of(self, pid: int | None) -> None:
        """A dead worker's KV buffers that no request will read (published, but never announced)."""
        wanted = {req.handle.location for req in self.state.requests.values() if req.handle is not None}
        wanted |= self.operations.moves.buffers()
        sweep(self.state.config.shm_dir, lambda buffer: buffer.fleet_pid == os.getpid() and buffer.producer_pid == pid
              and str(buffer.path) not in wanted)

    def deliver(self, wid: str, msg: object) -> None:
        """A message from the current process of `wid`, to the part that handles it."""
        view = self.state.views[wid]
        recorder = self.state.recorder
        match msg:
            case m.Heartbeat():
                pass  # heard (the watchdog's clock), nothing else
            case m.WorkerReady():
                view.state, view.pid, view.last_error, view.load_s = WorkerState.RUNNING, msg.pid, "", msg.load_seconds
                view.kv.started(msg.num_kv_blocks, msg.block_size)
                view.prefix.clear()  # a new process: its cache starts empty, its changes start with a reset
                view.device_name, view.peak_flops, view.peak_bytes_per_s, view.weights, view.kv_dtype = (
                    msg.device_name, msg.peak_flops, msg.peak_bytes_per_s, msg.weights, msg.kv_dtype)
                self.watchdog.heard(wid)
                view.began_stepping()
                if recorder:
                    recorder.worker_started(view)
                self._routing_changed()  # a new decode worker takes pending handoffs too
            case m.StepReport():
                view.running, view.waiting = msg.running, msg.waiting
                view.stepped(msg.seconds)
                view.kv.reported(msg.free_blocks)
                if msg.prefix is not None:
                    view.prefix.apply(msg.prefix)
                self.state.stats.on_step(view, msg)
                if recorder:
                    recorder.on_step(view, msg)
                if msg.tokens:
                    self.restores.on_progress(wid)
                    self.moves.on_step(wid, msg)
                self.tokens.on_step(wid, msg)
                self.handoffs.dispatch()
            case m.Republished():
                self.restores.on_progress(wid)  # a restored prefill worker re-publishes, without tokens
                self.handoffs.on_republished(wid, msg)
            case m.Adopted():
                self.handoffs.on_adopted(wid, msg)
            case m.AdoptFailed():
                self.handoffs.on_adopt_failed(wid, msg)
            case m.RequestFailed():
                view.kv.settled(msg.request_id)  # an adoption that raised there took no block (Capacity follows)
                self.recovery.on_request_failed(wid, msg)
            case m.Capacity():
                view.kv.reported(msg.free_blocks)
                self._routing_changed()
            case m.WorkerFailed():
                view.last_error = msg.reason
            case mv.BlocksReserved() | mv.BlocksSent() | mv.BlocksReceived() | mv.MoveRefused():
                self.moves.on_message(wid, msg)
            case m.CheckpointStarted() | m.CheckpointDone() | m.CheckpointFailed():
                self.checkpoints.on_worker_message(wid, msg)
            case m.RoleSwitched() | m.SwitchFailed():
                self.operations.resolve(wid, Awaited.SWITCHED, msg)
