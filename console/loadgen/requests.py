"""One request of a load-generator trace (synthetic, agent sessions, a replayed file; the demo's traffic draws
them too), and the prompt text they are made of: common English words, about one token each, so that token counts
come close to the lengths asked for."""

import random
from dataclasses import dataclass

_WORD_TEXT = """
the of and to in is that for it as was with be by on not he this are or his from at which but have
an they you were her she there one all we their been has when who will more no if out so said what
up its about into than them can only other new some could time these two may then do first any my
now such like our over man me even most made after also did many before must through back years
where much your way well down should because each just those people how too little state good very
make world still own see men work long get here between both life being under never day same another
know while last might us great old year off come since against go came right used take three
"""
WORDS = tuple(_WORD_TEXT.split())


def prompt_text(rng: random.Random, words: int) -> str:
    """`words` common words drawn with `rng`: about one token each for a BPE trained on English."""
    return " ".join(rng.choice(WORDS) for _ in range(words))


@dataclass(frozen=True)
class TraceRequest:
    prompt: str
    prompt_words: int
    max_tokens: int
    arrival_s: float  # offset from the start of the run
    # a turn of a session: sent once the session's previous turn ended, `prompt` appended to its prompt and answer
    session_id: str | None = None
    turn: int = 0
    pause_s: float = 0.0  # a session's turn: sent this long after its previous turn ended (the agent's tool call)
    prompt_token_ids: tuple[int, ...] = ()  # sent instead of `prompt` when given (bench --input-len: exact length)
