"""The worker's paged KV pool: its shape, its tensors, and the block manager that owns its blocks."""

from dataclasses import dataclass

import torch

from fleetctl.engine.core.block_allocator import BLOCK_SIZE
from fleetctl.engine.core.block_manager import BlockManager
from fleetctl.engine.core.engine_settings import KVDtype
from fleetctl.engine.core.window_slots import NO_SLOT
from fleetctl.engine.model.model_config import ModelConfig
from fleetctl.kernels import kv_quant


@dataclass(frozen=True)
class KVCacheSpec:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype  # the model's: what K/V are computed in and attention reads them as
    block_size: int = BLOCK_SIZE
    # layers whose K/V lives in a pool of their own (window_slots): windowed layers beside global ones
    windowed_layers: tuple[int, ...] = ()
    kv_dtype: KVDtype = KVDtype.AUTO  # what the pool stores (int8: rows of codes and a scale, kernels/kv_quant.py)

    @classmethod
    def for_model(cls, config: ModelConfig, dtype: torch.dtype, kv_dtype: KVDtype = KVDtype.AUTO) -> "KVCacheSpec":
        return cls(config.num_layers, config.num_kv_heads, config.head_dim, dtype,
                   windowed_layers=config.windowed_layers, kv_dtype=kv_dtype)

    @property
    def storage_dtype(self) -> torch.dtype:
        """The pool tensor's dtype."""
        return torch.int8 if self.kv_dtype is KVDtype.INT8 else self.dtype

    @property
    def row_width(self) -> int:
        """The pool's last dimension: a (token, KV head) row's values as stored."""
        return kv_quant.stored_width(self.head_dim) if self.kv_dtype is KVDtype.INT8 else self.head_dim

    @property
    def label(self) -> str:
        """The stored format as status and compat name it: the model's dtype, or int8."""
        return self.kv_dtype.value if self.kv_dtype is not KVDtype.AUTO else str(self.dtype).removeprefix("torch.")

    @property
    def bytes_per_value(self) -> float:
        """A K or V value's bytes as stored (an int8 pool's rows carry their scale: (d + 2) / d)."""
        return self.storage_dtype.itemsize * self.row_width / self.head_dim

    @property
    def layer_bytes_per_block(self) -> int:
        """One layer's K and V for one block, as stored."""
        return 2 * self.block_size * self.num_kv_heads * self.row_width * self.storage_dtype.itemsize

    @property
    def bytes_per_block(self) -> int:
        """Every layer's K/V for one block (what a block costs when no layer keeps its K/V apart)."""
        return self.num_layers * self.layer_bytes_per_block

    @property
    def global_layers(self) -> tuple[int, ...]:
        """The layers whose K/V a block holds (all of them, but those kept apart)."""
        return tuple(i for i in range(self.num_layers) if i not in self.windowed_layers)


class KVCache:
    """The pool tensor [layers, 2, blocks, block_size, kv_heads, head_dim] (an int8 pool: rows of
    spec.row_width) and its block manager;
    `prefix_root` (block_hash.KVSalt.root) turns on prefix caching. With `scratch`, the tensor holds one
    block more than the manager hands out, `scratch_block`, which the compiled decode step's padding rows
    write to.

    With windowed layers kept apart (`spec.windowed_layers`, `window_slots` slots), `tensor` holds the global
    layers only and `window_tensor` [windowed layers, 2, slots (+ scratch), block_size, kv_heads, head_dim] the
    others, indexed by a block's window slot. What leaves or enters the pool (handoffs, moves, checkpoints, KV
    tiers) goes through `read_blocks` / `write_blocks` in the all-layers layout either way.

    Zero-initialised: masked attention multiplies unused slots by exactly 0, which must not meet NaN.
    """

    def __init__(
        self, spec: KVCacheSpec, num_blocks: int, device: torch.device, prefix_root: bytes | None = None,
        scratch: bool = False, window_slots: int = 0,
    ) -> None:
        if num_blocks < 1:
            raise ValueError("the KV cache needs at least one block")
        if bool(spec.windowed_layers) != bool(window_slots):
            raise ValueError("windowed layers kept apart need window slots, and only they")
        self.spec = spec
        self.scratch_block = num_blocks if scratch else None
        self.scratch_slot = window_slots if scratch and window_slots else None
        shape = (spec.block_size, spec.num_kv_heads, spec.row_width)
        self.tensor = torch.zeros(len(spec.global_layers), 2, num_blocks + scratch, *shape, dtype=spec.storage_dtype,
                                  device=device)
        self.window_tensor = torch.zeros(len(spec.windowed_layers), 2, window_slots + (scratch and window_slots > 0),
                                         *shape, dtype=spec.storage_dtype, device=device)
        self.allocator = BlockManager(num_blocks, spec.block_size, prefix_root, window_slots=window_slots)
        # each model layer's [2, blocks or slots, block_size, kv_heads, head_dim], in layer order
        places = {layer: self.tensor[i] for i, layer in enumerate(spec.global_layers)}
        places.update({layer: self.window_tensor[i] for i, layer in enumerate(spec.windowed_layers)})
        self.layers = [places[layer] for layer in range(spec.num_layers)]

    @property
    def usage(self) -> float:
        return self.allocator.num_used / self.allocator.num_blocks

    @property
    def nbytes(self) -> int:
        return self.tensor.numel() * self.tensor.element_size() + \
            self.window_tensor.numel() * self.window_tensor.element_size()

    def read_blocks(self, blocks: list[int]) -> torch.Tensor:
        """`blocks`' K/V, every layer: [layers, 2, len(blocks), block_size, kv_heads, head_dim]. A windowed layer
        kept apart reads zeros for a block without a window slot (no query's window reaches it)."""
        index = torch.tensor(blocks, dtype=torch.int64, device=self.tensor.device)
        if not self.spec.windowed_layers:
            return self.tensor.index_select(2, index)
        spec = self.spec
        kv = torch.zeros(spec.num_layers, 2, len(blocks), spec.block_size, spec.num_kv_heads, spec.row_width,
                         dtype=spec.storage_dtype, device=self.tensor.device)
        kv[list(spec.global_layers)] = self.tensor.index_select(2, index)
        rows, slots = self._slotted(blocks)
        if rows:
            window = self.window_tensor.index_select(2, torch.tensor(slots, device=self.tensor.device))
            kv[torch.tensor(spec.windowed_layers)[:, None], :, torch.tensor(rows)] = window.transpose(1, 2)
        return kv

    def write_blocks(self, blocks: list[int], kv: torch.Tensor) -> None:
        """kv [layers, 2, len(blocks), block_size, kv_heads, head_dim] into `blocks` (a windowed layer kept
        apart: only into those with a window slot)."""
        device = self.tensor.device
        kv = kv.to(device, non_blocking=True)
        index = torch.tensor(blocks, dtype=torch.int64, device=device)
        if not self.spec.windowed_layers:
            self.tensor.index_copy_(2, index, kv)
            return
        self.tensor.index_copy_(2, index, kv[list(self.spec.global_layers)])
        rows, slots = self._slotted(blocks)
        if rows:
            windowed = kv[list(self.spec.windowed_layers)][:, :, rows]
            self.window_tensor.index_copy_(2, torch.tensor(slots, device=device), windowed)

    def has_window(self, block: int) -> bool:
        """Whether `block` holds every layer's K/V (false only for one whose window slot is gone)."""
        window = self.allocator.window
        return window is None or window.slot(block) != NO_SLOT

    def _slotted(self, blocks: list[int]) -> tuple[list[int], list[int]]:
        """The places in `blocks` of those with a window slot, and their slots."""
        window = self.allocator.window
        assert window is not None
        pairs = [(row, window.slot(block)) for row, block in enumerate(blocks) if window.slot(block) != NO_SLOT]
        return [row for row, _ in pairs], [slot for _, slot in pairs]
