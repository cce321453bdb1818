"""The controller's KV accounting for one worker: its pool's size, its free blocks as it last reported them,
and the blocks the controller has set aside there for something on its way in — a handoff it sent the worker
to adopt, a live move's reservation it asked for — that the worker's reports do not count yet.

This is the only writer of those numbers; the message handlers say what happened (the worker started,
reported, an adoption was sent, the worker answered it), and the router, the operations and /fleet/status
read `free`, `available` and `usage`. A reservation is held until the worker's answer to it settles it:
the worker's messages arrive in the order it sent them, so a report that comes before that answer does not
count the blocks yet, and one that comes after it does."""

from fleetctl.engine.core.block_allocator import BLOCK_SIZE


class WorkerKV:
    def __init__(self, num_blocks: int = 0, block_size: int = BLOCK_SIZE, free: int | None = None) -> None:
        """A worker whose pool holds `num_blocks` of `block_size` tokens, `free` of them free (all, unless
        given); nothing reserved."""
        self._num_blocks = num_blocks
        self._block_size = block_size
        self._free = num_blocks if free is None else free
        self._reserved: dict[str, int] = {}  # what is on its way in (a request id, a move id) -> blocks
        self._refused = False  # it refused an adoption for room: nothing is available until it reports again

    @property
    def num_blocks(self) -> int:
        return self._num_blocks

    @property
    def block_size(self) -> int:
        return self._block_size

    @property
    def free(self) -> int:
        """Free blocks as the worker last reported them (what /fleet/status shows)."""
        return self._free

    @property
    def reserved(self) -> int:
        """Blocks set aside for what is on its way in and not yet in the worker's reports."""
        return sum(self._reserved.values())

    @property
    def available(self) -> int:
        """Blocks that the controller may still send work for: free, less what is reserved."""
        return 0 if self._refused else max(0, self._free - self.reserved)

    @property
    def usage(self) -> float:
        """The fraction of the pool in use, as the worker last reported it (0 before it has)."""
        return 1 - self._free / self._num_blocks if self._num_blocks else 0.0

    # ---- what happened -------------------------------------------------------------------------

    def started(self, num_blocks: int, block_size: int) -> None:
        """A new process is ready with an empty pool: whatever was reserved for its predecessor is void."""
        self._num_blocks, self._block_size, self._free = num_blocks, block_size, num_blocks
        self._reserved.clear()
        self._refused = False

    def reported(self, free_blocks: int) -> None:
        """The worker said how many blocks are free (after a step, a release, an answer): reservations it has
        not answered yet stay."""
        self._free = free_blocks
        self._refused = False

    def reserve(self, key: str, num_blocks: int) -> None:
        """`num_blocks` are on their way in for `key` (a handoff's request id, a move's id)."""
        self._reserved[key] = num_blocks

    def settled(self, key: str, free_blocks: int | None = None) -> None:
        """The worker answered for `key` (took the blocks, or did not): its reservation ends, and the free
        blocks it reported with the answer (if it did) count them."""
        self._reserved.pop(key, None)
        if free_blocks is not None:
            self.reported(free_blocks)

    def refused_for_room(self, key: str) -> None:
        """The worker could not fit what `key` brought: nothing is available there until it reports again."""
        self.settled(key)
        self._refused = True
