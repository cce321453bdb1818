"""What each action asks the operator and sends to the fleet: pick a device or a checkpoint, confirm
what cannot be undone, start the operation, follow it in a progress dialog. Runs in Textual workers
(the dialogs are awaited), so the dashboard keeps refreshing underneath."""

from collections.abc import Awaitable
from typing import Protocol, TypeVar

from textual.screen import Screen

from fleetctl.console.client import FleetClientError
from fleetctl.console.tui.reading import FleetReading
from fleetctl.console.tui.screens.dialogs import ChoiceDialog, ConfirmDialog, OperationDialog
from fleetctl.console.tui.source import FleetSource
from fleetctl.domain import WorkerRole, WorkerState
from fleetctl.engine.api.bodies import DEFAULT_HOLD_S
from fleetctl.engine.api.device_names import free_devices
from fleetctl.engine.api.operations import OperationInfo

ScreenResult = TypeVar("ScreenResult")
SPLIT_HINT = "or type a split: P:D, P:D:M or colocated N"
SWITCH_CHOICES = {WorkerRole.PREFILL: "prefill: takes prompts and hands their KV to the decode pool",
                  WorkerRole.DECODE: "decode: continues handed-off sessions",
                  WorkerRole.MIXED: "mixed: takes prompts and decodes them itself"}
HOLD_CHOICES = [("60", "60 s"), (f"{DEFAULT_HOLD_S:g}", f"{DEFAULT_HOLD_S / 60:g} minutes (default)"),
                ("900", "15 minutes")]


class ConsoleApp(Protocol):
    """What the flows need of the console (FleetConsole, which owns them): its source, its latest reading, and
    Textual's calls to run a worker, notify and await a dialog."""

    source: FleetSource
    reading: FleetReading

    def run_worker(self, work: Awaitable[None], *, group: str) -> object: ...

    def notify(self, message: str, *, severity: str, timeout: float) -> None: ...

    async def push_screen_wait(self, screen: Screen[ScreenResult]) -> ScreenResult: ...

    def refresh_reading(self) -> object: ...


class ActionFlows:
    def __init__(self, app: ConsoleApp) -> None:
        self.app = app

    def run(self, action_id: str, worker: str | None) -> None:
        self.launch(action_id, getattr(self, action_id)(worker))

    def launch(self, name: str, starting: Awaitable[OperationInfo | None]) -> None:
        """Run one flow (`starting` asks, then starts the operation or returns None) and follow it."""
        self.app.run_worker(self._follow(name, starting), group="actions")

    async def _follow(self, name: str, starting: Awaitable[OperationInfo | None]) -> None:
        try:
            started = await starting
        except FleetClientError as exc:
            self.app.notify(f"{name}: {exc}", severity="error", timeout=8)
            return
        if started is not None:
            result = await self.app.push_screen_wait(OperationDialog(self.app.source, started))
            if result is not None:
                self.app.refresh_reading()

    async def _ask(self, title: str, choices: list[tuple[str, str]], free_text: str | None = None) -> str | None:
        return await self.app.push_screen_wait(ChoiceDialog(title, choices, free_text))

    async def _confirm(self, question: str) -> bool:
        return await self.app.push_screen_wait(ConfirmDialog(question))

    async def _device(self, title: str) -> str | None:
        devices = free_devices(self.app.reading.workers)
        return await self._ask(title, [(d, d) for d in devices], free_text="or type a device: cpu:N or cuda:N")

    async def migrate(self, worker: str) -> OperationInfo | None:
        target = await self._device(f"migrate {worker} to which device?")
        if target is None or not await self._confirm(f"Migrate {worker} to {target}? Its sessions move with it."):
            return None
        return await self.app.source.start(f"/fleet/workers/{worker}/migrate", {"to": target})

    async def checkpoint(self, worker: str) -> OperationInfo | None:
        hold = await self._ask(f"checkpoint {worker}: hold its sessions for how long before they are recomputed "
                               f"on peers?", HOLD_CHOICES)
        if hold is None or not await self._confirm(f"Stand {worker} down with its state saved?"):
            return None
        return await self.app.source.start(f"/fleet/workers/{worker}/checkpoint", {"hold_s": float(hold)})

    async def restore(self, _: str | None) -> OperationInfo | None:
        saved = (await self.app.source.checkpoints()).checkpoints
        choices = [(c.name, f"{c.name}  ({c.role}, {c.sessions} sessions)") for c in saved if c.valid]
        name = await self._ask("restore which checkpoint?", choices)
        if name is None:
            return None
        device = await self._device(f"restore {name} on which device?")
        if device is None:
            return None
        return await self.app.source.start("/fleet/restore", {"checkpoint": name, "device": device})

    async def drain(self, worker: str) -> OperationInfo | None:
        if not await self._confirm(f"Drain {worker}? It takes no new sessions; its sessions finish there."):
            return None
        return await self.app.source.start(f"/fleet/workers/{worker}/drain", {})

    async def resume(self, worker: str) -> OperationInfo | None:
        return await self.app.source.start(f"/fleet/workers/{worker}/resume", {})

    async def stop(self, worker: str) -> OperationInfo | None:
        how = await self._ask(f"stop {worker}", [("drain", "drain first: its sessions finish, then it stops"),
                                                 ("force", "force: recompute its sessions on peers now")])
        if how is None or not await self._confirm(f"Stop {worker} ({how})?"):
            return None
        return await self.app.source.start(f"/fleet/workers/{worker}/stop", {"force": how == "force"})

    async def start(self, _: str | None) -> OperationInfo | None:
        pools = sorted(self.app.reading.pools)  # the fleet's own roles first, then any other it may run beside them
        roles = pools + [r.value for r in WorkerRole if r.value not in pools]
        role = await self._ask("start a worker of which role?", [(r, r) for r in roles])
        if role is None:
            return None
        device = await self._device(f"start a {role} worker on which device?")
        if device is None:
            return None
        return await self.app.source.start("/fleet/workers", {"role": role, "device": device})

    async def move(self, request_id: str, worker: str) -> OperationInfo | None:
        """From the requests view: a decoding session to another running worker that decodes, live."""
        peers = [w.id for w in self.app.reading.workers if w.id != worker and w.state == WorkerState.RUNNING.value
                 and WorkerRole(w.role).covers(WorkerRole.DECODE)]
        if not peers:
            self.app.notify(f"move {request_id}: no other running worker decodes", severity="warning", timeout=8)
            return None
        to = await self._ask(f"move {request_id} from {worker} to which worker?", [(p, p) for p in peers])
        if to is None or not await self._confirm(f"Move {request_id} to {to}? It keeps decoding while its KV moves."):
            return None
        return await self.app.source.start(f"/fleet/requests/{request_id}/move", {"to": to})

    async def switch(self, worker: str) -> OperationInfo | None:
        """The selected worker to another role; the fleet's refusal (the last worker to decode, a weight format
        the new role does not serve) comes back as the CLI prints it."""
        current = self.app.reading.worker(worker)
        roles = [role for role in WorkerRole if current is None or role.value != current.role]
        role = await self._ask(f"switch {worker} to which role?", [(r.value, SWITCH_CHOICES[r]) for r in roles])
        if role is None or not await self._confirm(f"Switch {worker} to {role}? The same process keeps its weights "
                                                   f"and KV; sessions that cannot stay move live first."):
            return None
        return await self.app.source.start(f"/fleet/workers/{worker}/switch", {"role": role})

    async def rebalance(self, _: str | None) -> OperationInfo | None:
        """A split the operator picks (the planner's, as the split regret last named it) or types."""
        regret = self.app.reading.status.split_regret if self.app.reading.status else None
        choices = []
        if regret and regret.best != regret.current:
            judged = {"move": "advised: beyond the error", "keep": "within the error: the advice is to keep"}
            why = f"; {judged[regret.verdict]}" if regret.verdict in judged else ""
            choices.append((regret.best, f"{regret.best}  (the best of the last replay: {regret.current} serves "
                                         f"{regret.ratio:.0%} of it{why})"))
        split = await self._ask("rebalance to which split?", choices, free_text=SPLIT_HINT)
        return None if split is None else await self.rebalance_to(split)

    async def rebalance_to(self, split: str) -> OperationInfo | None:
        """The dry run's moves in the confirmation, then the rebalance itself."""
        preview = await self.app.source.rebalance_preview(split)
        moves = "\n".join([*(f"  {s.describe()}" for s in preview.starts),
                           *(f"  {m.worker} on {m.device}: {m.from_} → {m.to} ({m.sessions} sessions "
                             f"leave first: {preview.evacuation})" for m in preview.moves),
                           *(f"  {s.describe()}, its sessions moved first" for s in preview.stops)])
        if not await self._confirm(f"Rebalance {preview.current} → {preview.split}?\n{moves}"):
            return None
        return await self.app.source.start("/fleet/rebalance", {"split": split, "apply": True})
