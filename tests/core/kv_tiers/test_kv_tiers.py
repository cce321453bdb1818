"""The store over the tiers: blocks offered go to the host tier in the background; what the host tier evicts
goes to disk; a lookup returns the longest stored prefix, each block from the fastest tier holding it, and copies
a disk hit up; a full writer queue drops blocks rather than waiting."""

from pathlib import Path

import pytest
from test_tier_block_file import block

from fleetctl.engine.core.kv_tiers.file_tier import FileTier
from fleetctl.engine.core.kv_tiers.tiers import KVTiers


@pytest.fixture
def tiers(tmp_path: Path):
    size = len(block(0).encode())
    store = KVTiers([FileTier("host", tmp_path / "host", 2 * size), FileTier("disk", tmp_path / "disk", 8 * size)])
    yield store
    store.close()


def test_host_evictions_go_to_disk_and_a_lookup_takes_the_longest_prefix(tiers: KVTiers) -> None:
    host, disk = tiers.tiers
    for n in range(4):
        assert tiers.offer(block(n))
    tiers.flush()
    # the host tier holds two blocks: the last two written; the first two went down to disk
    assert [block(n).digest in host for n in range(4)] == [False, False, True, True]
    assert [block(n).digest in disk for n in range(4)] == [True, True, False, False]
    hits = tiers.lookup([block(n).digest for n in (2, 3, 9, 0)])
    assert [(hit.block, hit.tier) for hit in hits] == [(block(2), "host"), (block(3), "host")]  # stops at 9
    [hit] = tiers.lookup([block(0).digest])
    assert (hit.block, hit.tier) == (block(0), "disk")
    assert block(0).digest in host  # copied up: its next read is from host memory
    assert block(2).digest in disk  # what that pushed out of the host tier went down, not away
    assert tiers.lookup([block(0).digest])[0].tier == "host"


def test_a_writer_far_behind_drops_blocks(tmp_path: Path) -> None:
    store = KVTiers([FileTier("host", tmp_path / "host", 1 << 30)], queue_blocks=1)
    offered = [store.offer(block(n)) for n in range(200)]
    store.close()
    assert not all(offered) and store.dropped == offered.count(False)
    assert all(block(n).digest in store.tiers[0] for n, ok in enumerate(offered) if ok)
