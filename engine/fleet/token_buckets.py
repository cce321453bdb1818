"""A request's output tokens over its life, bounded: the tokens after its first counted in buckets of equal seconds
from the first token's time (what the console's timeline draws as tokens/s). A token past the last of MAX_BUCKETS
doubles the buckets' width, each pair of neighbours merged into one, so a request of any length keeps at most
MAX_BUCKETS counts and its series always spans its whole life at the finest width that fits."""

from dataclasses import dataclass, field

MAX_BUCKETS = 64
FIRST_BUCKET_S = 0.01  # a short request's resolution: a step of a CPU fleet takes longer


@dataclass
class TokenBuckets:
    bucket_s: float = FIRST_BUCKET_S
    counts: list[int] = field(default_factory=list)

    def add(self, offset_s: float) -> None:
        """A token arrived `offset_s` seconds after the request's first token."""
        index = int(max(0.0, offset_s) / self.bucket_s)
        while index >= MAX_BUCKETS:
            self.counts = [sum(self.counts[i : i + 2]) for i in range(0, len(self.counts), 2)]
            self.bucket_s *= 2
            index //= 2
        if index >= len(self.counts):
            self.counts.extend([0] * (index + 1 - len(self.counts)))
        self.counts[index] += 1
