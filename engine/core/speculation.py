"""Draft tokens for a decode step to verify (`--speculative ngram`): prompt lookup. The tokens that followed the
latest earlier occurrence of a sequence's last n tokens (n from MAX_NGRAM down to MIN_NGRAM) are its draft, else those
that followed its last 3 in an output this node finished (`node_outputs`); agents' outputs repeat their inputs and
each other (tool-call JSON, re-quoted files, edited code), so the draft is often right.

The runner verifies a draft in the same forward as the sequence's next token (one row per position) and keeps the
drafted tokens up to the first the sequence would not have drawn itself (`accepted`): the output is the one decoding
without speculation gives, token for token, under `--deterministic` (a row's numbers do not depend on its neighbours).
Only sequences whose logits nothing but temperature/top-k/top-p shapes, and that ask no logprobs, propose: a
penalty, a bias, a grammar or min_tokens would shape each drafted position by the ones before it.
"""

from dataclasses import dataclass, field
from pathlib import Path

from fleetctl.engine.core.engine_settings import EngineSettings, SpeculativeMode
from fleetctl.engine.core.node_outputs import NodeOutputs, outputs_path
from fleetctl.engine.core.sequence import Sequence
from fleetctl.engine.paths import fleet_home

MAX_NGRAM = 4
MIN_NGRAM = 2  # a single repeated token is too weak a cue: its drafts are mostly rejected
PRIOR_ACCEPTANCE = 0.6  # a drafted token's chance to stand before anything was measured
PRIOR_WEIGHT = 2.0  # verified positions the prior counts for
DECAY = 0.9  # a sequence's acceptance: each step's weight over the next one's
EXPLORE_EVERY = 16  # steps a sequence with drafts goes without verifying one before it tries one token
# the cost of one more row in a decode step, over a step's fixed part, before any step was timed: what a 2-core CPU
# measured (a row of int4 smollm2 ~2.9 ms over a ~10 ms step); a GPU's steps learn theirs (`StepCost`)
PRIOR_ROW_COST = 0.3
DECAY_STEPS = 0.98  # the step-cost fit: each step's weight over the next one's
MIN_STEPS = 8  # steps the fit needs before it replaces PRIOR_ROW_COST
MIN_GAIN = 1.1  # a drafted row must yield this much more per second than the step does without it


@dataclass
class NgramIndex:
    """One sequence's n-grams (n in MIN_NGRAM..MAX_NGRAM) -> the position after their latest occurrence that has a
    token after it (so its last n tokens, the suffix a proposal looks up, are found only where they came before)."""

    positions: dict[tuple[int, ...], int] = field(default_factory=dict)
    indexed: int = 0  # n-grams ending before this position are in `positions`

    def update(self, tokens: list[int]) -> None:
        for end in range(max(self.indexed, MIN_NGRAM), len(tokens)):  # n-grams tokens[end - n:end], then tokens[end]
            for n in range(MIN_NGRAM, min(MAX_NGRAM, end) + 1):
                self.positions[tuple(tokens[end - n:end])] = end
        self.indexed = max(self.indexed, len(tokens))

    def propose(self, tokens: list[int], limit: int) -> list[int]:
        """Up to `limit` tokens that followed the longest suffix of `tokens` seen before; [] when none was."""
        self.update(tokens)
        for n in range(min(MAX_NGRAM, len(tokens) - 1), MIN_NGRAM - 1, -1):
            after = self.positions.get(tuple(tokens[-n:]))
            if after is not None:
                return tokens[after:after + limit]
        return []


class Speculator:
    """The engine's drafts: a prompt-lookup index per sequence, how often each one's drafts stand, and what a
    verified row costs; each decode step, `draft` sets how far every sequence speculates (`draft_lengths`)."""

    def __init__(self, max_tokens: int, vocab_size: int, node: NodeOutputs | None = None) -> None:
        self.max_tokens = max_tokens
        self.vocab_size = vocab_size  # the model's: another model's output (same tokenizer) may hold ids past it
        self.node = node  # the node's finished outputs: drafts where a sequence's own tokens have none
        self._indexes: dict[str, NgramIndex] = {}
        self._acceptance: dict[str, Acceptance] = {}
        self._idle: dict[str, int] = {}  # by request id: steps since its last verified draft while it had one
        self.pooled = Acceptance()  # every sequence's drafts together: a new sequence's prior
        self.step_cost = StepCost()

    def draft(self, seqs: list[Sequence], max_model_len: int) -> None:
        """Set each decoding sequence's draft for the next step: what prompt lookup proposes, within its max_tokens
        and the context (`max_model_len`) after the token the step draws itself, cut to what pays — but
        one token every EXPLORE_EVERY steps where a sequence had drafts and verified none, so that its acceptance
        is measured again (no draft is ever verified otherwise, where the prior says they do not pay)."""
        if self.node is not None:
            self.node.refresh()
        room = [min(seq.params.max_tokens - len(seq.output_token_ids), max_model_len - seq.num_tokens) - 1
                for seq in seqs]
        proposed = [self._propose(seq, min(self.max_tokens, space)) for seq, space in zip(seqs, room, strict=True)]
        prior = self.pooled.rate()
        rates = [self._acceptance.get(seq.request_id, Acceptance()).rate(prior) for seq in seqs]
        lengths = draft_lengths(rates, [len(p) for p in proposed], self.step_cost.row_cost())
        for seq, tokens, length in zip(seqs, proposed, lengths, strict=True):
            idle = self._idle.get(seq.request_id, 0) + 1 if tokens and not length else 0
            if idle >= EXPLORE_EVERY:
                length, idle = 1, 0
            self._idle[seq.request_id] = idle
            seq.draft_token_ids = tokens[:length]

    def _propose(self, seq: Sequence, limit: int) -> list[int]:
        if limit < 1 or not speculates(seq):
            return []
        tokens = seq.token_ids
        own = self._indexes.setdefault(seq.request_id, NgramIndex()).propose(tokens, limit)
        if own or self.node is None:
            return own
        node = self.node.propose(tokens, limit)
        return node[:next((i for i, token in enumerate(node) if token >= self.vocab_size), len(node))]

    def observe(self, request_ids: tuple[str, ...], drafted: tuple[int, ...], kept: tuple[int, ...], rows: int,
                seconds: float) -> None:
        """A decode step ran: `rows` positions in `seconds`, each sequence's draft `drafted` long of which `kept`
        stood."""
        self.step_cost.observe(rows, seconds)
        for request_id, length, stood in zip(request_ids, drafted, kept, strict=True):
            if request_id in self._indexes:  # one that speculates
                self._acceptance.setdefault(request_id, Acceptance()).observe(length, stood)
        if any(drafted):
            self.pooled.observe(sum(drafted), sum(kept), sum(1 for d, k in zip(drafted, kept, strict=True) if k < d))

    def finished(self, seq: Sequence) -> None:
        """`seq` ended here: its output joins the node's (for any engine's drafts), and its state here goes."""
        if self.node is not None:
            self.node.record(seq.output_token_ids)
        self.forget(seq.request_id)

    def forget(self, request_id: str) -> None:
        self._indexes.pop(request_id, None)
        self._acceptance.pop(request_id, None)
        self._idle.pop(request_id, None)


def engine_speculator(settings: EngineSettings, model_dir: Path, vocab_size: int) -> Speculator | None:
    """An engine's drafts as its settings ask (None: `--speculative none`), drafting from the node's outputs of the
    model's tokenizer too, where its home can be written."""
    if settings.speculative is SpeculativeMode.NONE:
        return None
    try:
        node = NodeOutputs(outputs_path(fleet_home(), model_dir / "tokenizer.json"))
    except OSError:  # a read-only home: each sequence drafts from its own tokens only
        node = None
    return Speculator(settings.speculative_tokens, vocab_size, node)


@dataclass
class Acceptance:
    """How often a sequence's drafted tokens stand: of the drafted positions verified (each kept one, and the
    first rejected one after them), the share kept; recent steps weigh more (DECAY a step, drafting or not, so a
    sequence that stopped drafting drifts back to the prior and tries again)."""

    kept: float = 0.0
    tried: float = 0.0

    def rate(self, prior: float = PRIOR_ACCEPTANCE) -> float:
        """The chance the next drafted token stands (`prior` where little is known yet)."""
        return (self.kept + prior * PRIOR_WEIGHT) / (self.tried + PRIOR_WEIGHT)

    def observe(self, drafted: int, kept: int, rejections: int | None = None) -> None:
        """A verification: `drafted` tokens of which `kept` stood (`rejections`: of the drafts verified together,
        how many were cut; one draft's is whether it was)."""
        self.kept = self.kept * DECAY + kept
        self.tried = self.tried * DECAY + kept + (int(kept < drafted) if rejections is None else rejections)




@dataclass
class StepCost:
    """A decode step's seconds as fixed + per_row · rows, fitted by least squares over recent decode steps (a step
    weighs DECAY_STEPS of the one after it), so the draft policy knows what one more verified position costs."""

    sums: list[float] = field(default_factory=lambda: [0.0] * 5)  # weight, rows, seconds, rows², rows · seconds

    def observe(self, rows: int, seconds: float) -> None:
        w, r, t, rr, rt = (value * DECAY_STEPS for value in self.sums)
        self.sums = [w + 1, r + rows, t + seconds, rr + rows * rows, rt + rows * seconds]

    def row_cost(self) -> float:
        """One more row's seconds over a step's fixed seconds (PRIOR_ROW_COST until steps of different sizes ran)."""
        w, r, t, rr, rt = self.sums
        spread = w * rr - r * r
        if w < MIN_STEPS or spread <= 1e-9 * max(w * rr, 1.0):
            return PRIOR_ROW_COST
        per_row = (w * rt - r * t) / spread
        fixed = (t - per_row * r) / w
        return PRIOR_ROW_COST if fixed <= 0 or per_row < 0 else per_row / fixed




def draft_lengths(acceptance: list[float], proposed: list[int], row_cost: float) -> list[int]:
    """How many of its proposed tokens each sequence of a decode step verifies: a drafted token's expected yield is
    the chance it and every one before it stand (rate^(j + 1)), its cost one row (`row_cost` of the step's fixed
    cost); rows go, best yield first, while each yields MIN_GAIN times the tokens per second the step makes without
    it."""
    lengths = [0] * len(proposed)
    tokens, cost = float(len(proposed)), 1.0 + row_cost * len(proposed)  # every sequence's own token, one row each
    while True:
        gains = [(acceptance[i] ** (lengths[i] + 1), i) for i in range(len(proposed)) if lengths[i] < proposed[i]]
        if not gains:
            return lengths
        gain, best = max(gains)
        if gain / row_cost <= MIN_GAIN * tokens / cost:  # this row would not raise the step's tokens per second
            return lengths  # by enough to stand the fit's error (at large batches a row's yield is near its cost)
        lengths[best] += 1
        tokens, cost = tokens + gain, cost + row_cost


def speculates(seq: Sequence) -> bool:
    """Whether a drafted position's token is drawn as the sequence's own would be: its logits shaped by nothing that
    depends on the tokens before it, and no logprobs to report per token."""
    return not seq.params.shapes_logits and seq.params.logprobs is None


def accepted(drafted: list[int], drawn: list[int]) -> list[int]:
    """The tokens a verification step yields: `drawn` [k + 1] are the tokens drawn at the sequence's position and at
    each of its k `drafted` tokens; each drafted token stands while it is the one drawn before it, and the first
    drawn one after the last that stands ends the list (the model's own next token)."""
    kept = 0
    while kept < len(drafted) and drafted[kept] == drawn[kept]:
        kept += 1
    return drawn[:kept + 1]
