"""What one engine (one worker's model, KV pool and scheduler) is built from.

`EngineSettings` is everything a fleet sets once for all its workers (and `generate` for its one
engine); `EngineConfig` adds what differs per engine: the model directory, the device and the role.
"""

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Annotated

from fleetctl.domain import Quantization
from fleetctl.engine.core.block_allocator import BLOCK_SIZE
from fleetctl.engine.model.registry import DEFAULT_MODEL
from fleetctl.errors import UserError
from fleetctl.options import GB, MIB, MIB_OR_NONE, ZERO_IS_NONE, CliOption, Conversion, Nested

INT4_GROUP_SIZES = (32, 64, 128)  # those torch's int4 kernels take


class DType(StrEnum):
    """The dtype an engine computes in; `auto` is bf16 on GPUs and on CPUs with native bf16, fp32 otherwise."""

    AUTO = "auto"
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"


class KVDtype(StrEnum):
    """What a worker's KV pool stores: the model's dtype (`auto`), or int8 codes with a bf16 scale per token and KV
    head (kernels/kv_quant.py: 0.52x the bytes at head_dim 64)."""

    AUTO = "auto"
    INT8 = "int8"


class OffloadPolicy(StrEnum):
    """When a pool's block goes to the KV tiers (`kv_offload`): as the pool reclaims it (the default: only what it
    would lose), or as soon as it is full and written (every cached block is in the tiers at once: a worker that
    stops or restarts leaves its cache there; each full block costs a copy out of the pool as it is made)."""

    EVICT = "evict"
    WRITE_THROUGH = "write-through"


class SpeculativeMode(StrEnum):
    """How a decode step proposes tokens to verify (`engine/core/speculation.py`): none, or prompt lookup (the
    tokens that followed the sequence's latest earlier occurrence of its last few tokens)."""

    NONE = "none"
    NGRAM = "ngram"


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


KV_PANEL = "KV cache"  # the help's section for the KV pool's options and its tiers


@dataclass(frozen=True)
class EngineSettings:
    dtype: Annotated[DType, CliOption(
        "--dtype", help="auto: bf16 if every device has it natively (GPUs, CPUs with AVX512-BF16/AMX), "
                        "else fp32.")] = DType.AUTO
    deterministic: Annotated[bool, CliOption(
        "--deterministic", help="Batch-invariant numerics: a sequence's tokens do not depend on its batch.")] = False
    quantization: Annotated[Quantization, CliOption(
        "--quantization", help="Linear weights: none (the model's dtype), int8 (per channel), int4 (groups of "
                               "--quant-group-size; a pulled GGUF's own 4-bit blocks at 32), or auto (int4 when the "
                               "model's GGUF holds 4-bit blocks).")] = Quantization.NONE
    quant_group_size: Annotated[int, CliOption(
        "--quant-group-size", choices=INT4_GROUP_SIZES,
        help=f"Inputs per int4 scale: {', '.join(map(str, INT4_GROUP_SIZES[:-1]))} or {INT4_GROUP_SIZES[-1]}.")] = 32
    compile: Annotated[CompileMode, CliOption(
        "--compile", envvar="FLEET_COMPILE",
        help="on: the decode step runs compiled, once per batch bucket (inductor; not with --deterministic; a "
             "fleet's decode workers compile theirs at start).")] = CompileMode.OFF
    speculative: Annotated[SpeculativeMode, CliOption(
        "--speculative", help="ngram: a decode step verifies tokens proposed by prompt lookup (what followed the "
                              "sequence's last few tokens before), as many as pay for their rows; under "
                              "--deterministic the tokens are the ones decoding without it gives (none: off).")] = \
        SpeculativeMode.NONE
    speculative_tokens: Annotated[int, CliOption(  # 7: a verifying sequence is 8 rows, one register group of the
        # CPU's product kernel (kernels/cpu_gemv.c)
        "--speculative-tokens", min=1, help="Draft tokens a sequence proposes per step, at most.")] = 7
    max_num_seqs: Annotated[int, CliOption("--max-num-seqs", min=1, help="Sequences per worker batch.")] = 64
    max_num_batched_tokens: Annotated[int, CliOption(
        "--max-num-batched-tokens", min=16,
        help="Prompt tokens one step computes: a longer prompt is prefilled in chunks (between them a mixed worker "
             "decodes).")] = 4096
    max_model_len: Annotated[int | None, CliOption(  # None: the model's max_position_embeddings
        "--max-model-len", convert=ZERO_IS_NONE, min=0,
        help="Cap on prompt + output tokens (0: the model's context).")] = None
    prefix_cache: Annotated[bool, CliOption(  # reuse the KV blocks of cached prompt prefixes (block_manager)
        "--prefix-cache/--no-prefix-cache", panel=KV_PANEL,
        help="Reuse the KV of prompts' shared leading blocks (on by default).")] = True
    kv_dtype: Annotated[KVDtype, CliOption(
        "--kv-dtype", panel=KV_PANEL,
        help="The KV pool's format: auto (the model's dtype) or int8 (codes and a bf16 scale per token and KV head: "
             "about half the bytes, twice the tokens).")] = KVDtype.AUTO
    kv_memory_bytes: Annotated[int | None, CliOption(  # None sizes the pool from free memory
        "--kv-memory", convert=MIB_OR_NONE, min=0, panel=KV_PANEL,
        help="Cap each worker's KV pool, MiB (0: from memory).")] = None
    num_kv_blocks: Annotated[int | None, CliOption(  # exact pool size (tests); overrides kv_memory_bytes
        "--kv-blocks", convert=ZERO_IS_NONE, min=0, panel=KV_PANEL,
        help="Exact KV blocks per worker (overrides --kv-memory).")] = None
    # the node-wide KV tiers under the pool (engine/core/kv_offload.py): a host-memory tier's bound and a
    # disk tier's folder and bound; 0 / None: no such tier
    kv_offload_memory_bytes: Annotated[int, CliOption(
        "--kv-offload-memory", convert=MIB, min=0, panel=KV_PANEL,
        help="MiB of host memory (/dev/shm, shared by the node's workers) keeping the KV blocks the pools evict, "
             "read back instead of recomputed (0: none; needs the prefix cache).")] = 0
    kv_offload_host_dir: Annotated[Path | None, CliOption(
        "--kv-offload-host-dir", panel=KV_PANEL,
        help="The host tier's folder (default /dev/shm/fleetctl-host-tier: every fleet of the node "
             "shares it).")] = None
    kv_offload_dir: Annotated[Path | None, CliOption(
        "--kv-offload-dir", panel=KV_PANEL,
        help="A folder for a disk tier below the host one (with --kv-offload-gb).")] = None
    kv_offload_disk_bytes: Annotated[int, CliOption(
        "--kv-offload-gb", convert=GB, min=0.0, panel=KV_PANEL, help="The disk tier's bound, GB.")] = 0
    kv_offload_policy: Annotated[OffloadPolicy, CliOption(
        "--kv-offload-policy", panel=KV_PANEL,
        help="evict: a block goes to the tiers as its pool reclaims it; write-through: as soon as it is full (a "
             "stopped or restarted worker leaves its whole cache there).")] = OffloadPolicy.EVICT
    session_ttl_s: Annotated[float, CliOption(
        "--session-ttl", min=0.0, panel=KV_PANEL,
        help="Seconds a named session's KV (X-Session-Id, or the request's `user`) stays in the pools after its "
             "turn, reclaimed only when nothing else can be (then to the tiers, if any; 0: not kept).")] = 0.0

    def __post_init__(self) -> None:
        if self.dtype not in tuple(DType):
            raise EngineSettingsError(f"dtype must be one of {', '.join(DType)}, got {self.dtype!r}")
        object.__setattr__(self, "dtype", DType(self.dtype))
        object.__setattr__(self, "compile", CompileMode(self.compile))
        object.__setattr__(self, "speculative", SpeculativeMode(self.speculative))
        object.__setattr__(self, "quantization", Quantization(self.quantization))
        object.__setattr__(self, "kv_offload_policy", OffloadPolicy(self.kv_offload_policy))
        object.__setattr__(self, "kv_dtype", KVDtype(self.kv_dtype))
        if self.quant_group_size not in INT4_GROUP_SIZES:
            raise EngineSettingsError(f"quant_group_size must be one of {', '.join(map(str, INT4_GROUP_SIZES))}")
        for name in ("max_num_seqs", "max_num_batched_tokens", "speculative_tokens"):
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


def this_machines_device(device: str) -> str:
    """`--device`: the one named, else cuda:0 if there is a GPU, else cpu."""
    from fleetctl.engine.core.local_devices import gpu_count  # NVML: only once a command builds an engine

    return device or ("cuda:0" if gpu_count() else "cpu")


# a model by its store name or a Hugging Face directory: the command resolves it (pulling a known one on first use)
MODEL_OPTION = CliOption("--model", "-m", type=str, default=DEFAULT_MODEL, help="Store name or Hugging Face directory.")


@dataclass(frozen=True)
class EngineConfig:
    model_dir: Annotated[Path, MODEL_OPTION]
    device: Annotated[str, CliOption(  # cpu, cpu:N (computes on the CPU) or cuda:N
        "--device", convert=Conversion(str, this_machines_device, str), default="",
        help="cpu or cuda:N (default: cuda:0 if present, else cpu).")] = "cpu"
    settings: Annotated[EngineSettings, Nested()] = field(default_factory=EngineSettings)
    detokenize: bool = True  # False in fleet workers: the controller owns text and stop strings
    prefill_only: bool = False  # park sequences after their prefill step (a prefill worker)
    memory_share: float = 1.0  # of its GPU's KV budget: 1/S for one of S workers sharing the GPU (`cuda:N#S`)
