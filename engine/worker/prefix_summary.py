"""What a worker tells the router about its prefix cache: the changes to a bounded set of block hashes
(block_hash.PrefixDigest), sent with its step reports. Torch-free: the controller applies them.

Changes rather than the whole set: a digest holds up to 4,096 hashes (64 KiB), and most steps change
none or one of them. The pipe is ordered and lossless, so a controller that applies every change in
order holds exactly the worker's last digest; a new process (restart, restore) starts with `reset`.

A worker sends changes after every prefill step and every step that ends a request (the moments a
router needs them: the next turn of a conversation arrives right after the last one ended), and
otherwise at most every SUMMARY_INTERVAL_S (decode steps fill blocks steadily)."""

from collections.abc import Callable
from dataclasses import dataclass

from fleetctl.engine.core.block_hash import PrefixDigest

SUMMARY_INTERVAL_S = 0.25


@dataclass(frozen=True)
class PrefixChanges:
    """Hashes the worker's digest gained and lost since its previous changes (all of it after `reset`)."""

    root: bytes
    block_size: int
    added: frozenset[bytes]
    removed: frozenset[bytes]
    reset: bool = False


class PrefixSummary:
    """The worker's side: what it sent last, and the changes since."""

    def __init__(self) -> None:
        self._sent: frozenset[bytes] | None = None
        self._sent_at = float("-inf")

    def changes(self, digest_of: Callable[[], PrefixDigest], now: float, urgent: bool) -> PrefixChanges | None:
        """The changes to send now, if any is due (`urgent`: a prefill step or a request's end); the digest
        is taken only then."""
        if not urgent and now - self._sent_at < SUMMARY_INTERVAL_S:
            return None
        digest = digest_of()
        reset = self._sent is None
        sent = self._sent or frozenset()
        if not reset and digest.hashes == sent:
            return None
        self._sent, self._sent_at = digest.hashes, now
        return PrefixChanges(digest.root, digest.block_size, digest.hashes - sent, sent - digest.hashes, reset)


@dataclass
class PrefixIndex:
    """The controller's copy of one worker's digest, kept by applying its changes in order."""

    root: bytes = b""
    block_size: int = 0
    hashes: set[bytes] | None = None  # None until the worker's first changes arrive

    def apply(self, changes: PrefixChanges) -> None:
        if changes.reset or self.hashes is None:
            self.hashes = set()
        self.root, self.block_size = changes.root, changes.block_size
        self.hashes -= changes.removed
        self.hashes |= changes.added

    def clear(self) -> None:
        """The worker's process is gone (or replaced): it caches nothing the router may count on."""
        self.hashes = None

    def cached_blocks(self, chain: list[bytes]) -> int:
        """How many leading blocks of a prompt's hash chain (under this index's root) the worker holds."""
        if not self.hashes:
            return 0
        count = 0
        for digest in chain:
            if digest not in self.hashes:
                break
            count += 1
        return count
