"""Constrained decoding: a sequence whose `SamplingParams.grammar` is set may only sample tokens that keep
its output a prefix of the grammar's language (llguidance's matcher, one per sequence).

A matcher is never shipped anywhere: where a sequence lands (a decode worker after the handoff, a move, a
restore, a recompute) its matcher is rebuilt from the grammar and replayed over the output tokens, so the mask
continues exactly. Compiled grammars are cached by their text's hash; a new sequence starts from a copy.
Imports no torch (the controller checks grammars with it); the sampler applies the masks."""

import hashlib
import threading
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass

import llguidance

from fleetctl.engine.core.sequence import Sequence
from fleetctl.engine.model.tokenizer import Tokenizer
from fleetctl.errors import UserError

MAX_GRAMMAR_BYTES = 256 * 1024  # a grammar's text (a JSON schema compiles to about its own size)
COMPILE_CPU_S = 5.0  # a grammar whose compile takes more CPU time than this is refused (wall time varies with load)
COMPILE_WAIT_S = 30.0  # how long a request waits for its grammar's compile at most (then a 400)
CACHED_GRAMMARS = 128
# llguidance's bounds on one grammar's parser: a pathological schema errors instead of stalling a worker's step
LIMITS = llguidance.LLParserLimits(max_grammar_size=500_000, max_lexer_states=250_000)


class GrammarError(UserError):
    """A grammar that does not compile, is too large or too slow to compile, or that a sequence broke."""


@dataclass(frozen=True)
class Compiled:
    matcher: llguidance.LLMatcher  # at its start state: copied for each sequence, never advanced itself
    seconds: float  # how long the compile took (0.0 when it came from the cache)


class Grammars:
    """One engine's (or the controller's) compiled grammars and its sequences' matchers. `vocab_size` is the
    model's logits width (it may exceed the tokenizer's)."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int) -> None:
        self._tokenizer = tokenizer
        self.eos_token_ids = tokenizer.eos_token_ids
        self.vocab_size = max(vocab_size, tokenizer.vocab_size)
        self._ll_tokenizer: llguidance.LLTokenizer | None = None  # built on first use (about a second)
        self._cache: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()  # the server checks grammars from worker threads
        self._matchers: weakref.WeakKeyDictionary[Sequence, _Progress] = weakref.WeakKeyDictionary()

    @property
    def ll_tokenizer(self) -> llguidance.LLTokenizer:
        if self._ll_tokenizer is None:
            self._ll_tokenizer = llguidance.LLTokenizer(
                self._tokenizer.to_json(), n_vocab=self.vocab_size,
                eos_token=sorted(self._tokenizer.eos_token_ids) or None)
        return self._ll_tokenizer

    def compile(self, grammar: str) -> Compiled:
        """The grammar's start-state matcher, from the cache or compiled now; GrammarError if unusable."""
        if len(grammar.encode()) > MAX_GRAMMAR_BYTES:
            raise GrammarError(f"the grammar is {len(grammar.encode()):,} bytes; at most {MAX_GRAMMAR_BYTES:,}")
        key = hashlib.sha256(grammar.encode()).hexdigest()
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return Compiled(self._cache[key], 0.0)
        tokenizer = self.ll_tokenizer  # built once per process, not part of a compile
        start, cpu_start = time.perf_counter(), time.thread_time()
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0, limits=LIMITS)
        seconds, cpu_seconds = time.perf_counter() - start, time.thread_time() - cpu_start
        if matcher.is_error():
            raise GrammarError(f"the grammar does not compile: {matcher.get_error()}")
        if cpu_seconds > COMPILE_CPU_S:
            raise GrammarError(f"the grammar took {cpu_seconds:.1f} s of CPU to compile; at most {COMPILE_CPU_S:g} s")
        with self._lock:
            self._cache[key] = matcher
            while len(self._cache) > CACHED_GRAMMARS:
                self._cache.popitem(last=False)
        return Compiled(matcher, seconds)

    def matcher(self, seq: Sequence) -> llguidance.LLMatcher | None:
        """The sequence's matcher, advanced over every output token so far; None without a grammar. Raises
        GrammarError if the output broke the grammar (a token sampled without its mask)."""
        grammar = seq.params.grammar
        if grammar is None:
            return None
        progress = self._matchers.get(seq)
        if progress is None:
            progress = _Progress(self.compile(grammar).matcher.deep_copy())
            self._matchers[seq] = progress
        outputs = seq.output_token_ids
        if progress.consumed < len(outputs):
            if not progress.matcher.consume_tokens(outputs[progress.consumed:]):
                raise GrammarError(f"{seq.request_id}: output broke its grammar: {progress.matcher.get_error()}")
            progress.consumed = len(outputs)
        return progress.matcher

    def fill_mask(self, seq: Sequence, bitmask_address: int, nbytes: int) -> None:
        """Write the sequence's allowed tokens as a bitmask (bit t of 32-bit word t // 32 set: token t allowed)
        into `nbytes` at the given address. The matcher computes it with the GIL released."""
        matcher = self.matcher(seq)
        assert matcher is not None, "fill_mask is for sequences with a grammar"
        matcher.unsafe_compute_mask_ptr(bitmask_address, nbytes)
        if matcher.is_error():
            raise GrammarError(f"{seq.request_id}: its grammar failed: {matcher.get_error()}")


@dataclass
class _Progress:
    matcher: llguidance.LLMatcher
    consumed: int = 0  # output tokens the matcher has taken
