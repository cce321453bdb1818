"""Next-token choice per sequence: greedy, or temperature / top-k / top-p drawn from a generator
seeded with (the sequence's seed, the output position). A seeded request therefore draws the same
tokens whatever it is batched with, and continues identically after a handoff or a recompute. Both draw
from the logits as the request shaped them (penalties, bias, its grammar's mask: logits_shaping)."""

import torch

from fleetctl.engine.core.logits_shaping import MaskJob, shape_logits
from fleetctl.engine.core.sequence import Sequence

_MIX = 0x9E3779B97F4A7C15  # odd 64-bit constant: spreads (seed, position) over the seed space


def position_seed(seed: int, position: int) -> int:
    return (seed * _MIX + position) % (1 << 63)


def sample(logits: torch.Tensor, seqs: list[Sequence], eos_token_ids: frozenset[int] = frozenset(),
           masks: MaskJob | None = None, positions: list[int] | None = None) -> list[int]:
    """logits: [B, V] float32, row i for seqs[i] -> one token id per row. `masks`: the grammar rows' masks;
    `positions`: the output position each row draws for (default: the sequence's next; a verified draft's rows
    draw for the positions after it)."""
    logits = shape_logits(logits, seqs, eos_token_ids, masks)
    choices = logits.argmax(dim=-1).tolist()
    generator: torch.Generator | None = None
    for row, seq in enumerate(seqs):
        if not seq.params.greedy:
            generator = generator or torch.Generator()
            position = len(seq.output_token_ids) if positions is None else positions[row]
            generator.manual_seed(position_seed(seq.seed, position))
            choices[row] = _sample_row(logits[row], seq, generator)
    return choices


def _sample_row(logits: torch.Tensor, seq: Sequence, generator: torch.Generator) -> int:
    """logits: [V] float32."""
    params = seq.params
    logits = logits.cpu() / params.temperature
    if 0 < params.top_k < logits.shape[0]:
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(-1)
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        # keep the smallest prefix whose mass reaches top_p (always at least one token)
        drop = sorted_probs.cumsum(-1) - sorted_probs >= params.top_p
        sorted_probs[drop] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return int(torch.multinomial(probs, 1, generator=generator))
