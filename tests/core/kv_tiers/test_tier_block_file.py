"""A tier's block record checks itself: it round-trips, and a truncated, corrupted or other block's record is
refused with the reason, never read as K/V."""

import hashlib

import pytest

from fleetctl.engine.core.kv_tiers.block_file import CorruptBlock, TierBlock, decode


def block(n: int = 0, payload: bytes = b"") -> TierBlock:
    digest = hashlib.blake2b(f"block {n}".encode(), digest_size=16).digest()
    parent = hashlib.blake2b(f"block {n - 1}".encode(), digest_size=16).digest()
    return TierBlock(digest, parent, tuple(range(n, n + 16)), payload or bytes(range(256)) * 8)


def test_a_record_round_trips() -> None:
    original = block(3)
    assert decode(original.encode(), original.digest) == original


@pytest.mark.parametrize(("damage", "reason"), [
    (lambda data: data[:-1], "bytes where the header promises"),
    (lambda data: data[:20], "shorter than a record's header"),
    (lambda data: data[:-40] + bytes([data[-40] ^ 1]) + data[-39:], "the payload's checksum does not match"),
    (lambda data: data[:50] + bytes([data[50] ^ 1]) + data[51:], "the header's checksum does not match"),
    (lambda data: b"XXXX" + data[4:], "not a version-1 tier record"),
])
def test_a_damaged_record_is_refused(damage, reason: str) -> None:
    original = block(1)
    with pytest.raises(CorruptBlock, match=reason):
        decode(damage(original.encode()), original.digest)


def test_another_blocks_record_is_refused() -> None:
    with pytest.raises(CorruptBlock, match="it holds block"):
        decode(block(1).encode(), block(2).digest)
