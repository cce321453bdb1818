"""One tier folder: a block stored is read back checked; a corrupted or truncated file is a miss and is deleted;
the tier never holds more than its bound (least recently used out first, handed back for the tier below); two
processes storing the same block at once leave one valid copy; a full disk turns the tier off, not the caller."""

import multiprocessing as mp
from pathlib import Path

import pytest
from test_tier_block_file import block

from fleetctl.engine.core.kv_tiers.block_file import decode
from fleetctl.engine.core.kv_tiers.file_tier import FileTier


def test_a_stored_block_reads_back_and_counts(tmp_path: Path) -> None:
    tier = FileTier("disk", tmp_path / "tier", 10 << 20)
    stored = block(1)
    assert tier.get(stored.digest) is None
    assert tier.put(stored) == []
    assert tier.get(stored.digest) == stored and stored.digest in tier
    assert (tier.stats.hits, tier.stats.misses, tier.stats.writes) == (1, 1, 1)
    assert tier.stats.bytes_read == tier.stats.bytes_written == len(stored.encode()) == tier.usage()
    assert tier.stats.read_s > 0 and tier.stats.write_s > 0  # the time behind each, for the tier's bandwidth
    assert (tier.stats.used_bytes, tier.stats.capacity_bytes) == (tier.usage(), 10 << 20)
    assert FileTier("disk", tmp_path / "tier", 10 << 20).stats.used_bytes == tier.usage()  # opened again: counted


@pytest.mark.parametrize("damage", [lambda data: data[: len(data) // 2], lambda data: data[:-1] + b"\0"],
                         ids=["truncated", "corrupted"])
def test_a_damaged_file_is_a_miss_and_is_removed(tmp_path: Path, damage) -> None:
    tier = FileTier("disk", tmp_path / "tier", 10 << 20)
    stored = block(2)
    tier.put(stored)
    path = tier.path(stored.digest)
    path.write_bytes(damage(path.read_bytes()))
    assert tier.get(stored.digest) is None
    assert not path.exists() and tier.stats.corrupt == 1
    tier.put(stored)  # computed again and stored again: whole this time
    assert tier.get(stored.digest) == stored


def test_the_bound_holds_and_the_least_recently_used_go_first(tmp_path: Path) -> None:
    size = len(block(0).encode())
    tier = FileTier("host", tmp_path / "tier", 3 * size)
    for n in range(3):
        assert tier.put(block(n)) == []
    assert tier.get(block(0).digest) is not None  # read: now the most recent
    evicted = tier.put(block(3))
    assert [digest for digest, _ in evicted] == [block(1).digest]  # the oldest not read since
    assert decode(evicted[0][1], block(1).digest) == block(1)  # handed back whole, for the tier below
    for n in range(4, 12):
        tier.put(block(n))
        assert tier.usage() <= 3 * size and tier.stats.used_bytes == tier.usage()
    assert block(11).digest in tier and block(1).digest not in tier


def test_a_full_disk_turns_the_tier_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tier = FileTier("disk", tmp_path / "tier", 10 << 20)
    tier.put(block(1))
    monkeypatch.setenv("FLEET_FAULTS", "tier-write@disk=oserror:ENOSPC")
    assert tier.put(block(2)) == []
    assert "No space left on device: the disk tier is off" in tier.disabled
    assert tier.get(block(1).digest) is None and tier.put(block(3)) == []  # a no-op from now on
    assert not list((tmp_path / "tier").glob(".*.tmp"))  # nothing half-written left behind


def _store_many(root: Path, rounds: int) -> None:
    tier = FileTier("disk", root, 10 << 20)
    for _ in range(rounds):
        tier.path(block(7).digest).unlink(missing_ok=True)
        tier.put(block(7))


def test_two_processes_writing_one_block_leave_one_valid_copy(tmp_path: Path) -> None:
    root = tmp_path / "tier"
    writers = [mp.get_context("spawn").Process(target=_store_many, args=(root, 200)) for _ in range(2)]
    for writer in writers:
        writer.start()
    reader = FileTier("disk", root, 10 << 20)
    seen = 0
    while any(w.is_alive() for w in writers):
        found = reader.get(block(7).digest)
        assert found is None or found == block(7)  # never half a record
        seen += found is not None
    for writer in writers:
        writer.join()
        assert writer.exitcode == 0
    assert reader.stats.corrupt == 0 and seen > 0
    assert [p.name for p in root.iterdir()] == [reader.path(block(7).digest).name]
    assert reader.get(block(7).digest) == block(7)
