"""What a request's client sees: token-level finish conditions, the streamed text, and a finished
request's result (`generate`)."""

from dataclasses import dataclass

from fleetctl.engine.core.sequence import FinishReason, Sequence
from fleetctl.engine.model.tokenizer import IncrementalDetokenizer, Tokenizer


@dataclass(frozen=True)
class TokenLogprobs:
    """A sampled token's log-probability under the model (log-softmax of its raw logits: before
    temperature, top-k and top-p, as vLLM reports by default) and the most likely tokens', best first."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token id, logprob)


@dataclass(frozen=True)
class RequestOutput:
    request_id: str
    token_id: int
    text_delta: str  # new text safe to show; never (part of) a stop string; "" when not detokenizing
    finished: bool
    finish_reason: FinishReason | None
    logprobs: TokenLogprobs | None = None  # only for a request that asked (SamplingParams.logprobs)


def token_finish_reason(seq: Sequence, eos_token_ids: frozenset[int], max_len: int) -> FinishReason | None:
    """Finish conditions that need only token ids (checked where the sequence runs)."""
    if not seq.params.ignore_eos and seq.output_token_ids[-1] in eos_token_ids:
        return FinishReason.STOP
    if len(seq.output_token_ids) >= seq.params.max_tokens or seq.num_tokens >= max_len:
        return FinishReason.LENGTH
    return None


class TextStream:
    """Incremental text of one request, with stop strings.

    Text that could still turn out to be the start of a stop string is held back until it cannot.
    EOS tokens add no text.
    """

    def __init__(self, tokenizer: Tokenizer, stop: tuple[str, ...], eos_token_ids: frozenset[int]) -> None:
        self._detok = IncrementalDetokenizer(tokenizer)
        self._stop = stop
        self._eos = eos_token_ids
        self._holdback = max((len(s) for s in stop), default=1) - 1
        self._sent = 0
        self.text = ""
        self.stopped = False

    def push(self, token_id: int) -> str:
        """Adds a token; returns the text delta now safe to show. Sets `stopped` on a stop string."""
        if self.stopped or token_id in self._eos:
            return ""
        self._detok.push(token_id)
        self.text = self._detok.text
        stop_at = self._find_stop()
        if stop_at is not None:
            self.text = self.text[:stop_at]
            self.stopped = True
            return self.flush()
        visible = max(self._sent, len(self.text) - self._holdback)
        delta = self.text[self._sent : visible]
        self._sent = visible
        return delta

    def flush(self) -> str:
        """The held-back rest, once the request has finished (with an incomplete last character's U+FFFD)."""
        if not self.stopped:
            self._detok.finish()
            self.text = self._detok.text
        delta = self.text[self._sent :]
        self._sent = len(self.text)
        return delta

    def _find_stop(self) -> int | None:
        # a stop string completed by the newest token starts at or after the text already sent
        hits = [i for s in self._stop if (i := self.text.find(s, self._sent)) >= 0]
        return min(hits) if hits else None


@dataclass(frozen=True)
class GenerationResult:
    request_id: str
    text: str
    token_ids: list[int]
    finish_reason: str
    prompt_tokens: int
    ttft_s: float
    decode_tokens_per_s: float


def result_of(seq: Sequence, stream: TextStream | None) -> GenerationResult:
    first, last = seq.first_token_time or seq.arrival_time, seq.last_token_time or seq.arrival_time
    decoded = len(seq.output_token_ids) - 1
    return GenerationResult(
        request_id=seq.request_id,
        text=stream.text if stream else "",
        token_ids=list(seq.output_token_ids),
        finish_reason=seq.finish_reason.value if seq.finish_reason else "abort",
        prompt_tokens=len(seq.prompt_token_ids),
        ttft_s=first - seq.arrival_time,
        decode_tokens_per_s=decoded / (last - first) if decoded > 0 and last > first else 0.0,
    )
