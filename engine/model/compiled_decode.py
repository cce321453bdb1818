"""The decode step compiled (`torch.compile`, inductor), once per batch-size bucket: a decoder layer — norms,
QKV, rotary, the KV store, attention, MLP — is one graph, which every layer runs with its own weights and
KV. Eager decode on a CPU spends a quarter of each step dispatching ~35 small ops per layer; compiled, the
elementwise ops fuse into a few loops around the matmuls. One graph per layer, not one for the whole
step: a whole 30-layer step of smollm2 had not finished compiling cold after 8 minutes on 2 cores; per layer,
five buckets compile in about 35 s cold and 6–7 s from inductor's cache.

A step of B sequences runs in the smallest bucket >= B; the padding rows decode token 0 at position 0
into the pool's scratch block (never allocated to a sequence) and attend only to it. Block tables are
padded to a width of at least MIN_WIDTH blocks; the width and the number of keys attended over are
dynamic dimensions of the graph, so a growing context does not recompile. Sampling stays outside (the runner's).
"""

import torch
import torch.nn.functional as F

from fleetctl.engine.model.attention_batch import AttentionBatch
from fleetctl.engine.model.decoder import DecoderModel
from fleetctl.engine.model.families.base import Traits
from fleetctl.engine.model.model_config import ModelConfig
from fleetctl.kernels.rotary import rotary_ref

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
MIN_WIDTH = 2  # a width of 1 would be specialised into a graph of its own (size 0/1 specialisation)
MIN_KEYS = 2  # likewise for the keys attended over (the padding rows attend to 1)


def llama_shaped(config: ModelConfig) -> bool:
    """Whether the compiled layer computes this model's layers: Llama's (no family traits, no QKV bias; any
    rope scaling, which lives in the cos/sin tables)."""
    return config.traits == Traits() and not config.attention_bias


def bucket_for(batch: int, largest: int) -> int:
    """The smallest bucket holding `batch` sequences (`largest` beyond the last bucket)."""
    return next((b for b in BATCH_BUCKETS if b >= batch), largest)


def buckets_up_to(max_num_seqs: int) -> list[int]:
    """The buckets a worker admitting at most `max_num_seqs` sequences per step can use, smallest first."""
    chosen = [b for b in BATCH_BUCKETS if b < max_num_seqs]
    return [*chosen, bucket_for(max_num_seqs, max_num_seqs)]


def _decode_layer(config: ModelConfig, scale: float, hidden: torch.Tensor, residual: torch.Tensor,
                  cos: torch.Tensor, sin: torch.Tensor, slots: torch.Tensor, block_index: torch.Tensor,
                  mask: torch.Tensor, kv_layer: torch.Tensor, input_norm: torch.Tensor, qkv_w: torch.Tensor,
                  o_w: torch.Tensor, post_norm: torch.Tensor, gate_up_w: torch.Tensor,
                  down_w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One decoder layer of a decode step: the traced function (every layer runs the same graph).
    hidden, residual: [B, D]; cos, sin: [B, d/2]; slots: [B] int64; block_index: [B * W] int64 (the block
    tables, flat); mask: [B, 1, 1, K] bool, K the longest context; kv_layer: [2, blocks, bs, Hkv, d].
    Returns (hidden, residual) for the next layer. Attention runs over exactly K keys, as the eager step
    does (more, masked, would round bf16 differently)."""
    batch = hidden.shape[0]
    heads, kv_heads, head_dim = config.num_heads, config.num_kv_heads, config.head_dim
    q_size, kv_size = heads * head_dim, kv_heads * head_dim
    key_len = mask.shape[-1]
    residual = hidden + residual
    x = F.rms_norm(residual, (residual.shape[-1],), input_norm, config.rms_norm_eps)
    q, k, v = F.linear(x, qkv_w).split((q_size, kv_size, kv_size), dim=-1)
    q, k = rotary_ref(q.view(batch, heads, head_dim), k.view(batch, kv_heads, head_dim), cos, sin)
    # one index_put_ into the layer's pool, which inductor does in place (an index_copy_ became a copy of the pool)
    flat = kv_layer.view(-1, kv_heads, head_dim)  # [2 * slots, Hkv, d]: all keys, then all values
    flat.index_put_((torch.cat((slots, slots + flat.shape[0] // 2)),),
                    torch.cat((k, v.view(batch, kv_heads, head_dim))))
    kv = kv_layer.view(2, kv_layer.shape[1], -1).index_select(1, block_index)
    kv = kv.view(2, batch, -1, kv_heads, head_dim)[:, :, :key_len].transpose(2, 3)  # [2, B, Hkv, K, d]
    rows = q.view(batch, kv_heads, heads // kv_heads, head_dim)  # a KV head's query heads as its rows
    attn = F.scaled_dot_product_attention(rows, kv[0], kv[1], attn_mask=mask, scale=scale)
    hidden = F.linear(attn.reshape(batch, q_size), o_w)
    residual = hidden + residual
    x = F.rms_norm(residual, (residual.shape[-1],), post_norm, config.rms_norm_eps)
    gate, up = F.linear(x, gate_up_w).chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, down_w), residual


class CompiledDecoder:
    """Runs decode steps of `model` through the compiled graph; `scratch_block` is a pool block no sequence
    owns (the padding rows write there)."""

    def __init__(self, model: DecoderModel, scratch_block: int, max_num_seqs: int) -> None:
        if model.deterministic:
            raise ValueError("deterministic mode runs eagerly: its batch invariance rests on fixed row tiles")
        if not llama_shaped(model.config):
            raise ValueError(
                f"the compiled decode step runs Llama-shaped layers only ({model.config.family} changes them)")
        self.model = model
        self.scratch_block = scratch_block
        self.max_num_seqs = max_num_seqs
        self.buckets = buckets_up_to(max_num_seqs)
        self._layers = [(w.input_norm, w.qkv, w.o_proj, w.post_norm, w.gate_up, w.down) for w in model.weights.layers]
        # one graph per bucket, all of one function: dynamo's default of 8 recompiles would fall back to eager
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 2 * len(BATCH_BUCKETS))
        # the eager step's numerics, so that compiled greedy tokens are the eager ones: low-precision
        # intermediates rounded where eager rounds them (bf16 between ops), and no pattern rewrites such as
        # mm + residual add into one addmm (which adds before rounding the product)
        torch._inductor.config.emulate_precision_casts = True
        torch._inductor.config.pattern_matcher = False
        self._compiled = torch.compile(_decode_layer, dynamic=False, fullgraph=True)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: AttentionBatch,
                kv_cache: torch.Tensor) -> torch.Tensor:
        """Same contract as DecoderModel.forward for a decode step: input_ids, positions [B] -> hidden [B, D]."""
        rows = input_ids.shape[0]
        padded = bucket_for(rows, max(rows, self.max_num_seqs))
        width = max(MIN_WIDTH, batch.block_tables.shape[1])
        device = input_ids.device
        tables = torch.full((padded, width), self.scratch_block, dtype=torch.int64, device=device)
        tables[:rows, : batch.block_tables.shape[1]] = batch.block_tables
        filler = padded - rows
        block_size = kv_cache.shape[3]
        slots = torch.cat((batch.slots, torch.full((filler,), self.scratch_block * block_size, device=device)))
        context_lens = batch.context_lens.long()
        hidden = self._step(
            torch.cat((input_ids, input_ids.new_zeros(filler))), torch.cat((positions, positions.new_zeros(filler))),
            slots, tables, torch.cat((context_lens, torch.ones(filler, dtype=torch.int64, device=device))),
            max(MIN_KEYS, int(context_lens.max())), kv_cache)
        return hidden[:rows]

    def _step(self, input_ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, block_tables: torch.Tensor,
              context_lens: torch.Tensor, key_len: int, kv_cache: torch.Tensor) -> torch.Tensor:
        """A padded step: input_ids, positions, slots, context_lens [Bp]; block_tables [Bp, W] -> hidden [Bp, D]."""
        model = self.model
        keys = torch.arange(key_len, device=input_ids.device)
        mask = (keys[None, :] < context_lens[:, None])[:, None, None, :]  # [Bp, 1, 1, K]
        block_index = block_tables.reshape(-1)
        torch._dynamo.mark_dynamic(mask, 3)  # contexts grow without recompiling
        torch._dynamo.mark_dynamic(block_index, 0)
        cos, sin = model.cos[positions], model.sin[positions]
        hidden = model.weights.embed[input_ids]
        residual = torch.zeros_like(hidden)
        for kv_layer, weights in zip(kv_cache, self._layers, strict=True):
            hidden, residual = self._compiled(model.config, model.scale, hidden, residual, cos, sin, slots,
                                              block_index, mask, kv_layer, *weights)
        residual = hidden + residual
        return F.rms_norm(residual, (residual.shape[-1],), model.weights.final_norm, model.config.rms_norm_eps)

    def warm_up(self, kv_cache: torch.Tensor) -> None:
        """Compile every bucket now, on padding rows (only the scratch block is written)."""
        device = kv_cache.device
        block_size = kv_cache.shape[3]

        def fill(value: int, *shape: int) -> torch.Tensor:  # a tensor each: the graph guards on aliasing
            return torch.full(shape, value, dtype=torch.int64, device=device)

        scratch, scratch_slot = self.scratch_block, self.scratch_block * block_size
        with torch.no_grad():  # the grad mode the runner steps in: the graphs guard on it
            for size in self.buckets:
                self._step(fill(0, size), fill(0, size), fill(scratch_slot, size), fill(scratch, size, MIN_WIDTH),
                           fill(1, size), MIN_KEYS, kv_cache)
