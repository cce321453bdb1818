"""A real worker loop (tiny model, in a thread, over a real pipe) under fault points keyed by request id:
one request that raises while it is added, stepped or published is dropped alone — the worker keeps serving
its batch-mates, token-identical to an undisturbed run — and the heartbeat falls silent while a step hangs.
An error that poisons the device (a sticky CUDA error) is no request's: the worker stops and says why.

Token identity relies on `deterministic` (batch invariance): the survivors of a failed batch are re-run
one at a time, a different batch composition than the undisturbed run's."""

import itertools
import multiprocessing as mp
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from fleetctl.domain import WorkerRole
from fleetctl.engine.core.engine_settings import DType, EngineSettings
from fleetctl.engine.core.sequence import SamplingParams
from fleetctl.engine.worker import protocol as m
from fleetctl.engine.worker.process import run_worker
from fleetctl.engine.worker.spec import WorkerSpec

PARAMS = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
PROMPTS = {"ok-a": [5, 6, 7, 8], "poison-b": [9, 10, 11], "ok-c": [12, 13, 14, 15, 16]}


@dataclass
class Running:
    conn: object
    thread: threading.Thread
    messages: list[object] = field(default_factory=list)
    went_on: list[bool] = field(default_factory=list)  # what run_worker returned, once it has

    def send(self, msg: object) -> None:
        self.conn.send(msg)

    def until(self, predicate, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, self.messages[-5:]
            if self.conn.poll(0.05):
                self.messages.append((time.monotonic(), self.conn.recv()))

    def of(self, kind: type) -> list:
        return [msg for _, msg in self.messages if isinstance(msg, kind)]

    def tokens(self, request_id: str) -> list[int]:
        return [t.token_id for r in self.of(m.StepReport) for t in r.tokens if t.request_id == request_id]

    def free_blocks(self) -> int | None:
        """As the worker last reported it."""
        reports = [msg for _, msg in self.messages if isinstance(msg, m.StepReport | m.Capacity)]
        return reports[-1].free_blocks if reports else None

    def finished(self, request_id: str) -> bool:
        return any(t.finished for r in self.of(m.StepReport) for t in r.tokens if t.request_id == request_id)


@pytest.fixture
def worker(tiny_model_dir: Path, tmp_path: Path) -> Iterator:
    started: list[Running] = []

    def start(role: WorkerRole = WorkerRole.MIXED, **spec: object) -> Running:
        parent, child = mp.Pipe(duplex=True)
        settings = EngineSettings(dtype=DType.FLOAT32, deterministic=True, num_kv_blocks=64)
        options = {"heartbeat_s": 0.05, "step_timeout_s": 60.0, "shm_dir": tmp_path} | spec
        worker_spec = WorkerSpec(f"{role.value}-0", role, "cpu:0", tiny_model_dir, settings, **options)
        went_on: list[bool] = []
        thread = threading.Thread(target=lambda: went_on.append(run_worker(worker_spec, child)), daemon=True)
        thread.start()
        running = Running(parent, thread, went_on=went_on)
        running.until(lambda: running.of(m.WorkerReady))
        started.append(running)
        return running

    yield start
    for running in started:
        running.send(m.Shutdown())
        running.thread.join(30)


def submit(running: Running, ids: list[str]) -> None:
    for rid in ids:
        running.send(m.RunRequest(rid, PROMPTS[rid], PARAMS, seed=1))


def undisturbed(worker) -> dict[str, list[int]]:
    running = worker()
    submit(running, ["ok-a", "ok-c"])
    running.until(lambda: running.finished("ok-a") and running.finished("ok-c"))
    return {rid: running.tokens(rid) for rid in ("ok-a", "ok-c")}


@pytest.mark.parametrize("point", ["step", "run-request"])
def test_a_request_that_raises_is_dropped_alone(worker, monkeypatch: pytest.MonkeyPatch, point: str) -> None:
    expected = undisturbed(worker)
    monkeypatch.setenv("FLEET_FAULTS", f"{point}@poison=raise")
    running = worker()
    submit(running, ["ok-a", "poison-b", "ok-c"])
    running.until(lambda: running.finished("ok-a") and running.finished("ok-c"))
    [failed] = running.of(m.RequestFailed)
    assert failed.request_id == "poison-b" and failed.retry and "fault injected at" in failed.message
    assert running.tokens("poison-b") == []
    assert {rid: running.tokens(rid) for rid in ("ok-a", "ok-c")} == expected
    running.until(lambda: running.free_blocks() == 64)  # nothing of the dropped request is kept
    assert running.thread.is_alive()
    submit(running, ["ok-a"])  # the worker still serves
    running.until(lambda: len(running.tokens("ok-a")) == 2 * PARAMS.max_tokens)


def test_a_prefill_worker_sends_each_first_token_with_the_kv_it_published(worker,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A prefill's end is one event: the first token of a sequence the worker parks carries its handoff. One
    whose publishing raises has its token sent without a handoff, and is dropped alone after that report."""
    monkeypatch.setenv("FLEET_FAULTS", "publish@poison=raise")
    running = worker(WorkerRole.PREFILL)
    submit(running, ["ok-a", "poison-b"])
    running.until(lambda: running.tokens("ok-a") and running.of(m.RequestFailed))
    events = {event.request_id: event for report in running.of(m.StepReport) for event in report.tokens}
    handoff = events["ok-a"].handoff
    assert handoff is not None and handoff.handle.first_block == 0 and handoff.publish_seconds > 0
    buffer = Path(handoff.handle.location)
    assert buffer.stat().st_size >= handoff.handle.nbytes > 0
    assert events["poison-b"].handoff is None and len(running.tokens("poison-b")) == 1
    order = [msg for _, msg in running.messages if isinstance(msg, m.StepReport | m.RequestFailed)]
    [failed] = running.of(m.RequestFailed)
    assert failed.request_id == "poison-b" and failed.retry and "fault injected at publish" in failed.message
    assert any(e.request_id == "poison-b" for r in order[:order.index(failed)] if isinstance(r, m.StepReport)
               for e in r.tokens)
    running.send(m.ReleaseKV("ok-a"))  # adopted elsewhere: the parked blocks and the buffer go
    running.until(lambda: running.free_blocks() == 64 and not buffer.exists())


@pytest.mark.slow  # over ~10 s (a step stalled 1.5 s at a time): `make test` runs it, `make test-fast` does not
def test_the_heartbeat_goes_silent_while_a_step_hangs(worker, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_FAULTS", "step@poison=stall:1.5")
    running = worker(step_timeout_s=0.3)
    running.until(lambda: len(running.of(m.Heartbeat)) >= 3)  # beating while idle
    submit(running, ["poison-b"])
    running.until(lambda: running.finished("poison-b"))
    beats = [at for at, msg in running.messages if isinstance(msg, m.Heartbeat)]
    assert max(b - a for a, b in itertools.pairwise(beats)) > 1.0  # silent while the step hung
    running.until(lambda: len([1 for at, msg in running.messages if isinstance(msg, m.Heartbeat)]) > len(beats))


@pytest.mark.parametrize("point", ["step", "run-request"])
def test_a_sticky_cuda_error_stops_the_worker(worker, monkeypatch: pytest.MonkeyPatch, point: str) -> None:
    monkeypatch.setenv("FLEET_FAULTS", f"{point}@poison=raise:CUDA error: an illegal memory access was encountered")
    running = worker()
    submit(running, ["ok-a", "poison-b", "ok-c"])
    running.until(lambda: running.of(m.WorkerFailed))
    [failed] = running.of(m.WorkerFailed)
    assert "CUDA error: an illegal memory access" in failed.reason
    running.thread.join(30)
    assert running.went_on == [False]  # worker_main exits non-zero: the supervisor restarts it
    assert running.of(m.RequestFailed) == []  # its requests are recovered as a crashed worker's, none failed here
