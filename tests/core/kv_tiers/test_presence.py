"""What the controller sees of the node's KV tiers: a prompt's leading blocks with a record in some tier folder,
up to the first that none holds, from where a worker's pool stops; and which folders the settings name."""

from pathlib import Path

from fleetctl.engine.core.engine_settings import EngineSettings
from fleetctl.engine.core.kv_tiers.file_tier import HOST_TIER_DIR, record_path
from fleetctl.engine.core.kv_tiers.presence import TierPresence

CHAIN = [bytes([i]) * 16 for i in range(8)]


def test_leading_blocks_stop_at_the_first_block_no_tier_holds(tmp_path: Path) -> None:
    host, disk = tmp_path / "host", tmp_path / "disk"
    host.mkdir()
    disk.mkdir()
    for digest in CHAIN[:3]:
        record_path(host, digest).write_bytes(b"x")
    record_path(disk, CHAIN[3]).write_bytes(b"x")  # a lower tier continues the prefix
    record_path(host, CHAIN[5]).write_bytes(b"x")  # past a gap: no use
    presence = TierPresence((host, disk))
    assert presence.leading_blocks(CHAIN) == 4
    assert presence.leading_blocks(CHAIN, start=2) == 2  # after the blocks a pool holds
    assert presence.leading_blocks(CHAIN, start=4) == 0
    assert TierPresence((host,)).leading_blocks(CHAIN) == 3


def test_the_settings_name_the_tiers_their_workers_use(tmp_path: Path) -> None:
    assert TierPresence.of(EngineSettings()) is None
    assert TierPresence.of(EngineSettings(kv_offload_memory_bytes=1 << 20)) == TierPresence((HOST_TIER_DIR,))
    both = EngineSettings(kv_offload_memory_bytes=1 << 20, kv_offload_host_dir=tmp_path / "h",
                          kv_offload_dir=tmp_path / "d", kv_offload_disk_bytes=1 << 30)
    assert TierPresence.of(both) == TierPresence((tmp_path / "h", tmp_path / "d"))
