"""Runs one scheduled step through the model: builds the step's tensors, runs the forward pass,
and samples one token per sequence (with its log-probabilities where the request asked)."""

import time
from dataclasses import dataclass

import torch

from fleetctl.engine.core.kv_cache import KVCache
from fleetctl.engine.core.logprobs import token_logprobs
from fleetctl.engine.core.output import TokenLogprobs
from fleetctl.engine.core.sampler import sample
from fleetctl.engine.core.scheduler import ScheduledStep
from fleetctl.engine.core.sequence import Sequence
from fleetctl.engine.model.llama import AttentionBatch, LlamaModel
from fleetctl.store.records import Phase


@dataclass(frozen=True)
class StepStats:
    phase: Phase
    num_seqs: int
    num_tokens: int  # tokens run through the model
    context_tokens: int  # keys attended over, summed across sequences
    seconds: float
    new_tokens: tuple[int, ...]  # per sequence: tokens run this step (computed; the cost model charges these)
    context_lens: tuple[int, ...]  # per sequence: keys attended over (cached + new)
    cached_tokens: tuple[int, ...]  # per sequence: prompt tokens served from the prefix cache (0 in decode)


class ModelRunner:
    def __init__(self, model: LlamaModel, kv_cache: KVCache) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.block_size = kv_cache.spec.block_size

    @torch.inference_mode()
    def run(self, step: ScheduledStep) -> tuple[list[int], list[TokenLogprobs | None], StepStats]:
        start = time.perf_counter()
        seqs = step.seqs
        is_prefill = step.phase is Phase.PREFILL
        input_ids, positions, batch = self._prepare(seqs, is_prefill)
        hidden = self.model.forward(input_ids, positions, batch, self.kv_cache.tensor)
        if is_prefill:
            hidden = hidden[batch.cu_seqlens_q[1:].long() - 1]
        logits = self.model.logits(hidden)
        tokens = sample(logits, seqs)
        logprobs = token_logprobs(logits, seqs, tokens)
        new_tokens = tuple(s.num_tokens - s.num_cached_tokens for s in seqs)
        cached_tokens = tuple(s.num_cached_tokens if is_prefill else 0 for s in seqs)
        context_lens = tuple(s.num_tokens for s in seqs)
        for seq in seqs:
            seq.num_cached_tokens = seq.num_tokens
        stats = StepStats(
            phase=step.phase,
            num_seqs=len(seqs),
            num_tokens=int(input_ids.shape[0]),
            context_tokens=sum(context_lens),
            seconds=time.perf_counter() - start,
            new_tokens=new_tokens,
            context_lens=context_lens,
            cached_tokens=cached_tokens,
        )
        return tokens, logprobs, stats

    def _prepare(
        self, seqs: list[Sequence], is_prefill: bool
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionBatch]:
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        cu_seqlens = [0]
        bs = self.block_size
        for seq in seqs:
            start = seq.num_cached_tokens if is_prefill else seq.num_tokens - 1
            tokens = seq.token_ids[start:] if is_prefill else [seq.last_token_id]
            ids += tokens
            span = range(start, start + len(tokens))
            positions += span
            table = seq.block_table
            slots += [table[p // bs] * bs + p % bs for p in span]
            cu_seqlens.append(len(ids))
        width = max(len(s.block_table) for s in seqs)
        tables = [s.block_table + [0] * (width - len(s.block_table)) for s in seqs]
        device = self.model.device
        batch = AttentionBatch(
            is_prefill=is_prefill,
            slots=torch.tensor(slots, dtype=torch.int64, device=device),
            block_tables=torch.tensor(tables, dtype=torch.int32, device=device),
            context_lens=torch.tensor([s.num_tokens for s in seqs], dtype=torch.int32, device=device),
            cu_seqlens_q=torch.tensor(cu_seqlens, dtype=torch.int32, device=device),
        )
        return (
            torch.tensor(ids, dtype=torch.int64, device=device),
            torch.tensor(positions, dtype=torch.int64, device=device),
            batch,
        )
