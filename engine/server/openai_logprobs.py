"""Logprobs in OpenAI's two shapes, from the fleet's per-token `TokenLogprobs`:

- completions: `{"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}` — each
  `top_logprobs` entry holds the k most likely tokens and the sampled one (so up to k + 1 entries, as vLLM);
- chat: `{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}`.

Token strings are each token decoded alone (a piece of a multi-byte character reads U+FFFD; `bytes`
holds its real bytes). Values are the raw model's (see core/logprobs.py)."""

from collections.abc import Callable
from functools import lru_cache

from fleetctl.engine.core.output import TokenLogprobs

TOKEN_CACHE = 65536  # token ids whose text and bytes are kept (a vocabulary's hot part)
SampledToken = tuple[int, TokenLogprobs]  # (sampled token id, its logprobs)


class LogprobsFormat:
    def __init__(self, token_bytes: Callable[[int], bytes]) -> None:
        """`token_bytes`: a token id's bytes, as the model's tokenizer has them."""
        self._bytes = lru_cache(maxsize=TOKEN_CACHE)(token_bytes)

    def text(self, token_id: int) -> str:
        return self._bytes(token_id).decode(errors="replace")

    def completion(self, tokens: list[SampledToken], text_offset: int) -> dict:
        """`text_offset`: where the first token's text starts in the choice's text (after an echoed prompt,
        or after the tokens of earlier chunks)."""
        texts = [self.text(token_id) for token_id, _ in tokens]
        offsets = []
        for text in texts:
            offsets.append(text_offset)
            text_offset += len(text)
        return {
            "tokens": texts,
            "token_logprobs": [lp.logprob for _, lp in tokens],
            "top_logprobs": [{self.text(t): v for t, v in lp.top} | {text: lp.logprob}
                             for text, (_, lp) in zip(texts, tokens, strict=True)],
            "text_offset": offsets,
        }

    def chat(self, tokens: list[SampledToken]) -> dict:
        return {"content": [self._chat_entry(token_id, lp.logprob) | {
            "top_logprobs": [self._chat_entry(t, v) for t, v in lp.top]} for token_id, lp in tokens]}

    def _chat_entry(self, token_id: int, logprob: float) -> dict:
        raw = self._bytes(token_id)
        return {"token": raw.decode(errors="replace"), "logprob": logprob, "bytes": list(raw)}
