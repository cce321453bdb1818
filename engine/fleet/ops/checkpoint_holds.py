"""The sessions of a stood-down worker (`checkpoint`): held, their streams open, until a restore brings the
worker back, for at most the hold; then they are recomputed on peers. A restore running when the hold runs
out decides their fate — continued where it restored them, or recomputed at once if it failed — so no path
leaves them waiting without a timer."""

import asyncio
from collections.abc import Callable
from pathlib import Path

from fleetctl.domain import WorkerState
from fleetctl.engine.fleet.state import FleetState


class Holds:
    def __init__(self, state: FleetState, recompute_held: Callable[[str], None],
                 restoring: Callable[[str], bool]) -> None:
        self.state = state
        self._recompute_held = recompute_held
        self._restoring = restoring  # a restore of the worker is running
        self._deadlines: dict[str, float] = {}  # worker id -> event loop time its hold ends
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._checkpoints: dict[str, Path] = {}  # worker id -> the checkpoint it stood down with

    def hold(self, worker_id: str, hold_s: float, checkpoint: Path) -> None:
        loop = asyncio.get_running_loop()
        self._deadlines[worker_id] = loop.time() + hold_s
        self._checkpoints[worker_id] = checkpoint.resolve()
        self._arm(worker_id, hold_s)

    def stood_down_with(self, worker_id: str) -> Path | None:
        return self._checkpoints.get(worker_id)

    def restored(self, worker_id: str) -> None:
        """The worker is back with its sessions: nothing to expire."""
        self._forget(worker_id)

    def restore_failed(self, worker_id: str) -> None:
        """The sessions are still held: recompute them now if the hold ran out meanwhile, else later."""
        if worker_id not in self._deadlines:
            return
        left = self._deadlines[worker_id] - asyncio.get_running_loop().time()
        if left <= 0:
            self._expire(worker_id)
        else:
            self._arm(worker_id, left)

    def stop(self) -> None:
        for worker_id in list(self._timers):
            self._forget(worker_id)

    def _arm(self, worker_id: str, delay: float) -> None:
        if timer := self._timers.get(worker_id):
            timer.cancel()
        self._timers[worker_id] = asyncio.get_running_loop().call_later(delay, self._fired, worker_id)

    def _fired(self, worker_id: str) -> None:
        self._timers.pop(worker_id, None)
        if not self._restoring(worker_id):  # else the restore's outcome decides (restored / restore_failed)
            self._expire(worker_id)

    def _expire(self, worker_id: str) -> None:
        self._forget(worker_id)
        view = self.state.views[worker_id]
        if view.state is WorkerState.CHECKPOINTED:
            view.state = WorkerState.STOPPED
            self._recompute_held(worker_id)

    def _forget(self, worker_id: str) -> None:
        if timer := self._timers.pop(worker_id, None):
            timer.cancel()
        self._deadlines.pop(worker_id, None)
        self._checkpoints.pop(worker_id, None)
