"""Stalled workers (engine/fleet/stalls.py): silent past STALL_STEPS times the recent step time (or the floor)
while holding work is a stall, with one event when it begins and one when it ends; idle workers, workers an
operation pauses on purpose and workers that are not running are never stalled."""

from fleetctl.domain import EventKind, WorkerRole, WorkerState
from fleetctl.engine.api.operations import OpKind
from fleetctl.engine.fleet.ops.record import Operation
from fleetctl.engine.fleet.stalls import STALL_FLOOR_S, STALL_STEPS, StallWatch, stall_bound
from fleetctl.engine.fleet.worker_view import WorkerView

NOW = 1000.0


def decoding(wid: str = "decode-0", step_s: float = 0.5, silent_s: float = 0.0) -> WorkerView:
    view = WorkerView(wid, WorkerRole.DECODE, "cpu:1", state=WorkerState.RUNNING, running=2, requests={"a", "b"})
    view.recent_step_s, view.last_step_at = step_s, NOW - silent_s
    return view


def watch(*views: WorkerView, operations: dict[str, Operation] | None = None
          ) -> tuple[StallWatch, list[tuple[EventKind, str, dict]]]:
    events: list[tuple[EventKind, str, dict]] = []
    table = {view.worker_id: view for view in views}
    return StallWatch(table, lambda *event: events.append(event), (operations or {}).get), events


def test_the_bound_is_ten_steps_or_the_floor() -> None:
    assert stall_bound(decoding(step_s=0.5)) == STALL_STEPS * 0.5 == 5.0
    assert stall_bound(decoding(step_s=0.01)) == STALL_FLOOR_S


def test_a_worker_silent_past_its_bound_while_holding_work_is_stalled_until_it_steps() -> None:
    view = decoding(step_s=0.5, silent_s=4.9)
    stalls, events = watch(view)
    assert stalls.check(NOW) == [] and view.stalled_s() is None
    assert stalls.check(NOW + 0.2) == ["decode-0"]
    assert stalls.check(NOW + 1.0) == ["decode-0"]  # one event for one stall
    assert events == [(EventKind.STALL, "decode-0", {"stalled": True, "silent_s": 5.1, "bound_s": 5.0,
                                                     "sessions": 2})]
    assert view.stalled_s() is not None and view.stalled_since == NOW - 4.9
    view.stepped(0.5)  # SIGCONT: it steps again
    view.last_step_at = NOW + 3.1
    assert stalls.check(NOW + 3.2) == [] and view.stalled_s() is None
    assert events[1] == (EventKind.STALL, "decode-0", {"stalled": False, "lasted_s": 8.0, "ended": "it steps again"})


def test_a_stall_ends_when_the_worker_fails() -> None:
    view = decoding(silent_s=30.0)
    stalls, events = watch(view)
    assert stalls.check(NOW) == ["decode-0"]
    view.state = WorkerState.FAILED  # the watchdog killed it
    assert stalls.check(NOW + 1) == []
    assert events[-1][2] == {"stalled": False, "lasted_s": 31.0, "ended": "it is failed and holds 2 session(s)"}


def test_idle_paused_and_stopped_workers_are_not_stalled() -> None:
    idle = decoding("decode-1", silent_s=60.0)
    idle.running, idle.requests = 0, set()
    parked = decoding("prefill-0", silent_s=60.0)  # a prefill worker whose prompts wait for their handoffs
    parked.running = 0
    prompts = decoding("prefill-1", silent_s=60.0)
    prompts.running, prompts.prefilling = 0, {"a": 500}  # a prompt routed to it that it has not computed
    checkpointing = decoding("decode-2", silent_s=60.0)
    starting = decoding("decode-3", silent_s=60.0)
    starting.state = WorkerState.STARTING
    operations = {"decode-2": Operation(OpKind.CHECKPOINT, "decode-2")}
    stalls, events = watch(idle, parked, prompts, checkpointing, starting, operations=operations)
    assert stalls.check(NOW) == ["prefill-1"]
    operations["decode-2"] = Operation(OpKind.DRAIN, "decode-2")  # a drain does not hold its steps
    assert stalls.check(NOW) == ["prefill-1", "decode-2"]
    assert [worker for _, worker, _ in events] == ["prefill-1", "decode-2"]
