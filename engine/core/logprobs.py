"""Log-probabilities of the sampled tokens, for the requests that asked for them (`SamplingParams.logprobs`).

They are taken from the model's raw logits — before temperature, top-k and top-p — which is what vLLM
reports by default and what a client compares against another implementation of the same model. A step
with no such request computes nothing here."""

import torch

from fleetctl.engine.core.output import TokenLogprobs
from fleetctl.engine.core.sequence import Sequence


def token_logprobs(logits: torch.Tensor, seqs: list[Sequence], tokens: list[int]) -> list[TokenLogprobs | None]:
    """logits: [B, V], row i for seqs[i], which sampled tokens[i] -> per row its logprobs, or None
    where the request did not ask."""
    rows = [i for i, seq in enumerate(seqs) if seq.params.logprobs is not None]
    out: list[TokenLogprobs | None] = [None] * len(seqs)
    if not rows:
        return out
    index = torch.tensor(rows, device=logits.device)
    logprobs = torch.log_softmax(logits.index_select(0, index).float(), dim=-1)  # [R, V]
    chosen = torch.tensor([tokens[i] for i in rows], device=logits.device)
    picked = logprobs.gather(1, chosen[:, None])[:, 0].tolist()  # [R]
    k = max(seqs[i].params.logprobs or 0 for i in rows)
    top_values, top_ids = logprobs.topk(k, dim=-1) if k else (logprobs[:, :0], logprobs[:, :0].long())  # [R, k]
    for i, value, values, ids in zip(rows, picked, top_values.tolist(), top_ids.tolist(), strict=True):
        wanted = seqs[i].params.logprobs or 0
        out[i] = TokenLogprobs(value, tuple(zip(ids[:wanted], values[:wanted], strict=True)))
    return out
