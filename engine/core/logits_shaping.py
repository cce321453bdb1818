"""What a request asks of its logits before a token is drawn, in vLLM's order: `logit_bias`, `min_tokens`
(EOS refused), the repetition penalty, the presence and frequency penalties, then the grammar's mask.

The grammar's masks are computed on a helper thread while the model runs the step (`MaskJob`): llguidance
releases the GIL, so on a CPU worker the mask costs the step what the forward pass leaves of a core."""

import time
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from fleetctl.engine.core.grammar import Grammars
from fleetctl.engine.core.sequence import Sequence

BITS = 32  # tokens per bitmask word
_mask_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-mask")


class MaskJob:
    """The allowed tokens of the step's constrained rows, computed in the background: `rows` index the step's
    sampling sequences; `result()` is their bitmask, [len(rows), ceil(V / 32)] int32 on the CPU."""

    def __init__(self, grammars: Grammars, seqs: list[Sequence]) -> None:
        self.rows = [i for i, seq in enumerate(seqs) if seq.params.grammar is not None]
        self.seconds: dict[str, float] = {}  # by request id: its mask's compute time (its matcher's catch-up too)
        self._future: Future[torch.Tensor] | None = None
        if self.rows:
            words = (grammars.vocab_size + BITS - 1) // BITS
            bitmask = torch.zeros(len(self.rows), words, dtype=torch.int32)
            self._future = _mask_thread.submit(self._fill, grammars, [seqs[i] for i in self.rows], bitmask)

    def result(self) -> torch.Tensor | None:
        return self._future.result() if self._future is not None else None


    def _fill(self, grammars: Grammars, seqs: list[Sequence], bitmask: torch.Tensor) -> torch.Tensor:
        row_bytes = bitmask.shape[1] * bitmask.element_size()
        for row, seq in enumerate(seqs):
            start = time.perf_counter()
            grammars.fill_mask(seq, bitmask.data_ptr() + row * row_bytes, row_bytes)
            self.seconds[seq.request_id] = time.perf_counter() - start
        return bitmask


def allowed_tokens(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """bitmask: [R, W] int32 -> [R, vocab] bool, True where the token is allowed."""
    shifts = torch.arange(BITS, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1  # [R, W, 32]
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab].bool()


def shape_logits(logits: torch.Tensor, seqs: list[Sequence], eos_token_ids: frozenset[int],
                 masks: MaskJob | None = None) -> torch.Tensor:
    """logits: [B, V] float32, row i for seqs[i] -> the logits to draw from: a copy where any row is shaped,
    `logits` itself where none is (the caller's raw logits stay raw for logprobs)."""
    shaped_rows = [i for i, seq in enumerate(seqs) if seq.params.shapes_logits]
    if not shaped_rows:
        return logits
    out = logits.clone()
    allowed = _grammar_allowed(masks, out.shape[1], out.device)
    for i in shaped_rows:
        row = out[i]
        params, seq = seqs[i].params, seqs[i]
        if params.logit_bias:
            ids = torch.tensor([t for t, _ in params.logit_bias if t < row.shape[0]], device=row.device)
            bias = torch.tensor([b for t, b in params.logit_bias if t < row.shape[0]], device=row.device)
            row.index_add_(0, ids, bias)
        grammar_allowed = allowed.get(i)
        if len(seq.output_token_ids) < params.min_tokens and not _only_eos(grammar_allowed, eos_token_ids):
            row[[t for t in eos_token_ids if t < row.shape[0]]] = float("-inf")
        _penalize(row, seq)
        if grammar_allowed is not None:
            row.masked_fill_(~grammar_allowed, float("-inf"))
    return out


def _grammar_allowed(masks: MaskJob | None, vocab: int, device: torch.device) -> dict[int, torch.Tensor]:
    bitmask = masks.result() if masks is not None else None
    if bitmask is None:
        return {}
    allowed = allowed_tokens(bitmask, vocab).to(device, non_blocking=True)  # [R, V]
    return {row: allowed[r] for r, row in enumerate(masks.rows)}  # type: ignore[union-attr]


def _only_eos(allowed: torch.Tensor | None, eos_token_ids: frozenset[int]) -> bool:
    """Whether the grammar is complete (it allows nothing but EOS): min_tokens then yields to it."""
    if allowed is None:
        return False
    rest = allowed.clone()
    rest[[t for t in eos_token_ids if t < rest.shape[0]]] = False
    return not bool(rest.any())


def _penalize(row: torch.Tensor, seq: Sequence) -> None:
    """row: [V] float32, in place. Repetition (over prompt and output), then presence and frequency (output)."""
    params = seq.params
    vocab = row.shape[0]
    if params.repetition_penalty != 1.0:
        seen = torch.tensor(sorted({t for t in seq.token_ids if t < vocab}), dtype=torch.long, device=row.device)
        values = row[seen]
        row[seen] = torch.where(values > 0, values / params.repetition_penalty, values * params.repetition_penalty)
    if (params.presence_penalty or params.frequency_penalty) and seq.output_token_ids:
        outputs = torch.tensor([t for t in seq.output_token_ids if t < vocab], dtype=torch.long, device=row.device)
        counts = torch.bincount(outputs, minlength=vocab).to(row.dtype)  # [V]
        row -= counts * params.frequency_penalty + (counts > 0).to(row.dtype) * params.presence_penalty
