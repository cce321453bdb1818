"""A llama.cpp GGUF's tokenizer rebuilt as a `tokenizers.Tokenizer`: byte-level BPE (`gpt2`: SmolLM2, Qwen) or
SentencePiece BPE (`llama`: Gemma 3) with its byte-fallback tokens."""

from __future__ import annotations

import gguf
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from fleetctl.engine.model.gguf_params import GGUFConvertError, field

_TOKEN_TYPE_NORMAL, _TOKEN_TYPE_CONTROL, _TOKEN_TYPE_USER = 1, 3, 4
# The `tokenizer.ggml.pre` names (among Llama-architecture GGUFs) that llama.cpp splits as "each digit
# alone, then GPT-2's regex".
_DIGIT_SPLIT_PRE_TYPES = {"smollm"}
# Qwen2's pre-tokenizer regex (its tokenizer.json's Split), which llama.cpp's "qwen2" pre type reproduces
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")

_SPACE = "\u2581"  # SentencePiece's "▁"


def build_tokenizer(reader: gguf.GGUFReader) -> Tokenizer:
    """A `tokenizers.Tokenizer` equivalent to the GGUF's: byte-level BPE (`gpt2`) or SentencePiece (`llama`)."""
    model = field(reader, "tokenizer.ggml.model")
    if model == "llama":
        return _sentencepiece_tokenizer(reader)
    if model != "gpt2":
        raise GGUFConvertError(
            f"GGUF tokenizer is {model!r}; supported: byte-level BPE ('gpt2'), SentencePiece ('llama')")
    tokens: list[str] = field(reader, "tokenizer.ggml.tokens")
    merges = [tuple(merge.split(" ")) for merge in field(reader, "tokenizer.ggml.merges")]
    if any(len(merge) != 2 for merge in merges):
        raise GGUFConvertError("GGUF merges are not all 'left right' pairs")
    vocab = {token: index for index, token in enumerate(tokens)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))

    pre_type = field(reader, "tokenizer.ggml.pre", "default")
    if pre_type in _DIGIT_SPLIT_PRE_TYPES:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    elif pre_type == "qwen2":
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:
        raise GGUFConvertError(f"GGUF pre-tokenizer {pre_type!r} is not supported")
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)

    token_types = field(reader, "tokenizer.ggml.token_type")
    tokenizer.add_special_tokens(
        [
            AddedToken(token, special=True, normalized=False)
            for token, token_type in zip(tokens, token_types, strict=True)
            if token_type == _TOKEN_TYPE_CONTROL
        ]
    )
    return tokenizer




def _sentencepiece_tokenizer(reader: gguf.GGUFReader) -> Tokenizer:
    """SentencePiece BPE as transformers converts Gemma's: merges from the pieces' scores (a pair merges with the
    score of the piece it makes), byte fallback to <0xNN>, spaces as "▁", no prefix space."""
    tokens: list[str] = field(reader, "tokenizer.ggml.tokens")
    scores: list[float] = field(reader, "tokenizer.ggml.scores")
    token_types: list[int] = field(reader, "tokenizer.ggml.token_type")
    vocab = {token: index for index, token in enumerate(tokens)}
    ranked = []
    for index, (token, token_type) in enumerate(zip(tokens, token_types, strict=True)):
        if token_type not in (_TOKEN_TYPE_NORMAL, _TOKEN_TYPE_USER) or len(token) < 2:
            continue
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in vocab and right in vocab:
                ranked.append((-scores[index], vocab[left], vocab[right], left, right))
    merges = [(left, right) for *_, left, right in sorted(ranked)]
    unk_id = field(reader, "tokenizer.ggml.unknown_token_id", None)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=True, byte_fallback=True,
                                     unk_token=None if unk_id is None else tokens[unk_id]))
    tokenizer.normalizer = normalizers.Replace(" ", _SPACE)
    tokenizer.decoder = decoders.Sequence([decoders.Replace(_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    if field(reader, "tokenizer.ggml.add_bos_token", False):
        bos = tokens[field(reader, "tokenizer.ggml.bos_token_id")]
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, vocab[bos])])
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False)
                                  for token, token_type in zip(tokens, token_types, strict=True)
                                  if token_type == _TOKEN_TYPE_CONTROL])
    tokenizer.add_tokens([AddedToken(token, special=False, normalized=False)
                          for token, token_type in zip(tokens, token_types, strict=True)
                          if token_type == _TOKEN_TYPE_USER])
    return tokenizer
