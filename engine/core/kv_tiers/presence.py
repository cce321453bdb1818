"""Which leading blocks of a prompt the node's KV tiers hold, told by their records' files being there (no read,
no check): what the controller weighs when it routes a prompt. Torch-free.

A block a tier holds is cheaper than one computed and dearer than one a worker's pool holds: a worker reads it
back (host memory or disk) into its pool before the prompt is scheduled. `TIER_TOKEN_COST` is that read's
share of computing the token, taken from what was measured: on a CPU smollm2-135m prefills ~1,700 tokens/s
(23 KB of KV each: ~40 MB/s of KV made) and reads a host-tier block back at GB/s, on a GPU prefill makes KV at
~1 GB/s against a host read of ~10 GB/s; 0.1 is the GPU's ratio, the dearer of the two. A record that turns out
to be damaged is a miss at read time (the worker recomputes it), so counting it here costs one wrong guess."""

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fleetctl.engine.core.engine_settings import EngineSettings
from fleetctl.engine.core.kv_tiers.file_tier import record_path, tier_roots

TIER_TOKEN_COST = 0.1  # reading a token's KV back from a tier, as a share of computing it


@dataclass(frozen=True)
class TierPresence:
    roots: tuple[Path, ...]  # the tiers' folders, fastest first

    @classmethod
    def of(cls, settings: EngineSettings) -> "TierPresence | None":
        """The tiers the fleet's workers use, or None when they use none."""
        roots = tier_roots(settings.kv_offload_memory_bytes, settings.kv_offload_host_dir, settings.kv_offload_dir,
                           settings.kv_offload_disk_bytes)
        return cls(tuple(root for _, root, _ in roots)) if roots else None

    def leading_blocks(self, chain: Sequence[bytes], start: int = 0) -> int:
        """How many of `chain`'s blocks from `start` on some tier holds, up to the first that none does."""
        count = 0
        for digest in chain[start:]:
            if not any(record_path(root, digest).exists() for root in self.roots):
                break
            count += 1
        return count
