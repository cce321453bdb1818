"""What one engine (one worker's model, KV pool and scheduler) is built from.

`EngineSettings` is everything a fleet sets once for all its workers (and `generate` for its one
engine); `EngineConfig` adds what differs per engine: the model directory, the device and the role.
"""

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from fleetctl.domain import Quantization
from fleetctl.engine.core.block_allocator import BLOCK_SIZE
from fleetctl.errors import UserError

INT4_GROUP_SIZES = (32, 64, 128)  # those torch's int4 kernels take


class DType(StrEnum):
    """The dtype an engine computes in; `auto` is bf16 on GPUs and on CPUs with native bf16, fp32 otherwise."""

    AUTO = "auto"
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"


class OffloadPolicy(StrEnum):
    """When a pool's block goes to the KV tiers (`kv_offload`): as the pool reclaims it (the default: only what it
    would lose), or as soon as it is full and written (every cached block is in the tiers at once: a worker that
    stops or restarts leaves its cache there; each full block costs a copy out of the pool as it is made)."""

    EVICT = "evict"
    WRITE_THROUGH = "write-through"


class CompileMode(StrEnum):
    """Whether decode steps run compiled (`engine/model/compiled_decode.py`), outside deterministic mode and
    on workers that decode. Off by default: on a 2-core CPU the compiled step measured no faster than the
    eager one (README, "Compiled decode")."""

    ON = "on"
    OFF = "off"


DEFAULT_CPU_KV_BYTES = 2 << 30  # cap on a CPU: plenty for a small model, bounded for a lab box
GPU_KV_FRACTION = 0.85  # share of the device memory left free after loading the weights


class EngineSettingsError(UserError):
    """Engine settings that cannot work together or at all (the message is one line for the user)."""


@dataclass(frozen=True)
class EngineSettings:
    dtype: DType = DType.AUTO
    deterministic: bool = False  # batch-invariant numerics: a sequence's tokens do not depend on its batch
    prefix_cache: bool = True  # reuse the KV blocks of cached prompt prefixes (block_manager)
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 4096
    kv_memory_bytes: int | None = None  # cap for the KV pool; None sizes it from free memory
    num_kv_blocks: int | None = None  # exact pool size (tests); overrides kv_memory_bytes
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    compile: CompileMode = CompileMode.OFF  # the decode step compiled once per batch bucket
    quantization: Quantization = Quantization.NONE  # the layers' weight format (engine/model/quantize)
    quant_group_size: int = 32  # inputs per int4 scale: 32, 64 or 128 (32 takes a GGUF's own 4-bit blocks)
    # the node-wide KV tiers under the pool (engine/core/kv_offload.py): a host-memory tier's bound and a
    # disk tier's folder and bound; 0 / None: no such tier
    kv_offload_memory_bytes: int = 0
    kv_offload_host_dir: Path | None = None  # the host tier's folder: None, /dev/shm/fleetctl-host-tier (node-wide)
    kv_offload_dir: Path | None = None
    kv_offload_disk_bytes: int = 0
    kv_offload_policy: OffloadPolicy = OffloadPolicy.EVICT
    session_ttl_s: float = 0.0  # a named session's blocks stay in the pool this long after its turn (0: not kept)

    def __post_init__(self) -> None:
        if self.dtype not in tuple(DType):
            raise EngineSettingsError(f"dtype must be one of {', '.join(DType)}, got {self.dtype!r}")
        object.__setattr__(self, "dtype", DType(self.dtype))
        object.__setattr__(self, "compile", CompileMode(self.compile))
        object.__setattr__(self, "quantization", Quantization(self.quantization))
        object.__setattr__(self, "kv_offload_policy", OffloadPolicy(self.kv_offload_policy))
        if self.quant_group_size not in INT4_GROUP_SIZES:
            raise EngineSettingsError(f"quant_group_size must be one of {', '.join(map(str, INT4_GROUP_SIZES))}")
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                raise EngineSettingsError(f"{name} must be positive")
        if self.session_ttl_s < 0:
            raise EngineSettingsError("--session-ttl must be >= 0")
        if self.kv_offload_memory_bytes < 0 or self.kv_offload_disk_bytes < 0:
            raise EngineSettingsError("KV offload tiers' bounds must not be negative")
        if (self.kv_offload_dir is None) != (self.kv_offload_disk_bytes == 0):
            raise EngineSettingsError("a disk tier needs both its folder (--kv-offload-dir) and its bound "
                                      "(--kv-offload-gb)")
        for name in ("kv_memory_bytes", "num_kv_blocks", "max_model_len"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise EngineSettingsError(f"{name} must be positive when set")

    def context_limit(self, max_context: int) -> int:
        """The longest sequence these settings ask of a model whose own limit is `max_context`: --max-model-len,
        no further than an exact pool (--kv-blocks) holds. The same for every worker of a fleet (a worker's
        sized-by-memory pool may cap it further), so what depends on it (longrope's table) agrees across them."""
        limit = min(self.max_model_len or max_context, max_context)
        return min(limit, self.num_kv_blocks * BLOCK_SIZE) if self.num_kv_blocks else limit


@dataclass(frozen=True)
class EngineConfig:
    model_dir: Path
    device: str = "cpu"  # cpu, cpu:N (computes on the CPU) or cuda:N
    settings: EngineSettings = field(default_factory=EngineSettings)
    detokenize: bool = True  # False in fleet workers: the controller owns text and stop strings
    prefill_only: bool = False  # park sequences after their prefill step (a prefill worker)
    memory_share: float = 1.0  # of its GPU's KV budget: 1/S for one of S workers sharing the GPU (`cuda:N#S`)
