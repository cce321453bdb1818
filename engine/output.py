"""Per-request output bookkeeping: incremental text, stop conditions, streamed deltas."""

from dataclasses import dataclass

from fleetctl.engine.model.tokenizer import IncrementalDetokenizer, Tokenizer
from fleetctl.engine.sequence import FinishReason, Sequence


@dataclass(frozen=True)
class RequestOutput:
    request_id: str
    token_id: int
    text_delta: str  # new text safe to show; never contains (part of) a stop string
    finished: bool
    finish_reason: FinishReason | None


class RequestState:
    """Decides when a sequence is done, and what text a client may see so far.

    Text that could still turn out to be the start of a stop string is held back until it cannot.
    """

    def __init__(self, seq: Sequence, tokenizer: Tokenizer, eos_token_ids: frozenset[int], max_len: int) -> None:
        self.seq = seq
        self._detok = IncrementalDetokenizer(tokenizer)
        self._eos = frozenset() if seq.params.ignore_eos else eos_token_ids
        self._max_len = max_len
        self._holdback = max((len(s) for s in seq.params.stop), default=1) - 1
        self._sent = 0
        self.text = ""

    def on_token(self, token_id: int) -> RequestOutput:
        seq = self.seq
        reason: FinishReason | None = None
        if token_id in self._eos:
            reason = FinishReason.STOP
        else:
            self._detok.push(token_id)
            self.text = self._detok.text
            stop_at = self._find_stop()
            if stop_at is not None:
                self.text = self.text[:stop_at]
                reason = FinishReason.STOP
        if reason is None and (len(seq.output_token_ids) >= seq.params.max_tokens or seq.num_tokens >= self._max_len):
            reason = FinishReason.LENGTH
        visible = len(self.text) if reason else max(self._sent, len(self.text) - self._holdback)
        delta = self.text[self._sent : visible]
        self._sent = visible
        return RequestOutput(seq.request_id, token_id, delta, reason is not None, reason)

    def _find_stop(self) -> int | None:
        # only the tail can hold a stop string that the newest token completed
        window_start = max(0, self._sent - self._holdback - 1)
        hits = [i for s in self.seq.params.stop if (i := self.text.find(s, window_start)) >= 0]
        return min(hits) if hits else None
