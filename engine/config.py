"""What one engine (one worker's model, KV pool and scheduler) is built from."""

from dataclasses import dataclass
from pathlib import Path

from fleetctl.engine.devices import DTYPE_CHOICES

DEFAULT_CPU_KV_BYTES = 2 << 30  # cap on a CPU: plenty for a small model, bounded for a lab box
GPU_KV_FRACTION = 0.85  # share of the device memory left free after loading the weights


@dataclass(frozen=True)
class EngineConfig:
    model_dir: Path
    device: str = "cpu"
    dtype: str = "auto"
    deterministic: bool = False
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 4096
    kv_memory_bytes: int | None = None  # cap for the KV pool; None sizes it from free memory
    num_kv_blocks: int | None = None  # exact pool size (tests); overrides kv_memory_bytes
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    detokenize: bool = True  # False in fleet workers: the controller owns text and stop strings
    prefill_only: bool = False  # park sequences after their prefill step (a prefill worker)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_CHOICES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPE_CHOICES)}, got {self.dtype!r}")
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive")
        for name in ("kv_memory_bytes", "num_kv_blocks", "max_model_len"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be positive when set")
