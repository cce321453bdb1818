"""A request's tokens, sampling parameters and lifecycle inside one engine."""

import itertools
import random
import time
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Annotated

from fleetctl.errors import UserError
from fleetctl.options import REPEATED, CliOption


class SequenceStatus(Enum):
    WAITING = "waiting"  # queued for prefill (new, or preempted and to be recomputed)
    RUNNING = "running"  # KV cache resident, decoding
    PARKED = "parked"  # prefilled on a prefill-only engine; KV held until handed off
    FINISHED = "finished"


class FinishReason(StrEnum):
    STOP = "stop"  # EOS token or a stop string
    LENGTH = "length"  # max_tokens or the model's context
    ABORT = "abort"


class SamplingError(UserError):
    """Sampling parameters out of range."""


MAX_TEMPERATURE = 2.0  # the bounds the engine, the OpenAI API and the CLI all check
# Below this a temperature samples like argmax (its limit), and dividing logits by it would overflow to inf.
GREEDY_BELOW_TEMPERATURE = 1e-5
MAX_LOGPROBS = 20  # alternatives per token a request may ask for (vLLM's default max_logprobs)
MAX_PENALTY = 2.0  # presence/frequency penalties' bound (OpenAI's)
MAX_REPETITION_PENALTY = 10.0
MAX_LOGIT_BIAS = 100.0  # OpenAI's bound


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: Annotated[int, CliOption("--max-tokens", "-n", help="New tokens per prompt, at most.")] = 16
    temperature: Annotated[float, CliOption(
        "--temperature", "-t", help=f"Sampling temperature in [0, {MAX_TEMPERATURE:g}]; 0 is greedy.")] = 1.0
    top_p: Annotated[float, CliOption(
        "--top-p", help="Sample from the fewest most likely tokens whose probabilities reach P (1: all).")] = 1.0
    top_k: Annotated[int, CliOption("--top-k", help="Sample from the K most likely tokens (0 disables top-k).")] = 0
    seed: Annotated[int | None, CliOption(
        "--seed", help="Per-request seed: sampled output is reproducible.")] = None
    stop: Annotated[tuple[str, ...], CliOption("--stop", convert=REPEATED, help="Stop string (repeatable).")] = ()
    ignore_eos: Annotated[bool, CliOption(
        "--ignore-eos", help="Keep generating past EOS (benchmarks, tests).")] = False
    # None: no log-probabilities; k: each sampled token's log-probability and the k most likely tokens'
    logprobs: int | None = None
    # OpenAI's definitions: subtract presence_penalty once from every token already in the output, and
    # frequency_penalty once per occurrence; repetition_penalty (HF/vLLM's, 1 = off) divides a positive logit
    # and multiplies a negative one of every token in the prompt or the output
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit), sorted by id
    min_tokens: int = 0  # EOS (and stop tokens) refused before this many new tokens
    # an llguidance grammar (engine/core/grammar.py) every sampled token must keep valid; carried with the
    # session through handoff, moves and checkpoints, and replayed over the output tokens where it lands
    grammar: str | None = None
    constraint: str = ""  # what the grammar enforces, named for reports: json_object, json_schema:NAME, tools:CHOICE

    def __post_init__(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise SamplingError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if not 0.0 <= self.temperature <= MAX_TEMPERATURE:
            raise SamplingError(f"temperature must be in [0, {MAX_TEMPERATURE:g}], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise SamplingError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise SamplingError(f"top_k must be >= 0, got {self.top_k}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise SamplingError(f"logprobs must be in [0, {MAX_LOGPROBS}], got {self.logprobs}")
        if any(not s for s in self.stop):
            raise SamplingError("stop strings must not be empty")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -MAX_PENALTY <= getattr(self, name) <= MAX_PENALTY:
                raise SamplingError(f"{name} must be in [-{MAX_PENALTY:g}, {MAX_PENALTY:g}], got {getattr(self, name)}")
        if not 0.0 < self.repetition_penalty <= MAX_REPETITION_PENALTY:
            raise SamplingError(f"repetition_penalty must be in (0, {MAX_REPETITION_PENALTY:g}], got "
                                f"{self.repetition_penalty}")
        if any(not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS for _, bias in self.logit_bias):
            raise SamplingError(f"logit_bias values must be in [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}]")
        if any(token < 0 for token, _ in self.logit_bias):
            raise SamplingError("logit_bias keys must be token ids >= 0")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise SamplingError(f"min_tokens must be in [0, max_tokens], got {self.min_tokens}")

    @property
    def shapes_logits(self) -> bool:
        """Whether anything besides temperature/top-k/top-p changes the logits a token is drawn from."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.logit_bias or self.min_tokens or self.grammar)

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW_TEMPERATURE

    def request_seed(self) -> int:
        """The seed a new request samples with: the given one, else a fresh random one."""
        return self.seed if self.seed is not None else random.getrandbits(63)


_ids = itertools.count()


@dataclass(eq=False)
class Sequence:
    prompt_token_ids: list[int]
    params: SamplingParams
    request_id: str = ""
    seq_id: int = field(default_factory=lambda: next(_ids))
    output_token_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: FinishReason | None = None
    block_table: list[int] = field(default_factory=list)
    # leading blocks freed once every layer's window passed them (kv_window); their entries are DROPPED_BLOCK
    num_dropped_blocks: int = 0
    # the windowed layers' slot of each block whose window K/V it holds (window_holds: models whose windowed
    # layers keep their K/V apart), NO_SLOT elsewhere; may be shorter than block_table (the rest: NO_SLOT)
    window_table: list[int] = field(default_factory=list)
    num_cached_tokens: int = 0  # tokens whose K/V sit in this sequence's blocks
    block_hashes: list[bytes] = field(default_factory=list)  # its full blocks' hash chain (prefix cache), so far
    session: str = ""  # the agent session it is a turn of: its blocks are retained in the pool after it ends
    # prompt tokens read back from a KV tier (kv_offload) at admission, by tier; reported with its first step
    tier_tokens: dict[str, int] = field(default_factory=dict)
    awaiting_tiers: bool = False  # waiting for its prefix's blocks to come off a KV tier: not admitted before
    arrival_time: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    last_token_time: float | None = None
    # Sampling draws for output position i come from a generator seeded with (seed, i): no RNG state
    # to carry through a handoff, a recompute or a checkpoint.
    seed: int = -1
    # tokens proposed for its next decode step to verify (engine/core/speculation.py); set before each schedule
    draft_token_ids: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.request_id:
            self.request_id = f"seq-{self.seq_id}"
        if self.seed < 0:
            self.seed = self.params.request_seed()

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def last_token_id(self) -> int:
        return self.output_token_ids[-1] if self.output_token_ids else self.prompt_token_ids[-1]

    def append_token(self, token_id: int) -> None:
        now = time.perf_counter()
        if self.first_token_time is None:
            self.first_token_time = now
        self.last_token_time = now
        self.output_token_ids.append(token_id)


@dataclass(frozen=True)
class SessionState:
    """Everything a destination needs besides the K/V: the tokens, sampling (draws are seeded by
    (seed, position), so the seed is the generator's whole state) and stop criteria (params)."""

    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    params: SamplingParams
    seed: int
    session: str = ""  # the agent session it is a turn of (its blocks' retention goes with it)
