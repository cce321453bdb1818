"""The controller's KV accounting for one worker (WorkerKV): free blocks as reported, reservations held until
the worker answers them, a refusal for room until the next report; and the controller keeping a handoff's
reservation through a report that the decode worker sent before it adopted (support/inbox_fleet.py)."""

from pathlib import Path

from support.inbox_fleet import InboxFleet, step

from fleetctl.engine.core.block_allocator import BLOCK_SIZE
from fleetctl.engine.core.sequence import FinishReason
from fleetctl.engine.fleet.worker_kv import WorkerKV
from fleetctl.engine.worker import protocol as m


def test_a_worker_not_yet_ready_has_nothing_available_and_no_usage() -> None:
    kv = WorkerKV()
    assert (kv.num_blocks, kv.block_size, kv.free, kv.available, kv.usage) == (0, BLOCK_SIZE, 0, 0, 0.0)
    kv.started(100, 32)
    assert (kv.num_blocks, kv.block_size, kv.free, kv.available, kv.usage) == (100, 32, 100, 100, 0.0)


def test_usage_is_what_the_worker_reported() -> None:
    kv = WorkerKV(100, free=25)
    assert kv.usage == 0.75
    kv.reserve("req-1", 20)
    assert kv.usage == 0.75 and kv.free == 25  # a reservation is not in use on the worker yet
    kv.reported(0)
    assert kv.usage == 1.0


def test_a_reservation_outlives_reports_until_its_answer_settles_it() -> None:
    kv = WorkerKV(10)
    kv.reserve("req-1", 4)
    assert (kv.free, kv.reserved, kv.available) == (10, 4, 6)
    kv.reported(10)  # a step the worker ran before it adopted: the blocks are not in its count yet
    assert kv.available == 6
    kv.settled("req-1", free_blocks=6)  # Adopted: its count has them now
    assert (kv.free, kv.reserved, kv.available) == (6, 0, 6)


def test_a_reservation_answered_without_a_count_gives_the_blocks_back() -> None:
    kv = WorkerKV(10)
    kv.reserve("req-1", 4)
    kv.reserve("move-1", 3)
    kv.settled("req-1")  # RequestFailed: it took nothing
    assert kv.available == 7
    kv.settled("move-1")
    kv.settled("move-1")  # settling twice (a move called off after its answer) changes nothing
    assert kv.available == 10


def test_available_never_goes_below_zero() -> None:
    kv = WorkerKV(10, free=2)
    kv.reserve("req-1", 5)
    assert kv.available == 0


def test_a_refusal_for_room_leaves_nothing_available_until_the_worker_reports_again() -> None:
    kv = WorkerKV(10)
    kv.reserve("req-1", 4)
    kv.reserve("req-2", 1)
    kv.refused_for_room("req-1")
    assert kv.available == 0 and kv.reserved == 1
    kv.reported(8)
    assert kv.available == 7


def test_a_new_process_voids_what_was_reserved_for_its_predecessor() -> None:
    kv = WorkerKV(10)
    kv.reserve("req-1", 4)
    kv.refused_for_room("req-2")
    kv.started(10, BLOCK_SIZE)
    assert (kv.free, kv.reserved, kv.available) == (10, 0, 10)


def test_a_handoff_stays_reserved_through_a_report_the_decode_worker_sent_before_adopting(tiny_model_dir: Path,
                                                                                          tmp_path: Path) -> None:
    """decode-0 has room for one handoff. Its report after the first Adopt went out, but before it adopted,
    still counts the block free: the second handoff must wait for it to answer, not be sent there too."""
    fleet = InboxFleet(tiny_model_dir, tmp_path, decode_blocks=1)
    a, b = fleet.submit("a", [5, 6, 7]), fleet.submit("b", [8, 9])
    fleet.deliver("prefill-0", step("prefill-0", [m.TokenEvent("a", 42, False, None, handoff=fleet.handoff("a"))],
                                    free_blocks=63))
    assert fleet.sent("decode-0", m.Adopt, "a")
    fleet.deliver("decode-0", step("decode-0", [], free_blocks=1, prefill=False))  # sent before it adopted "a"
    fleet.deliver("prefill-0", step("prefill-0", [m.TokenEvent("b", 43, False, None, handoff=fleet.handoff("b"))],
                                    free_blocks=62))
    assert not fleet.sent("decode-0", m.Adopt, "b") and b.decode_worker is None
    fleet.deliver("decode-0", m.Adopted("a", 2, 0.01, 0))
    assert not fleet.sent("decode-0", m.Adopt, "b") and a.decode_worker == "decode-0"
    fleet.deliver("decode-0", step("decode-0", [m.TokenEvent("a", 44, True, FinishReason.LENGTH)], free_blocks=1,
                                   prefill=False))  # "a" ended there
    assert fleet.sent("decode-0", m.Adopt, "b") and b.decode_worker == "decode-0"
