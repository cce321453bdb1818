"""Which of a sequence's leading KV blocks no layer reads again, when every layer attends through a sliding
window (Mistral's `sliding_window`). Torch-free: the scheduler drops those blocks as the sequence grows, so
a windowed decode worker holds at most `window / block_size + 2` blocks per sequence however long it runs.

A query at position p reads keys p - window + 1 … p (kernels/paged_attention.window_start); a step computes
queries from the sequence's `num_cached_tokens` on, so no later step reads a key before the first query's
window. Deterministic attention computes queries in fixed tiles whose keys start at the block holding the
tile's first row's window start (kernels/batch_invariant): there the first query is rounded down to its
tile, which keeps at most one block more (one those tiles read only to mask out), so that no kernel ever
reads a block that was freed. The kernels get block 0 for a dropped entry; none reads it.

A model with a global layer (Gemma 3's 1 in 6, Qwen2's layers below max_window_layers) reads every key, so
no block is dropped: its windowed layers keep their K/V in a pool of their own (`apart`), whose slots the same
rule gives back (window_holds)."""

from dataclasses import dataclass

DROPPED_BLOCK = -1  # a dropped block's block-table entry: indexing a tensor with it fails loudly


@dataclass(frozen=True)
class KVWindow:
    tokens: int  # the widest layer window: every key a query sees lies this close behind it
    block_size: int
    query_tile: int = 1  # queries computed in aligned tiles of this many positions (deterministic attention)
    apart: bool = False  # only some layers are windowed: theirs is a pool apart, passed blocks give slots back

    def __post_init__(self) -> None:
        if self.tokens < 1 or self.block_size < 1 or self.query_tile < 1:
            raise ValueError("a KV window, its block size and its query tile must be positive")

    def passed_blocks(self, first_query: int) -> int:
        """Leading blocks no step computing queries from position `first_query` on reads."""
        tile_start = first_query // self.query_tile * self.query_tile
        return max(0, tile_start - self.tokens + 1) // self.block_size

    @property
    def label(self) -> str:
        """What a checkpoint's compat pins: KV saved under one window and tile is loaded only under the same."""
        apart = ", windowed layers apart" if self.apart else ""
        return f"{self.tokens} tokens, query tile {self.query_tile}{apart}"
