"""TextStream (incremental text with stop strings) and token_finish_reason, on the tiny model's real
byte-level BPE tokenizer."""

from pathlib import Path

import pytest

from fleetctl.engine.core.output import TextStream, token_finish_reason
from fleetctl.engine.core.sequence import FinishReason, SamplingParams, Sequence
from fleetctl.engine.model.model_config import ModelConfig
from fleetctl.engine.model.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Tokenizer:
    config = ModelConfig.from_file(tiny_model_dir / "config.json")
    return Tokenizer(tiny_model_dir, config.eos_token_ids)


@pytest.fixture(scope="module")
def eos(tokenizer: Tokenizer) -> int:
    assert len(tokenizer.eos_token_ids) == 1
    return next(iter(tokenizer.eos_token_ids))


def char_tokens(tokenizer: Tokenizer, text: str) -> list[int]:
    """One or more tokens per character, so a test controls where text grows."""
    return [i for ch in text for i in tokenizer.encode(ch)]


def stream_of(tokenizer: Tokenizer, stop: tuple[str, ...] = ()) -> TextStream:
    return TextStream(tokenizer, stop, tokenizer.eos_token_ids)


def push_all(stream: TextStream, ids: list[int]) -> list[str]:
    return [stream.push(i) for i in ids]


def test_deltas_concatenate_to_the_decoded_text(tokenizer: Tokenizer) -> None:
    text = "The quick brown fox jumps over the lazy dog. def add(a, b):\n    return a + b\n"
    ids = tokenizer.encode(text)
    stream = stream_of(tokenizer)
    deltas = push_all(stream, ids)
    assert "".join(deltas) == text
    assert stream.text == text
    assert stream.flush() == ""  # without stop strings nothing is held back
    assert not stream.stopped


def test_multibyte_characters_are_never_split(tokenizer: Tokenizer) -> None:
    text = "é 日本 ok"
    ids = tokenizer.encode(text)
    assert len(ids) > len(text)  # byte-level: some characters span several tokens
    stream = stream_of(tokenizer)
    deltas = push_all(stream, ids)
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) + stream.flush() == text


def test_a_stream_that_ends_mid_character_flushes_what_a_decode_of_every_token_gives(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("ok 日本")
    cut = next(n for n in range(len(ids), 0, -1) if tokenizer.decode(ids[:n]).endswith("\ufffd"))
    stream = stream_of(tokenizer)
    deltas = push_all(stream, ids[:cut])  # the last character's bytes never complete
    assert "".join(deltas) + stream.flush() == tokenizer.decode(ids[:cut])
    assert stream.text.endswith("\ufffd")


def test_possible_stop_prefix_is_held_back_then_released(tokenizer: Tokenizer) -> None:
    stream = stream_of(tokenizer, ("STOP",))
    shown = "".join(push_all(stream, char_tokens(tokenizer, "hello ST")))
    assert stream.text == "hello ST"
    assert "hello ST".startswith(shown)
    assert "S" not in shown  # "ST" could begin "STOP"
    shown += "".join(push_all(stream, char_tokens(tokenizer, "ART now")))
    assert shown.startswith("hello ST")  # "STA" cannot begin "STOP": released
    assert not stream.stopped
    shown += stream.flush()
    assert shown == "hello START now"
    assert stream.flush() == ""


def test_held_back_text_is_a_suffix_no_longer_than_the_longest_stop(tokenizer: Tokenizer) -> None:
    stream = stream_of(tokenizer, ("xy", "longer stop"))
    shown = ""
    for i in char_tokens(tokenizer, "The quick brown fox jumps over the lazy dog"):
        shown += stream.push(i)
        assert stream.text.startswith(shown)
        assert len(stream.text) - len(shown) <= len("longer stop") - 1
    assert shown + stream.flush() == stream.text == "The quick brown fox jumps over the lazy dog"


def test_completed_stop_string_truncates_and_ends_the_stream(tokenizer: Tokenizer) -> None:
    stream = stream_of(tokenizer, ("STOP",))
    ids = char_tokens(tokenizer, "hello STOP world")
    shown = ""
    n = 0
    while not stream.stopped and n < len(ids):
        shown += stream.push(ids[n])
        n += 1
    assert stream.stopped
    assert tokenizer.decode(ids[:n]) == "hello STOP"  # stopped on the token that completed it
    assert stream.text == "hello "
    assert shown == "hello "
    assert push_all(stream, ids[n:]) == [""] * (len(ids) - n)
    assert stream.text == "hello "
    assert stream.flush() == ""


def test_stop_string_inside_a_token_drops_the_rest_of_the_token(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("The quick brown fox")
    assert tokenizer.decode([ids[1]]) == " quick"
    stream = stream_of(tokenizer, ("qu",))
    deltas = push_all(stream, ids)
    assert stream.stopped
    assert stream.text == "The "
    assert "".join(deltas) + stream.flush() == "The "


def test_earliest_of_several_stop_strings_wins(tokenizer: Tokenizer) -> None:
    stream = stream_of(tokenizer, ("fox", "quick", "brown"))
    deltas = push_all(stream, tokenizer.encode("The quick brown fox"))
    assert stream.stopped
    assert "".join(deltas) == stream.text == "The "


def test_stop_string_at_the_very_start(tokenizer: Tokenizer) -> None:
    stream = stream_of(tokenizer, ("The",))
    deltas = push_all(stream, tokenizer.encode("The quick"))
    assert stream.stopped and stream.text == "" and deltas == ["", ""]


@pytest.mark.parametrize(
    ("text", "stop"),
    [
        ("Once upon a time there was a small model", ("small",)),
        ("Once upon a time there was a small model", ("zzz", "a t")),
        ("Numbers 0 1 2 3 4 5 6 7 8 9", ("4 5 6",)),
        ("aaab", ("aab",)),  # overlapping: the stop starts one character into a false start
        ("def add(a, b):\n    return a + b\n", ("\n    ",)),
        ("no stop here at all", ("STOP",)),
        ("Once upon a time there", ("time", "a time")),  # both complete on the same token: the earlier wins
    ],
)
def test_shown_text_is_the_text_up_to_the_first_stop(tokenizer: Tokenizer, text: str, stop: tuple[str, ...]) -> None:
    hits = [i for s in stop if (i := text.find(s)) >= 0]
    expected = text[: min(hits)] if hits else text
    for ids in (tokenizer.encode(text), char_tokens(tokenizer, text)):
        stream = stream_of(tokenizer, stop)
        shown = "".join(push_all(stream, ids)) + stream.flush()
        assert shown == expected
        assert stream.stopped == bool(hits)
        assert all(s not in shown for s in stop)


def test_eos_tokens_add_no_text(tokenizer: Tokenizer, eos: int) -> None:
    stream = stream_of(tokenizer, ("STOP",))
    ids = tokenizer.encode("The quick brown fox")
    shown = "".join(push_all(stream, ids[:2]))
    assert stream.push(eos) == ""
    assert stream.text == "The quick"
    shown += "".join(push_all(stream, ids[2:]))
    shown += stream.push(eos)
    shown += stream.flush()
    assert shown == stream.text == "The quick brown fox"
    assert not stream.stopped


def test_any_id_in_the_eos_set_adds_no_text(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("The quick brown fox")
    stream = TextStream(tokenizer, (), frozenset({ids[1]}))  # " quick" stands in for an EOS token
    shown = "".join(push_all(stream, ids)) + stream.flush()
    assert shown == stream.text == "The brown fox"


def test_eos_is_text_free_even_when_not_treated_as_eos(tokenizer: Tokenizer, eos: int) -> None:
    # with ignore_eos the engine passes no EOS ids; the special token still decodes to nothing
    stream = TextStream(tokenizer, (), frozenset())
    ids = tokenizer.encode("The quick")
    shown = "".join(push_all(stream, [ids[0], eos, ids[1]])) + stream.flush()
    assert shown == "The quick"


def _seq(output: list[int], *, prompt_len: int = 4, **params: object) -> Sequence:
    return Sequence(list(range(10, 10 + prompt_len)), SamplingParams(**params), output_token_ids=output)


EOS_IDS = frozenset({2, 7})


def test_finish_reason_eos_is_stop() -> None:
    assert token_finish_reason(_seq([5, 2]), EOS_IDS, max_len=100) is FinishReason.STOP
    assert token_finish_reason(_seq([5, 7]), EOS_IDS, max_len=100) is FinishReason.STOP


def test_finish_reason_only_the_newest_token_counts() -> None:
    assert token_finish_reason(_seq([2, 5]), EOS_IDS, max_len=100) is None


def test_finish_reason_ignore_eos() -> None:
    assert token_finish_reason(_seq([5, 2], ignore_eos=True), EOS_IDS, max_len=100) is None
    assert token_finish_reason(_seq([5, 2], ignore_eos=True, max_tokens=2), EOS_IDS, max_len=100) is FinishReason.LENGTH


def test_finish_reason_max_tokens_is_length() -> None:
    assert token_finish_reason(_seq([5, 6], max_tokens=3), EOS_IDS, max_len=100) is None
    assert token_finish_reason(_seq([5, 6, 8], max_tokens=3), EOS_IDS, max_len=100) is FinishReason.LENGTH


def test_finish_reason_eos_wins_over_length() -> None:
    assert token_finish_reason(_seq([5, 2], max_tokens=2), EOS_IDS, max_len=100) is FinishReason.STOP


def test_finish_reason_full_context_is_length() -> None:
    seq = _seq([5, 6], prompt_len=4)  # 6 tokens
    assert token_finish_reason(seq, EOS_IDS, max_len=7) is None
    assert token_finish_reason(seq, EOS_IDS, max_len=6) is FinishReason.LENGTH
    assert token_finish_reason(seq, EOS_IDS, max_len=5) is FinishReason.LENGTH
