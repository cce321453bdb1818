"""The decoder every family runs (GQA, RoPE, RMSNorm, a gated MLP) over a paged KV cache; what a family
changes (families/base.Traits) are branches here, not copies of the forward pass.

Plain tensors rather than nn.Modules: decode on a CPU is dominated by per-op overhead, and the
math goes through `fleetctl.kernels.ops` so the Triton kernels can replace it.
"""

import torch

from fleetctl.engine.model.attention_batch import AttentionBatch
from fleetctl.engine.model.cpu_decode import CpuDecode
from fleetctl.engine.model.model_config import ModelConfig
from fleetctl.engine.model.rope import rope_tables
from fleetctl.engine.model.weights import ModelWeights
from fleetctl.kernels import ops


class DecoderModel:
    def __init__(self, config: ModelConfig, weights: ModelWeights, deterministic: bool = False,
                 long_rope: bool = False) -> None:
        self.config = config
        self.weights = weights
        self.deterministic = deterministic
        traits = config.traits
        self.scale = traits.query_scale or config.head_dim**-0.5
        self.row_ops = ops.BATCH_INVARIANT if deterministic else ops.FAST
        device, dtype = weights.embed.device, weights.embed.dtype
        # cos, sin [P, rotary_dim/2] in the model's dtype, as Hugging Face applies them (the Triton kernel upcasts)
        self.cos, self.sin = rope_tables(config, False, dtype, device, long_rope)
        self.long_rope = long_rope
        # each layer's sliding window (None: it attends to every key)
        self.layer_windows: tuple[int | None, ...] = traits.layer_windows or (None,) * config.num_layers
        # which rope each layer takes: its own for a windowed layer when the family has one (Gemma 3)
        self.layer_local_rope = [w is not None and traits.local_rope_theta is not None for w in self.layer_windows]
        self.local_cos, self.local_sin = (rope_tables(config, True, dtype, device) if any(self.layer_local_rope)
                                          else (self.cos, self.sin))
        self.embed_scale = torch.tensor(config.hidden_size**0.5, dtype=dtype) if traits.scale_embedding else None
        # the decode step as one C call on a CPU (the deterministic mode keeps its fixed tiles, op by op)
        self.cpu_decode = None if deterministic else CpuDecode.of(config, weights, self.scale, self.layer_windows,
                                                                  self.layer_local_rope)

    @property
    def device(self) -> torch.device:
        return self.weights.embed.device

    @property
    def dtype(self) -> torch.dtype:
        return self.weights.embed.dtype

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, batch: AttentionBatch,
        kv_cache: torch.Tensor | list[torch.Tensor],
    ) -> torch.Tensor:
        """input_ids, positions: [T]; kv_cache: each layer's [2, blocks, block_size, Hkv, d] (one tensor, or a
        list when windowed layers keep theirs apart). Returns the final normed hidden states [T, D]."""
        cfg = self.config
        row = self.row_ops
        linear, eps = row.linear, cfg.rms_norm_eps
        tokens = input_ids.shape[0]
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        hidden = self.weights.embed[input_ids]
        if self.embed_scale is not None:
            hidden = hidden * self.embed_scale
        if self.cpu_decode is not None and self.cpu_decode.takes(tokens, batch):
            return self.cpu_decode.forward(hidden, positions, batch, list(kv_cache), (self.cos, self.sin),
                                           (self.local_cos, self.local_sin))
        ropes = [self._step_rope(self.cos, self.sin, positions)]  # the rotation of this step's positions
        if any(self.layer_local_rope):
            ropes.append(self._step_rope(self.local_cos, self.local_sin, positions))
        residual: torch.Tensor | None = None
        keys: dict[int | None, ops.DecodeKeys | None] = {}  # decode attention's gather, per window: the same per layer
        if not self.deterministic and not batch.is_prefill:
            keys = {window: ops.decode_step_keys(batch.for_layer(window is not None)[1], batch.context_lens,
                                                 kv_cache[0].shape[2], window)
                    for window in set(self.layer_windows)}
        for index, (layer, kv_layer) in enumerate(zip(self.weights.layers, kv_cache, strict=True)):
            x, residual = row.rms_norm(hidden, layer.input_norm, eps, residual)
            qkv = linear(x, layer.qkv)
            if layer.qkv_bias is not None:
                qkv = qkv + layer.qkv_bias
            q, k, v = qkv.split((q_size, kv_size, kv_size), dim=-1)
            q = q.view(tokens, cfg.num_heads, cfg.head_dim)
            k = k.view(tokens, cfg.num_kv_heads, cfg.head_dim)
            v = v.view(tokens, cfg.num_kv_heads, cfg.head_dim)
            if layer.q_norm is not None and layer.k_norm is not None:
                q = row.rms_norm(q.reshape(-1, cfg.head_dim), layer.q_norm, eps)[0].view(q.shape)
                k = row.rms_norm(k.reshape(-1, cfg.head_dim), layer.k_norm, eps)[0].view(k.shape)
            q, k = self._rotate(q, k, *ropes[self.layer_local_rope[index]])
            window = self.layer_windows[index]
            slots, tables = batch.for_layer(window is not None)
            ops.store_kv(k, v, kv_layer, slots)
            attn = self._attention(q, kv_layer, tables, batch, window, keys.get(window))
            hidden = linear(attn.reshape(tokens, q_size), layer.o_proj)
            if layer.attn_out_norm is not None:
                hidden = row.rms_norm(hidden, layer.attn_out_norm, eps)[0]
            x, residual = row.rms_norm(hidden, layer.post_norm, eps, residual)
            hidden = linear(row.glu(linear(x, layer.gate_up), cfg.traits.activation), layer.down)
            if layer.mlp_out_norm is not None:
                hidden = row.rms_norm(hidden, layer.mlp_out_norm, eps)[0]
        hidden, _ = row.rms_norm(hidden, self.weights.final_norm, eps, residual)
        return hidden

    def _step_rope(self, cos_table: torch.Tensor, sin_table: torch.Tensor,
                   positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, ops.RotaryTables | None]:
        """cos, sin [T, rotary_dim/2] at `positions`, and their layout for the torch rotary (eager, fast mode)."""
        cos, sin = cos_table[positions], sin_table[positions]
        return cos, sin, None if self.deterministic else ops.rotary_step_tables(cos, sin, self.dtype)

    def _rotate(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                tables: ops.RotaryTables | None) -> tuple[torch.Tensor, torch.Tensor]:
        """q: [T, H, d], k: [T, Hkv, d], rotated in their first rotary_dim dims (all of them but for partial
        rotary, whose other dims pass through)."""
        rotated = self.config.rotary_dim
        if rotated == self.config.head_dim:
            return self.row_ops.rotary(q, k, cos, sin, tables)
        q_rot, k_rot = self.row_ops.rotary(q[..., :rotated].contiguous(), k[..., :rotated].contiguous(), cos, sin,
                                           tables)
        return torch.cat((q_rot, q[..., rotated:]), dim=-1), torch.cat((k_rot, k[..., rotated:]), dim=-1)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [S, D] -> float32 logits [S, V] (soft-capped where the family caps them)."""
        logits = self.row_ops.linear(hidden, self.weights.lm_head).float()
        cap = self.config.traits.final_logit_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def _attention(self, q: torch.Tensor, kv_layer: torch.Tensor, tables: torch.Tensor, batch: AttentionBatch,
                   window: int | None, keys: ops.DecodeKeys | None) -> torch.Tensor:
        if self.deterministic:
            return ops.invariant_attention(
                q, kv_layer, tables, batch.cu_seqlens_q, batch.context_lens, self.scale, window
            )
        if batch.is_prefill:
            return ops.prefill_attention(q, kv_layer, tables, batch.cu_seqlens_q, batch.context_lens, self.scale,
                                         window)
        return ops.decode_attention(q, kv_layer, tables, batch.context_lens, self.scale, keys, window)
