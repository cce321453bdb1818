"""The controller's KV accounting for one worker (WorkerKV): free blocks as reported, reservations held until
the worker answers them, a refusal for room until the next report."""

from fleetctl.engine.core.block_allocator import BLOCK_SIZE
from fleetctl.engine.fleet.worker_kv import WorkerKV


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

