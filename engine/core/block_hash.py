"""What a full KV block holds, as a name: a hash chain over token ids rooted in a salt (prefix caching).

A block's hash is blake2b(parent's hash ‖ its token ids as little-endian uint32); the first block's
parent is the salt's digest. One hash thus names the block's tokens, every token before them (the K/V
at a position depend on the whole prefix and on the absolute positions, both fixed by the chain), and
the conditions its K/V bits were computed under (the salt).

The salt is everything that changes a block's K/V bits for the same tokens:
- the model: the weights' key (their sha256 from the model store) and a digest of config.json (RoPE
  theta, norm epsilon and head layout change K/V for the same weights);
- the dtype the K/V were computed and are stored in;
- the numerics: batch-invariant (deterministic) and fast kernels sum in different orders, so their
  bits differ, and a deterministic engine must never read K/V computed the fast way (its
  token-identity guarantee would be gone);
- the device kind and the kernel backend (torch references, Triton, Triton's interpreter): other code,
  other rounding;
- the engine version (a change of code may change numerics), the KV layout version and the block size
  (what the bits mean, how many tokens a block holds).
Left out on purpose: sampling parameters (they act on logits, never on K/V); the batch a block was
computed in (fast-mode K/V depend on it with or without a cache; deterministic mode makes them
independent of it); the exact device model (a block is read only by the engine that wrote it, or by
one that received it through a handoff between workers of one fleet or a restore, whose compat check
pins the device).

Python's hash() would not do: it is salted per process (PYTHONHASHSEED), so two workers, or a router
and a worker, would disagree. Collisions: digests are 128 bits, so among 2^32 distinct blocks the
chance of any collision is about 2^-65; and the block manager keeps each cached block's parent hash
and token ids and compares them on every hit, so a wrong hit needs a real blake2b collision.

Torch-free, so a router can hash prompts against a worker's `PrefixDigest`.
"""

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import astuple, dataclass
from enum import StrEnum

DIGEST_BYTES = 16


class Numerics(StrEnum):
    FAST = "fast"
    DETERMINISTIC = "deterministic"  # batch-invariant kernels (EngineSettings.deterministic)


@dataclass(frozen=True)
class KVSalt:
    """The conditions a block's K/V bits were computed under (see the module docstring for why each)."""

    model: str  # weights key, config digest and weight format (quantized weights give other K/V)
    dtype: str
    numerics: Numerics
    device_kind: str  # cpu, cuda
    kernels: str  # the kernel backend: torch, triton, triton-interpret
    engine_version: str
    kv_layout: int
    block_size: int

    def root(self) -> bytes:
        """The digest every hash chain under this salt starts from."""
        text = "\0".join(str(part) for part in astuple(self))
        return hashlib.blake2b(text.encode(), digest_size=DIGEST_BYTES).digest()


def block_hash(parent: bytes, tokens: Sequence[int]) -> bytes:
    return hashlib.blake2b(parent + struct.pack(f"<{len(tokens)}I", *tokens), digest_size=DIGEST_BYTES).digest()


def chain_hashes(root: bytes, token_ids: Sequence[int], block_size: int, known: Sequence[bytes] = ()) -> list[bytes]:
    """The hash of every full block of `token_ids`; `known` (the hashes of its first blocks, computed
    before) are kept rather than recomputed. A partly filled last block has no hash."""
    hashes = list(known)
    parent = hashes[-1] if hashes else root
    for start in range(len(hashes) * block_size, len(token_ids) - block_size + 1, block_size):
        parent = block_hash(parent, token_ids[start : start + block_size])
        hashes.append(parent)
    return hashes


@dataclass(frozen=True)
class PrefixDigest:
    """What one engine caches, small enough to send to a router: its salt's root, its block size and
    at most a capped number of cached block hashes (16 bytes each), those held by running sequences
    first, then the most recently used. A router hashes a prompt under `root` and counts the leading
    blocks found here."""

    root: bytes
    block_size: int
    hashes: frozenset[bytes]

    def cached_prefix_tokens(self, token_ids: Sequence[int]) -> int:
        """Leading tokens of `token_ids` (whole blocks) whose K/V the engine held when it made this digest."""
        count = 0
        for digest in chain_hashes(self.root, token_ids, self.block_size):
            if digest not in self.hashes:
                break
            count += 1
        return count * self.block_size
