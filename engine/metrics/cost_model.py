"""Model FLOPs and bytes moved by one step, from the model's shape alone (the MFU/MBU numerators).

FLOPs, counting a multiply-add as 2:
- matmuls: 2 · (per-layer matmul params) · (new tokens), plus 2 · vocab · hidden for each row that
  produces logits. The runner computes logits for one row per sequence (the last prompt position in
  prefill, the new token in decode), so the lm_head is charged per sequence, not per token.
- attention: QKᵀ and PV, each 2 · heads · head_dim per key attended, per new token, per layer. A new
  token at position p attends p + 1 keys (causal), so a sequence with c tokens after the step, q of
  them new, attends q·(c − q) + q·(q + 1)/2 keys in all; in a layer with a sliding window w, a token at p
  attends min(p + 1, w) keys.
Norms, RoPE, SiLU, softmax and the embedding lookup are O(hidden) per token and are left out, as in
the usual 2·N·D estimate.

Bytes:
- every matmul weight is read once per step (params × weight element size; quantized layers and a quantized
  head: their codes and scales as stored, `layer_bytes` and `head_bytes`); the embedding rows
  looked up are a few KB and are left out, except that with tied embeddings the lm_head read is
  that same matrix, counted once;
- KV read: each sequence's whole context, once (paged attention streams each block once per step); a
  windowed layer's, the keys its window spans over the step's new tokens (at most q + w − 1);
- KV written: the new tokens' keys and values.
- activations are left out: for decode they are a few KB per sequence against megabytes of weights;
  for a long prefill they are not negligible, but prefill is compute-bound and its MBU is not the
  number anyone steers by.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from fleetctl.engine.model.model_config import ModelConfig


@dataclass(frozen=True)
class StepCost:
    flops: int
    bytes: int


@dataclass(frozen=True)
class CostModel:
    config: ModelConfig
    weight_bytes: int  # bytes per weight element: 4 fp32, 2 bf16/fp16
    kv_bytes: float  # bytes per K or V value as the pool stores it (an int8 pool: 1 + its row's scale's share)
    layer_bytes: int | None = None  # the decoder layers' matrices as stored (quantized: codes + scales); None:
    # layer_params × weight_bytes
    head_bytes: int | None = None  # the lm_head as stored; None: lm_head_params × weight_bytes

    def __post_init__(self) -> None:
        if self.weight_bytes <= 0 or self.kv_bytes <= 0:
            raise ValueError("element sizes must be positive")

    @property
    def layer_params(self) -> int:
        """Matmul weights of all decoder layers: q, k, v, o projections and the gated MLP."""
        c = self.config
        attention = c.hidden_size * c.head_dim * (2 * c.num_heads + 2 * c.num_kv_heads)
        mlp = 3 * c.hidden_size * c.intermediate_size
        return c.num_layers * (attention + mlp)

    @property
    def lm_head_params(self) -> int:
        return self.config.vocab_size * self.config.hidden_size

    @property
    def weight_bytes_per_step(self) -> int:
        """Every matmul weight, read once (the lm_head once even when tied to the embedding)."""
        layers = self.layer_params * self.weight_bytes if self.layer_bytes is None else self.layer_bytes
        head = self.lm_head_params * self.weight_bytes if self.head_bytes is None else self.head_bytes
        return layers + head

    @property
    def kv_bytes_per_token(self) -> int:
        c = self.config
        return round(2 * c.num_layers * c.num_kv_heads * c.head_dim * self.kv_bytes)

    def step(self, new_tokens: Sequence[int], context_lens: Sequence[int]) -> StepCost:
        """One step over several sequences: sequence i runs new_tokens[i] tokens through the model
        and holds context_lens[i] tokens once the step is done (decode: new_tokens[i] == 1; a
        prefill without cached prefix: new_tokens[i] == context_lens[i])."""
        if len(new_tokens) != len(context_lens):
            raise ValueError("new_tokens and context_lens must have one entry per sequence")
        if any(q < 1 or c < q for q, c in zip(new_tokens, context_lens, strict=True)):
            raise ValueError("each sequence needs 1 <= new tokens <= context length")
        c = self.config
        tokens = sum(new_tokens)
        steps = list(zip(new_tokens, context_lens, strict=True))
        windows = c.traits.layer_windows or (None,) * c.num_layers
        keys = sum(_keys_attended(q, ctx, window) for window in windows for q, ctx in steps)
        read = sum(min(ctx, q + window - 1) if window else ctx for window in windows for q, ctx in steps)
        flops = (
            2 * self.layer_params * tokens
            + 2 * self.lm_head_params * len(new_tokens)
            + 4 * c.num_heads * c.head_dim * keys
        )
        nbytes = (
            self.weight_bytes_per_step
            + read * self.kv_bytes_per_token // c.num_layers
            + tokens * self.kv_bytes_per_token
        )
        return StepCost(flops, nbytes)

    def decode_step(self, context_lens: Sequence[int]) -> StepCost:
        return self.step([1] * len(context_lens), context_lens)

    def prefill_step(self, prompt_lens: Sequence[int]) -> StepCost:
        """Prompts with nothing cached: every prompt token is new."""
        return self.step(prompt_lens, prompt_lens)


def _keys_attended(new: int, context: int, window: int | None) -> int:
    """Keys one layer's new tokens attend in all: the tokens at positions context - new … context - 1, each at
    p attending min(p + 1, window) keys (every p + 1 without a window)."""
    first, last = context - new + 1, context  # each new token's key count without a window
    if window is None or last <= window:
        return (first + last) * new // 2
    if first >= window:
        return window * new
    return (first + window) * (window - first + 1) // 2 + window * (last - window)
