"""One full KV block as a tier stores it: a self-describing record that a reader can check before it trusts a
byte. A tier file is

    magic "FKVT" · version u16 · digest (16 B) · parent digest (16 B) · tokens u32 · payload bytes u64
    · token ids (u32 each) · sha256 of everything before it (32 B) · payload

and the payload's own sha256 ends the file (32 B). The digest is the block's hash chain (`block_hash`): it
names the model, dtype, numerics, KV layout and block size through its salt, and every token before the
block, so it is the block's address. A record whose digest, parent or token ids differ from what the reader
asked for, or whose length or checksums are off (a truncated or corrupted file), is refused
(`CorruptBlock`): a tier read is a cache hit only when every check passes. Torch-free: payloads are bytes."""

import hashlib
import struct
from dataclasses import dataclass

from fleetctl.errors import FleetctlError

MAGIC = b"FKVT"
VERSION = 1
_HEAD = struct.Struct("<4sH16s16sIQ")
CHECKSUM_BYTES = 32


class CorruptBlock(FleetctlError):
    """A tier record that does not check out (the message says what)."""


@dataclass(frozen=True)
class TierBlock:
    digest: bytes  # the block's hash chain digest: its address
    parent: bytes  # the digest of the block before it (the salt's root for a first block)
    token_ids: tuple[int, ...]
    payload: bytes  # its K/V, as the engine laid them out

    def encode(self) -> bytes:
        head = _HEAD.pack(MAGIC, VERSION, self.digest, self.parent, len(self.token_ids), len(self.payload))
        head += struct.pack(f"<{len(self.token_ids)}I", *self.token_ids)
        head += hashlib.sha256(head).digest()
        return head + self.payload + hashlib.sha256(self.payload).digest()


def decode(data: bytes, digest: bytes) -> TierBlock:
    """The block stored as `digest`; raises CorruptBlock unless the record is whole, intact and that block."""
    if len(data) < _HEAD.size:
        raise CorruptBlock(f"{len(data)} bytes: shorter than a record's header")
    magic, version, stored, parent, tokens, size = _HEAD.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        raise CorruptBlock(f"not a version-{VERSION} tier record (magic {magic!r}, version {version})")
    ids_end = _HEAD.size + 4 * tokens
    payload_at = ids_end + CHECKSUM_BYTES
    if len(data) != payload_at + size + CHECKSUM_BYTES:
        raise CorruptBlock(f"{len(data)} bytes where the header promises {payload_at + size + CHECKSUM_BYTES}")
    if hashlib.sha256(data[:ids_end]).digest() != data[ids_end:payload_at]:
        raise CorruptBlock("the header's checksum does not match")
    payload = data[payload_at:payload_at + size]
    if hashlib.sha256(payload).digest() != data[payload_at + size:]:
        raise CorruptBlock("the payload's checksum does not match")
    if stored != digest:
        raise CorruptBlock(f"it holds block {stored.hex()}, not {digest.hex()}")
    return TierBlock(stored, parent, struct.unpack_from(f"<{tokens}I", data, _HEAD.size), payload)
