"""In-process stand-ins for worker processes: one thread per worker speaking the real protocol over a
real pipe, with scripted tokens and no torch. The controller runs against them unchanged (its
`Launcher` seam), so its routing, handoff, recovery and supervision can be tested in milliseconds.

A fake's tokens depend only on the request's prompt and the output position, as a deterministic
engine's would: a request recomputed elsewhere continues exactly where it stopped. Like a real worker it
sends heartbeats from a thread (silent once it hangs), names its KV buffers after the fleet and itself
(shm_files), checkpoints and restores (fake_checkpoints.py) and moves sessions live (fake_moves.py)."""

import asyncio
import dataclasses
import itertools
import multiprocessing as mp
import os
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

from fleetctl.domain import Phase, WorkerRole
from fleetctl.engine.core.sequence import FinishReason
from fleetctl.engine.fleet.controller import Fleet
from fleetctl.engine.fleet.fleet_config import FleetConfig
from fleetctl.engine.fleet.request import TrackedRequest
from fleetctl.engine.worker import move_messages as mv
from fleetctl.engine.worker import protocol as m
from fleetctl.engine.worker.launcher import LaunchedWorker, LocalLauncher
from fleetctl.engine.worker.shm_files import buffer_path
from fleetctl.engine.worker.spec import WorkerSpec
from support.fake_checkpoints import FakeCheckpoints, Session
from support.fake_moves import FakeMoves

NUM_BLOCKS = 64
_pids = itertools.count(90_000)


def token_at(prompt_token_ids: list[int], position: int) -> int:
    """The fake model's output token `position` for a prompt."""
    return 40 + (sum(prompt_token_ids) * 7 + position * 13) % 60


def expected_tokens(prompt_token_ids: list[int], max_tokens: int) -> list[int]:
    return [token_at(prompt_token_ids, i) for i in range(max_tokens)]


@dataclass
class Faults:
    """What a launcher's fakes do wrong. The per-worker ones apply to that id's next launch only (a worker
    started again, by a migration or a restart, behaves); the request-keyed ones to every fake, for a
    request whose id contains a key."""

    die_after: dict[str, int] = field(default_factory=dict)  # exit (as if SIGKILLed) after this many tokens
    hang_after: dict[str, int] = field(default_factory=dict)  # hang (no heartbeat, no work) after this many
    load_s: dict[str, float] = field(default_factory=dict)  # how long "loading the model" takes
    fail_start: set[str] = field(default_factory=set)  # exit while loading, before WorkerReady
    checkpoint_s: dict[str, float] = field(default_factory=dict)  # how long its checkpoint writer runs
    fail_restore: set[str] = field(default_factory=set)  # refuse a Restore
    raise_on: set[str] = field(default_factory=set)  # stepping such a request raises (dropped, RequestFailed)
    crash_on: set[str] = field(default_factory=set)  # stepping such a request kills the worker
    crash_before_publish: set[str] = field(default_factory=set)  # once each: die with its first token made, unsent
    crash_on_adopt: set[str] = field(default_factory=set)  # once each: die adopting it
    refuse_moves: bool = False  # every fake answers every live move with MoveRefused
    fail_switch: set[str] = field(default_factory=set)  # answer a SwitchRole with SwitchFailed

    def once(self, keys: set[str], rid: str) -> bool:
        """Whether `rid` matches one of `keys`, which then fires no more."""
        key = next((k for k in list(keys) if k in rid), None)
        if key is not None:
            keys.discard(key)
        return key is not None


@dataclass
class FakeWorker:
    spec: WorkerSpec
    conn: Connection
    shm_dir: Path
    faults: Faults
    die_after_tokens: int | None = None
    hang_after_tokens: int | None = None
    load_s: float = 0.0
    fail_start: bool = False
    received: list[object] = field(default_factory=list)
    published: dict[str, Path] = field(default_factory=dict)  # request id -> its KV buffer, until released
    sessions: dict[str, Session] = field(default_factory=dict)
    pid: int = field(default_factory=lambda: next(_pids))
    killed: threading.Event = field(default_factory=threading.Event)
    hung: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    moves: FakeMoves = field(init=False)

    def __post_init__(self) -> None:
        self.moves = FakeMoves(self)

    def start(self) -> None:
        threading.Thread(target=self._run, daemon=True, name=f"fake-{self.spec.worker_id}").start()

    def send(self, msg: object) -> None:
        with self._lock:
            self.conn.send(msg)

    def _run(self) -> None:
        emitted = 0
        try:
            self.send(m.WorkerLoading(self.spec.worker_id, self.pid))
            time.sleep(self.load_s)
            if self.fail_start:
                return
            self.send(m.WorkerReady(self.spec.worker_id, self.pid, NUM_BLOCKS, 16, 0.0, "fake", 1e12, 1e11,
                                     weights="float32", kv_dtype="float32"))
            threading.Thread(target=self._beat, daemon=True).start()
            checkpoints = FakeCheckpoints(self)
            while not self.killed.is_set():
                while self.conn.poll(0.002):
                    msg = self.conn.recv()
                    self.received.append(msg)
                    if isinstance(msg, m.Shutdown):  # like a real worker, it removes what it published
                        self.remove_published()
                        self.moves.release_all()
                        return
                    if not self._handle(msg, checkpoints):
                        return
                for rid, session in list(self.sessions.items()):
                    if self.die_after_tokens is not None and emitted >= self.die_after_tokens:
                        return
                    if self.hang_after_tokens is not None and emitted >= self.hang_after_tokens:
                        self.hung.set()
                        self.killed.wait()
                        return
                    outcome = self._step(rid, session)
                    if outcome is None:
                        return
                    emitted += outcome
        finally:
            self.conn.close()

    def _beat(self) -> None:
        while not self.killed.wait(self.spec.heartbeat_s) and not self.conn.closed:
            if not self.hung.is_set():
                try:
                    self.send(m.Heartbeat(self.spec.worker_id))
                except (OSError, ValueError):
                    return

    def remove_published(self) -> None:
        for path in self.published.values():
            path.unlink(missing_ok=True)
        self.published.clear()

    def _handle(self, msg: object, checkpoints: FakeCheckpoints) -> bool:
        """False when the worker exits (stood down after a checkpoint, or a fault)."""
        match msg:
            case m.RunRequest():
                self.sessions[msg.request_id] = Session(msg, list(msg.output_token_ids))
            case m.Adopt():
                if self.faults.once(self.faults.crash_on_adopt, msg.request_id):
                    return False
                if not Path(msg.handle.location).exists():  # as the real transport: its producer removed it
                    self.send(m.AdoptFailed(msg.request_id, "KV handoff unreadable", retryable=False))
                elif len(self.sessions) >= NUM_BLOCKS:  # a session takes one block here
                    self.send(m.AdoptFailed(msg.request_id, "out of KV blocks", retryable=True))
                else:
                    self.sessions[msg.request_id] = Session(msg, list(msg.output_token_ids), prefilled=True)
                    self.send(m.Adopted(msg.request_id, msg.handle.nbytes, 0.001, self.free_blocks))
            case m.ReleaseKV(request_id=rid) | m.Abort(request_id=rid):
                self._forget(rid)
                self.send(m.Capacity(self.spec.worker_id, self.free_blocks))
            case m.TakeCheckpoint() | m.Restore() | m.Resume():
                return checkpoints.handle(msg)
            case mv.ReserveBlocks() | mv.SendBlocks() | mv.ReceiveBlocks() | mv.EndMove():
                self.moves.handle(msg)
            case m.SwitchRole():  # as the real worker: the same "process" under its new id, empty unless both
                # roles decode (its sessions then go on)
                if self.spec.worker_id in self.faults.fail_switch:
                    self.send(m.SwitchFailed("InjectedFault: fault injected at switch"))
                elif self.sessions and WorkerRole.PREFILL in (self.spec.role, msg.role):
                    self.send(m.SwitchFailed(f"EngineBusy: the engine holds {len(self.sessions)} sequence(s)"))
                else:
                    self.spec = dataclasses.replace(self.spec, role=msg.role, worker_id=msg.worker_id)
                    self.send(m.RoleSwitched(msg.worker_id, msg.role, 0.001))
        return True

    @property
    def free_blocks(self) -> int:
        return NUM_BLOCKS - len(self.sessions) - self.moves.blocks_held

    def _forget(self, rid: str) -> None:
        self.sessions.pop(rid, None)
        published = self.published.pop(rid, None)
        if published is not None:
            published.unlink(missing_ok=True)

    def publish(self, rid: str) -> m.Handoff:
        """Publish a parked session's KV to shared memory, as a real prefill worker does."""
        path = buffer_path(self.shm_dir, os.getpid(), self.pid, rid)
        path.write_bytes(b"kv")
        self.published[rid] = path
        return m.Handoff(m.KVHandle(rid, m.HandleKind.SHM, (1,), "float32", 4, str(path)), 0.0)

    def _step(self, rid: str, session: Session) -> int | None:
        """One engine step for one session: 1 when it produced a token, 0 when not, None when the worker dies."""
        if self.spec.role is WorkerRole.PREFILL and session.prefilled:
            return 0  # parked: its KV waits for the handoff
        if any(key in rid for key in self.faults.crash_on):
            return None
        if any(key in rid for key in self.faults.raise_on):
            self._forget(rid)
            self.send(m.RequestFailed(rid, "InjectedFault: fault injected at step", retry=True))
            self.send(m.Capacity(self.spec.worker_id, self.free_blocks))
            return 0
        msg = session.msg
        token = token_at(msg.prompt_token_ids, len(session.output))
        session.output.append(token)
        finished = len(session.output) >= msg.params.max_tokens
        phase = Phase.DECODE if session.prefilled else Phase.PREFILL
        session.prefilled = True
        handoff = None
        if not finished and self.spec.role is WorkerRole.PREFILL:  # parked: its first token comes with its KV
            if self.faults.once(self.faults.crash_before_publish, rid):
                return None
            handoff = self.publish(rid)
        event = m.TokenEvent(rid, token, finished, FinishReason.LENGTH if finished else None, handoff=handoff)
        if finished:
            del self.sessions[rid]
        self.send(m.StepReport(
            worker_id=self.spec.worker_id, phase=phase, tokens=[event], seq_tokens=[1], num_seqs=1, num_tokens=1,
            context_tokens=len(msg.prompt_token_ids) + len(session.output), seconds=0.001, flops=1, bytes=1,
            free_blocks=self.free_blocks, running=len(self.sessions), waiting=0, ended_at=time.time(),
        ))
        time.sleep(0.001)
        return 1


class _FakeProcess:
    def __init__(self, worker: FakeWorker) -> None:
        self._worker = worker

    @property
    def pid(self) -> int:
        return self._worker.pid

    def is_alive(self) -> bool:
        return not self._worker.conn.closed

    def kill(self) -> None:
        self._worker.killed.set()

    def join(self, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (timeout or 0)
        while self.is_alive() and time.monotonic() < deadline:
            time.sleep(0.005)


class FakeLauncher:
    """Launcher whose workers are FakeWorker threads, misbehaving as `faults` (or the keyword shortcuts
    die_after, load_s, fail_start) say."""

    def __init__(self, shm_dir: Path, die_after: dict[str, int] | None = None, load_s: dict[str, float] | None = None,
                 fail_start: set[str] | None = None, faults: Faults | None = None) -> None:
        self.shm_dir = shm_dir
        self.faults = faults or Faults()
        self.faults.die_after |= die_after or {}
        self.faults.load_s |= load_s or {}
        self.faults.fail_start |= fail_start or set()
        self.workers: dict[str, FakeWorker] = {}

    check_device = staticmethod(LocalLauncher.check_device)

    def launch(self, spec: WorkerSpec) -> LaunchedWorker:
        assert spec.shm_dir == self.shm_dir, f"the fleet would sweep {spec.shm_dir}, not the fakes' {self.shm_dir}"
        parent, child = mp.Pipe(duplex=True)
        wid, faults = spec.worker_id, self.faults
        worker = FakeWorker(spec, child, self.shm_dir, faults, faults.die_after.pop(wid, None),
                            faults.hang_after.pop(wid, None), faults.load_s.pop(wid, 0.0), wid in faults.fail_start)
        faults.fail_start.discard(wid)
        self.workers[spec.worker_id] = worker
        worker.start()
        return LaunchedWorker(spec, parent, _FakeProcess(worker))


def run_fleet(model_dir: Path, launcher: FakeLauncher, scenario: Callable[[Fleet, FakeLauncher], Awaitable[None]],
              timeout: float = 20.0, **config: object) -> None:
    """Run `scenario` against a started fleet of fakes (by default prefill-0, decode-0 and decode-1 on
    cpu:0..2; `config` overrides FleetConfig fields), then stop the fleet."""
    layout = {"prefill": 1, "decode": 2, "devices": ("cpu:0", "cpu:1", "cpu:2"), "shm_dir": launcher.shm_dir} | config

    async def main() -> None:
        fleet = Fleet(FleetConfig(model_dir, **layout), launcher=launcher)
        await fleet.start()
        try:
            await asyncio.wait_for(scenario(fleet, launcher), timeout)
        finally:
            await fleet.stop()

    asyncio.run(main())


async def tokens_of(fleet: Fleet, req: TrackedRequest) -> list[int]:
    """The request's tokens as its client receives them; fails on an error event."""
    events = [event async for event in fleet.stream(req)]
    assert events[-1].error is None, events[-1].error
    return [e.token_id for e in events if e.token_id is not None]
