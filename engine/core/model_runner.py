"""Runs one scheduled step through the model: builds the step's tensors, runs the forward pass,
and samples one token per sequence (with its log-probabilities where the request asked) — or, for a decode
sequence with draft tokens (`speculation`), one per position it verifies, keeping those its draft earned."""

import time
from dataclasses import dataclass, field

import torch

from fleetctl.domain import Phase
from fleetctl.engine.core.grammar import Grammars
from fleetctl.engine.core.kv_cache import KVCache
from fleetctl.engine.core.logits_shaping import MaskJob
from fleetctl.engine.core.logprobs import token_logprobs
from fleetctl.engine.core.output import TokenLogprobs
from fleetctl.engine.core.sampler import sample
from fleetctl.engine.core.scheduler import ScheduledStep
from fleetctl.engine.core.sequence import Sequence
from fleetctl.engine.core.speculation import accepted
from fleetctl.engine.model.attention_batch import AttentionBatch
from fleetctl.engine.model.compiled_decode import CompiledDecoder
from fleetctl.engine.model.decoder import DecoderModel


@dataclass(frozen=True)
class StepStats:
    phase: Phase
    request_ids: tuple[str, ...]  # the step's sequences, in order
    num_seqs: int
    num_tokens: int  # tokens run through the model
    context_tokens: int  # keys attended over, summed across sequences
    seconds: float
    new_tokens: tuple[int, ...]  # per sequence: tokens run this step (computed; the cost model charges these)
    context_lens: tuple[int, ...]  # per sequence: keys attended over (cached + new)
    cached_tokens: tuple[int, ...]  # per sequence: prompt tokens served from the prefix cache (0 in decode)
    # by request id: of those, the tokens a KV tier served, by tier (set by the engine, which owns the tiers)
    tier_tokens: dict[str, dict[str, int]] = field(default_factory=dict)
    mask_seconds: dict[str, float] = field(default_factory=dict)  # by request id: its grammar mask's compute time
    drafted: tuple[int, ...] = ()  # per sequence: draft tokens the step verified (speculation; () in prefill)
    accepted: tuple[int, ...] = ()  # per sequence: of those, the ones kept


class ModelRunner:
    """`decoder`, when given, runs the decode steps (compiled); prefill steps always run eagerly. `grammars`
    masks the constrained sequences' tokens (their masks computed while the forward pass runs)."""

    def __init__(self, model: DecoderModel, kv_cache: KVCache, grammars: Grammars,
                 decoder: CompiledDecoder | None = None) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.grammars = grammars
        self.decoder = decoder
        self.block_size = kv_cache.spec.block_size

    def run(self, step: ScheduledStep) -> tuple[list[list[int]], list[list[TokenLogprobs | None]], StepStats]:
        """Per sequence the tokens it gained — one sampled token, more where a draft was verified, none where a
        prefill chunk leaves more of its prompt — and their logprobs (None where not asked)."""
        compiled = self.decoder is not None and step.phase is Phase.DECODE
        # a compiled graph mutates the pool in place, which inference mode's tensors do not allow to be traced
        with torch.inference_mode(not compiled), torch.no_grad():
            return self._run(step, compiled)

    def _run(self, step: ScheduledStep, compiled: bool) -> tuple[list[list[int]], list[list[TokenLogprobs | None]],
                                                                  StepStats]:
        start = time.perf_counter()
        seqs = step.seqs
        decode = step.phase is Phase.DECODE
        input_ids, positions, batch = self._prepare(step)
        draws = _draws(step)
        draw_seqs = [seqs[i] for i, _, _ in draws]
        masks = MaskJob(self.grammars, draw_seqs)
        if compiled and self.decoder:  # (a model with windowed layers kept apart decodes eagerly)
            hidden = self.decoder.forward(input_ids, positions, batch, self.kv_cache.tensor)
        else:
            hidden = self.model.forward(input_ids, positions, batch, self.kv_cache.layers)
        tokens: list[list[int]] = [[] for _ in seqs]
        logprobs: list[list[TokenLogprobs | None]] = [[] for _ in seqs]
        if draws:
            logits = self.model.logits(hidden[[row for _, row, _ in draws]])  # [R, V]: the rows that draw a token
            drawn = sample(logits, draw_seqs, self.grammars.eos_token_ids, masks, [at for _, _, at in draws])
            for (i, _, _), token, token_logprobs_ in zip(draws, drawn, token_logprobs(logits, draw_seqs, drawn),
                                                         strict=True):
                tokens[i].append(token)
                logprobs[i].append(token_logprobs_)
        drafted = tuple(len(seq.draft_token_ids) for seq in seqs) if decode else ()
        for i, seq in enumerate(seqs):
            if decode and seq.draft_token_ids:
                tokens[i] = accepted(seq.draft_token_ids, tokens[i])
                logprobs[i] = logprobs[i][:len(tokens[i])]
        kept = tuple(len(new) - 1 for new in tokens) if decode else ()
        context_lens = tuple(s.num_cached_tokens + n for s, n in zip(seqs, step.chunks, strict=True))
        for seq, n in zip(seqs, step.chunks, strict=True):
            if not decode:  # a decode's: the engine's, once it appended the tokens it keeps (a draft's may not stand)
                seq.num_cached_tokens += n
            seq.draft_token_ids = []
        stats = StepStats(
            phase=step.phase,
            request_ids=tuple(s.request_id for s in seqs),
            num_seqs=len(seqs),
            num_tokens=int(input_ids.shape[0]),
            context_tokens=sum(context_lens),
            seconds=time.perf_counter() - start,
            new_tokens=tuple(step.chunks),
            context_lens=context_lens,
            cached_tokens=tuple(step.cache_hits),
            mask_seconds=masks.seconds,
            drafted=drafted,
            accepted=kept,
        )
        return tokens, logprobs, stats

    def _prepare(self, step: ScheduledStep) -> tuple[torch.Tensor, torch.Tensor, AttentionBatch]:
        """The step's flat inputs: token ids [T], positions [T] and the attention batch (T = sum of chunks)."""
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        window_slots: list[int] = []
        apart = self.kv_cache.allocator.window is not None  # windowed layers keep their K/V apart
        cu_seqlens = [0]
        context_lens = []
        bs = self.block_size
        decode = step.phase is Phase.DECODE
        rows: list[Sequence] = []  # the sequence of each attention row
        for seq, chunk in zip(step.seqs, step.chunks, strict=True):
            start = seq.num_cached_tokens
            ids += (seq.token_ids + seq.draft_token_ids if decode else seq.token_ids)[start : start + chunk]
            span = range(start, start + chunk)
            positions += span
            table = seq.block_table
            slots += [table[p // bs] * bs + p % bs for p in span]
            if apart:
                window_slots += [seq.window_table[p // bs] * bs + p % bs for p in span]
            # a decode step's drafted positions attend as rows of their own, each to the keys up to it
            for end in ([p + 1 for p in span] if decode else [start + chunk]):
                rows.append(seq)
                cu_seqlens.append(cu_seqlens[-1] + (1 if decode else chunk))
                context_lens.append(end)
        width = max(len(s.block_table) for s in step.seqs)
        tables = [s.block_table + [0] * (width - len(s.block_table)) for s in rows]
        device = self.model.device
        batch = AttentionBatch(
            is_prefill=not decode,
            slots=torch.tensor(slots, dtype=torch.int64, device=device),
            # a dropped block (kv_window, -1) goes in as block 0: never read, every layer's window starts after it
            block_tables=torch.tensor(tables, dtype=torch.int32, device=device).clamp_(min=0),
            context_lens=torch.tensor(context_lens, dtype=torch.int32, device=device),
            cu_seqlens_q=torch.tensor(cu_seqlens, dtype=torch.int32, device=device),
        )
        if apart:  # a block without a window slot (NO_SLOT, -1) goes in as slot 0: the layer's window starts after it
            window_tables = [s.window_table + [0] * (width - len(s.window_table)) for s in rows]
            batch.window_slots = torch.tensor(window_slots, dtype=torch.int64, device=device)
            batch.window_tables = torch.tensor(window_tables, dtype=torch.int32, device=device).clamp_(min=0)
        return (
            torch.tensor(ids, dtype=torch.int64, device=device),
            torch.tensor(positions, dtype=torch.int64, device=device),
            batch,
        )


def _draws(step: ScheduledStep) -> list[tuple[int, int, int]]:
    """The step's token draws: (sequence index, its row of the forward's output, the output position it draws for:
    the sampler's seed). A prefill draws at a sequence's last position, once its chunk completes the prompt; a
    decode at every position it computes, drafts included."""
    draws, row = [], 0
    for i, (seq, chunk) in enumerate(zip(step.seqs, step.chunks, strict=True)):
        if step.phase is Phase.DECODE:
            draws += [(i, row + j, len(seq.output_token_ids) + j) for j in range(chunk)]
            row += chunk
        else:
            row += chunk
            if step.completes(i):
                draws.append((i, row - 1, len(seq.output_token_ids)))
    return draws
