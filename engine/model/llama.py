"""Llama-family decoder (GQA, RoPE, RMSNorm, SwiGLU) over a paged KV cache.

Plain tensors rather than nn.Modules: decode on a CPU is dominated by per-op overhead, and the
math goes through `fleetctl.kernels.ops` so the Triton kernels can replace it.
"""

from dataclasses import dataclass, replace

import torch

from fleetctl.engine.model.config import ModelConfig
from fleetctl.engine.model.rope import inverse_frequencies
from fleetctl.kernels import ops
from fleetctl.kernels.packed_linear import pack
from fleetctl.kernels.quantized_linear import QuantizedWeight

Matrix = torch.Tensor | QuantizedWeight  # a layer's weight matrix: dense, or weight-only quantized


@dataclass
class LayerWeights:
    input_norm: torch.Tensor  # [D]
    qkv: Matrix  # [(H + 2*Hkv) * d, D]
    qkv_bias: torch.Tensor | None  # [(H + 2*Hkv) * d]
    o_proj: Matrix  # [D, H * d]
    post_norm: torch.Tensor  # [D]
    gate_up: Matrix  # [2 * I, D]
    down: Matrix  # [D, I]


@dataclass
class LlamaWeights:
    embed: torch.Tensor  # [V, D]
    layers: list[LayerWeights]
    final_norm: torch.Tensor  # [D]
    lm_head: torch.Tensor  # [V, D]; the embedding itself when tied

    def packed(self) -> "LlamaWeights":
        """The dense weight matrices packed for the CPU's GEMM (kernels/packed_linear; unchanged on a GPU or
        quantized); the embedding and norms as they are. A tied head becomes a packed copy, the embedding stays
        indexable."""
        layers = [replace(layer, qkv=_pack(layer.qkv), o_proj=_pack(layer.o_proj), gate_up=_pack(layer.gate_up),
                          down=_pack(layer.down)) for layer in self.layers]
        return replace(self, layers=layers, lm_head=pack(self.lm_head))

    @property
    def layer_matrix_bytes(self) -> int:
        """Bytes of the decoder layers' matrices as stored (quantized: codes and scales): what a step reads."""
        return sum(_matrix_bytes(getattr(layer, name)) for layer in self.layers
                   for name in ("qkv", "o_proj", "gate_up", "down"))


def _matrix_bytes(matrix: Matrix) -> int:
    if isinstance(matrix, QuantizedWeight):
        return matrix.nbytes
    return matrix.numel() * matrix.element_size()


def _pack(matrix: Matrix) -> Matrix:
    return matrix if isinstance(matrix, QuantizedWeight) else pack(matrix)


@dataclass
class AttentionBatch:
    """Where each new token's K/V goes and which keys each sequence attends to."""

    is_prefill: bool
    slots: torch.Tensor  # [T] int64 flat cache slot per new token
    block_tables: torch.Tensor  # [B, max_blocks] int32
    context_lens: torch.Tensor  # [B] int32: cached + new tokens per sequence
    cu_seqlens_q: torch.Tensor  # [B + 1] int32: sequence i owns new-token rows [cu[i], cu[i+1])


class LlamaModel:
    def __init__(self, config: ModelConfig, weights: LlamaWeights, deterministic: bool = False) -> None:
        self.config = config
        self.weights = weights
        self.deterministic = deterministic
        self.scale = config.head_dim**-0.5
        self.row_ops = ops.BATCH_INVARIANT if deterministic else ops.FAST
        device = weights.embed.device
        positions = torch.arange(config.max_position_embeddings, dtype=torch.float32)
        freqs = torch.outer(positions, inverse_frequencies(config))  # [P, d/2]
        # in the model's dtype, as Hugging Face's Llama applies them (the Triton kernel upcasts)
        self.cos = freqs.cos().to(device=device, dtype=weights.embed.dtype)
        self.sin = freqs.sin().to(device=device, dtype=weights.embed.dtype)

    @property
    def device(self) -> torch.device:
        return self.weights.embed.device

    @property
    def dtype(self) -> torch.dtype:
        return self.weights.embed.dtype

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, batch: AttentionBatch, kv_cache: torch.Tensor
    ) -> torch.Tensor:
        """input_ids, positions: [T]; kv_cache: [L, 2, blocks, block_size, Hkv, d].
        Returns the final normed hidden states [T, D]."""
        cfg = self.config
        row = self.row_ops
        linear = row.linear
        tokens = input_ids.shape[0]
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        cos, sin = self.cos[positions], self.sin[positions]
        hidden = self.weights.embed[input_ids]
        residual: torch.Tensor | None = None
        keys = rope = None  # decode attention's gather and the rotation, the same in every layer
        if not self.deterministic:
            rope = ops.rotary_step_tables(cos, sin, self.dtype)
            if not batch.is_prefill:
                keys = ops.decode_step_keys(batch.block_tables, batch.context_lens, kv_cache.shape[3])
        for layer, kv_layer in zip(self.weights.layers, kv_cache, strict=True):
            x, residual = row.rms_norm(hidden, layer.input_norm, cfg.rms_norm_eps, residual)
            qkv = linear(x, layer.qkv)
            if layer.qkv_bias is not None:
                qkv = qkv + layer.qkv_bias
            q, k, v = qkv.split((q_size, kv_size, kv_size), dim=-1)
            q = q.view(tokens, cfg.num_heads, cfg.head_dim)
            k = k.view(tokens, cfg.num_kv_heads, cfg.head_dim)
            v = v.view(tokens, cfg.num_kv_heads, cfg.head_dim)
            q, k = row.rotary(q, k, cos, sin, rope)
            ops.store_kv(k, v, kv_layer, batch.slots)
            attn = self._attention(q, kv_layer, batch, keys)
            hidden = linear(attn.reshape(tokens, q_size), layer.o_proj)
            x, residual = row.rms_norm(hidden, layer.post_norm, cfg.rms_norm_eps, residual)
            hidden = linear(row.silu_mul(linear(x, layer.gate_up)), layer.down)
        hidden, _ = row.rms_norm(hidden, self.weights.final_norm, cfg.rms_norm_eps, residual)
        return hidden

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [S, D] -> float32 logits [S, V]."""
        return self.row_ops.linear(hidden, self.weights.lm_head).float()

    def _attention(
        self, q: torch.Tensor, kv_layer: torch.Tensor, batch: AttentionBatch, keys: ops.DecodeKeys | None
    ) -> torch.Tensor:
        if self.deterministic:
            return ops.invariant_attention(
                q, kv_layer, batch.block_tables, batch.cu_seqlens_q, batch.context_lens, self.scale
            )
        if batch.is_prefill:
            return ops.prefill_attention(
                q, kv_layer, batch.block_tables, batch.cu_seqlens_q, batch.context_lens, self.scale
            )
        return ops.decode_attention(q, kv_layer, batch.block_tables, batch.context_lens, self.scale, keys)
