"""Tokenizer from a Hugging Face directory (tokenizer.json + tokenizer_config.json), chat template
rendering, and incremental detokenization for streaming."""

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders

from fleetctl.errors import UserError


class TokenizerError(UserError):
    """Missing or unusable tokenizer files, or a chat that the template cannot render."""


def _token_text(value: object) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _raise_exception(message: str) -> None:
    raise TokenizerError(f"chat template: {message}")


def _byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE's stand-ins (GPT-2's scheme): printable Latin-1 bytes stand for themselves, every
    other byte for the next code point from 256 on. Maps each stand-in character to its byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {chr(b): b for b in printable} | {chr(256 + i): b for i, b in enumerate(others)}


BYTE_LEVEL = _byte_level_alphabet()


def _tojson(value: object, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """JSON as the templates' authors expect it (transformers' filter): no HTML escaping, unlike Jinja's own."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _template_environment() -> ImmutableSandboxedEnvironment:
    """The names and filters chat templates use, as transformers provides them (Llama 3.x's read the date)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


class Tokenizer:
    def __init__(self, model_dir: Path, eos_token_ids: tuple[int, ...] = ()) -> None:
        path = model_dir / "tokenizer.json"
        if not path.exists():
            raise TokenizerError(f"{model_dir}: tokenizer.json is missing")
        self._tok = HFTokenizer.from_file(str(path))
        config_path = model_dir / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.exists() else {}
        self.bos_token = _token_text(config.get("bos_token"))
        self.eos_token = _token_text(config.get("eos_token"))
        self.bos_token_id = self._tok.token_to_id(self.bos_token) if self.bos_token else None
        self.add_bos = bool(config.get("add_bos_token", False)) and self.bos_token_id is not None
        eos = set(eos_token_ids)
        if self.eos_token and self._tok.token_to_id(self.eos_token) is not None:
            eos.add(self._tok.token_to_id(self.eos_token))
        self.eos_token_ids = frozenset(eos)
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: take the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        self.chat_template: str | None = template

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()

    def to_json(self) -> str:
        """The whole tokenizer as tokenizer.json holds it (the grammar matcher builds its own from it)."""
        return self._tok.to_str()

    def encode(self, text: str) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=False).ids
        if self.add_bos and (not ids or ids[0] != self.bos_token_id):
            ids = [self.bos_token_id, *ids]
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_bytes(self, token_id: int) -> bytes:
        """One token's own bytes: part of a multi-byte character, when the tokenizer splits one (byte-level
        BPE), where decoding it alone would give U+FFFD."""
        piece = self._tok.id_to_token(token_id) or ""
        if isinstance(self._tok.decoder, decoders.ByteLevel) and piece and all(c in BYTE_LEVEL for c in piece):
            return bytes(BYTE_LEVEL[c] for c in piece)
        return self.decode([token_id], skip_special_tokens=False).encode()

    def apply_chat_template(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                            add_generation_prompt: bool = True) -> str:
        """`tools`: OpenAI tool dicts (`{"type": "function", "function": {...}}`), handed to the template as
        transformers does; messages may carry `tool_calls` (arguments as dicts), `tool_call_id` and `name`."""
        if not self.chat_template:
            raise TokenizerError("this model has no chat template (tokenizer_config.json)")
        try:
            return _template_environment().from_string(self.chat_template).render(
                messages=messages,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token or "",
                eos_token=self.eos_token or "",
            )
        except TemplateError as exc:
            raise TokenizerError(f"chat template: {exc}") from None


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas without splitting multi-byte characters.

    Decodes a short window of recent tokens and emits only what the newest tokens add; a trailing
    U+FFFD means a character is still incomplete, so nothing is emitted until it is.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self.text = ""

    def push(self, token_id: int) -> str:
        self._ids.append(token_id)
        decode = self._tokenizer.decode
        prefix = decode(self._ids[self._prefix_offset : self._read_offset])
        full = decode(self._ids[self._prefix_offset :])
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return ""
        return self._emit(full[len(prefix) :])

    def finish(self) -> str:
        """What the last tokens add once no more will come, an incomplete character's U+FFFD included (as a
        decode of every token gives it)."""
        decode = self._tokenizer.decode
        prefix = decode(self._ids[self._prefix_offset : self._read_offset])
        full = decode(self._ids[self._prefix_offset :])
        return self._emit(full[len(prefix) :]) if len(full) > len(prefix) else ""

    def _emit(self, delta: str) -> str:
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        self.text += delta
        return delta
