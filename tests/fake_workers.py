"""In-process stand-ins for worker processes: one thread per worker speaking the real protocol over a
real pipe, with scripted tokens and no torch. The controller runs against them unchanged (its
`Launcher` seam), so its routing, handoff and recovery can be tested in milliseconds.

A fake's tokens depend only on the request's prompt and the output position, as a deterministic
engine's would: a request recomputed elsewhere continues exactly where it stopped."""

import asyncio
import itertools
import multiprocessing as mp
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

from fleetctl.engine.core.sequence import FinishReason
from fleetctl.engine.fleet.config import FleetConfig
from fleetctl.engine.fleet.controller import Fleet
from fleetctl.engine.fleet.request import TrackedRequest
from fleetctl.engine.worker import protocol as m
from fleetctl.engine.worker.launcher import LaunchedWorker
from fleetctl.engine.worker.spec import WorkerSpec
from fleetctl.store.records import Phase, WorkerRole

NUM_BLOCKS = 64
_pids = itertools.count(90_000)


def token_at(prompt_token_ids: list[int], position: int) -> int:
    """The fake model's output token `position` for a prompt."""
    return 40 + (sum(prompt_token_ids) * 7 + position * 13) % 60


def expected_tokens(prompt_token_ids: list[int], max_tokens: int) -> list[int]:
    return [token_at(prompt_token_ids, i) for i in range(max_tokens)]


@dataclass
class _Session:
    msg: m.RunRequest | m.Adopt
    output: list[int]
    prefilled: bool = False


@dataclass
class FakeWorker:
    spec: WorkerSpec
    conn: Connection
    shm_dir: Path
    die_after_tokens: int | None = None  # exit (as if SIGKILLed) after emitting this many tokens
    load_s: float = 0.0  # how long "loading the model" takes
    fail_start: bool = False  # exit while loading, before WorkerReady
    received: list[object] = field(default_factory=list)
    published: dict[str, Path] = field(default_factory=dict)  # request id -> its KV buffer, until released
    pid: int = field(default_factory=lambda: next(_pids))
    killed: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        threading.Thread(target=self._run, daemon=True, name=f"fake-{self.spec.worker_id}").start()

    def _run(self) -> None:
        sessions: dict[str, _Session] = {}
        emitted = 0
        try:
            self.conn.send(m.WorkerLoading(self.spec.worker_id, self.pid))
            time.sleep(self.load_s)
            if self.fail_start:
                return
            self.conn.send(m.WorkerReady(self.spec.worker_id, self.pid, NUM_BLOCKS, 16, 0.0, "fake", 1e12, 1e11))
            while not self.killed.is_set():
                while self.conn.poll(0.002):
                    msg = self.conn.recv()
                    self.received.append(msg)
                    if isinstance(msg, m.Shutdown):  # like a real worker, it removes what it published
                        for path in self.published.values():
                            path.unlink(missing_ok=True)
                        return
                    self._handle(msg, sessions)
                for rid, session in list(sessions.items()):
                    if self.die_after_tokens is not None and emitted >= self.die_after_tokens:
                        return
                    if self._step(rid, session, sessions):
                        emitted += 1
        finally:
            self.conn.close()

    def _handle(self, msg: object, sessions: dict[str, _Session]) -> None:
        match msg:
            case m.RunRequest():
                sessions[msg.request_id] = _Session(msg, list(msg.output_token_ids))
            case m.Adopt():
                if not Path(msg.handle.location).exists():  # as the real transport: its producer removed it
                    self.conn.send(m.AdoptFailed(msg.request_id, "KV handoff unreadable", retryable=False))
                    return
                if len(sessions) >= NUM_BLOCKS:  # a session takes one block here
                    self.conn.send(m.AdoptFailed(msg.request_id, "out of KV blocks", retryable=True))
                    return
                nbytes = msg.handle.nbytes
                self.conn.send(m.Adopted(msg.request_id, nbytes, 0.001, NUM_BLOCKS - len(sessions) - 1))
                sessions[msg.request_id] = _Session(msg, list(msg.output_token_ids), prefilled=True)
            case m.ReleaseKV(request_id=rid) | m.Abort(request_id=rid):
                sessions.pop(rid, None)
                published = self.published.pop(rid, None)
                if published is not None:
                    published.unlink(missing_ok=True)
                self.conn.send(m.Capacity(self.spec.worker_id, NUM_BLOCKS - len(sessions)))

    def _step(self, rid: str, session: _Session, sessions: dict[str, _Session]) -> bool:
        """One engine step for one session; True when it produced a token."""
        if self.spec.role is WorkerRole.PREFILL and session.prefilled:
            return False  # parked: its KV waits for the handoff
        msg = session.msg
        token = token_at(msg.prompt_token_ids, len(session.output))
        session.output.append(token)
        finished = len(session.output) >= msg.params.max_tokens
        phase = Phase.DECODE if session.prefilled else Phase.PREFILL
        session.prefilled = True
        event = m.TokenEvent(rid, token, finished, FinishReason.LENGTH if finished else None)
        self.conn.send(m.StepReport(
            worker_id=self.spec.worker_id, phase=phase, tokens=[event], seq_tokens=[1], num_seqs=1, num_tokens=1,
            context_tokens=len(msg.prompt_token_ids) + len(session.output), seconds=0.001, flops=1, bytes=1,
            free_blocks=NUM_BLOCKS - len(sessions), running=len(sessions), waiting=0, ended_at=time.time(),
        ))
        if finished:
            del sessions[rid]
        elif self.spec.role is WorkerRole.PREFILL:
            path = self.shm_dir / f"{self.pid}-{rid}"
            path.write_bytes(b"kv")
            self.published[rid] = path
            handle = m.KVHandle(rid, m.HandleKind.SHM, (1,), "float32", 4, str(path))
            self.conn.send(m.Prefilled(rid, handle, 0.0))
        time.sleep(0.001)
        return True


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
    """Launcher whose workers are FakeWorker threads. Each worker id's next launch only (a worker started
    again, e.g. by a migration, behaves normally): `die_after` maps it to the tokens it emits before it
    dies, `load_s` to its model-load seconds, `fail_start` names ids whose process exits while loading."""

    def __init__(self, shm_dir: Path, die_after: dict[str, int] | None = None, load_s: dict[str, float] | None = None,
                 fail_start: set[str] | None = None) -> None:
        self.shm_dir = shm_dir
        self.die_after = dict(die_after or {})
        self.load_s = dict(load_s or {})
        self.fail_start = set(fail_start or ())
        self.workers: dict[str, FakeWorker] = {}

    def launch(self, spec: WorkerSpec) -> LaunchedWorker:
        parent, child = mp.Pipe(duplex=True)
        wid = spec.worker_id
        worker = FakeWorker(spec, child, self.shm_dir, self.die_after.pop(wid, None), self.load_s.pop(wid, 0.0),
                            wid in self.fail_start)
        self.fail_start.discard(wid)
        self.workers[spec.worker_id] = worker
        worker.start()
        return LaunchedWorker(spec, parent, _FakeProcess(worker))


def run_fleet(model_dir: Path, launcher: FakeLauncher, scenario: Callable[[Fleet, FakeLauncher], Awaitable[None]],
              timeout: float = 20.0, **config: object) -> None:
    """Run `scenario` against a started fleet of fakes (by default prefill-0, decode-0 and decode-1 on
    cpu:0..2; `config` overrides FleetConfig fields), then stop the fleet."""
    layout = {"prefill": 1, "decode": 2, "devices": ("cpu:0", "cpu:1", "cpu:2")} | config

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
