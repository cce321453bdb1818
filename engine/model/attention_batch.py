"""What a step's attention needs beside the tokens: where each new token's K/V goes and which keys each sequence
reads."""

from dataclasses import dataclass

import torch


@dataclass
class AttentionBatch:
    """Where each new token's K/V goes and which keys each sequence attends to."""

    is_prefill: bool
    slots: torch.Tensor  # [T] int64 flat cache slot per new token
    block_tables: torch.Tensor  # [B, max_blocks] int32
    context_lens: torch.Tensor  # [B] int32: cached + new tokens per sequence
    cu_seqlens_q: torch.Tensor  # [B + 1] int32: sequence i owns new-token rows [cu[i], cu[i+1])
    # the windowed layers' own, when their K/V lives apart (core/window_slots): slots [T], tables [B, max_blocks]
    window_slots: torch.Tensor | None = None
    window_tables: torch.Tensor | None = None

    def for_layer(self, windowed: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """(slots, block tables) a layer writes and reads its K/V through."""
        if windowed and self.window_tables is not None and self.window_slots is not None:
            return self.window_slots, self.window_tables
        return self.slots, self.block_tables
