"""The model a fleet serves, as the server asks about it: its vocabulary, its tokenizer (text ⇄ tokens, the chat
template, a token's bytes) and its grammars (checked before a request is admitted). `Fleet` is one: the server's
OpenAI routes call these, never the tokenizer itself."""

from typing import Any

from fleetctl.engine.core.grammar import Grammars
from fleetctl.engine.model.model_config import ModelConfig
from fleetctl.engine.model.tokenizer import Tokenizer


class ServedModel:
    model_config: ModelConfig
    tokenizer: Tokenizer
    grammars: Grammars

    @property
    def vocab_size(self) -> int:
        return self.model_config.vocab_size

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids)

    def chat_prompt(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        """The messages (and OpenAI tool dicts) through the model's chat template (raises TokenizerError)."""
        return self.tokenizer.apply_chat_template(messages, tools)

    @property
    def chat_template(self) -> str | None:
        return self.tokenizer.chat_template

    def token_bytes(self, token_id: int) -> bytes:
        return self.tokenizer.token_bytes(token_id)

    def compile_grammar(self, grammar: str) -> float:  # seconds (0.0 cached); GrammarError if workers can't use it
        return self.grammars.compile(grammar).seconds
