"""Next-token choice per sequence: greedy, or temperature / top-k / top-p with the sequence's own
generator, so a seeded request draws the same tokens whatever it is batched with."""

import torch
from fleetctl.engine.sequence import SamplingParams


def sample(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> list[int]:
    """logits: [B, V] float32 -> one token id per row."""
    choices = logits.argmax(dim=-1).tolist()
    for row, (p, gen) in enumerate(zip(params, generators, strict=True)):
        if not p.greedy:
            choices[row] = _sample_row(logits[row], p, gen)
    return choices


def _sample_row(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """logits: [V] float32."""
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
