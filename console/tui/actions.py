"""Every console action with its stable binding id, default keys and what it needs: the one list the
key bindings, the help screen, the command palette and readonly mode are built from."""

from dataclasses import dataclass


@dataclass(frozen=True)
class ConsoleAction:
    id: str  # the binding id: `[keys] <id> = "..."` in config.toml overrides `keys`
    keys: str
    label: str  # the footer's word for it
    description: str
    changes_fleet: bool  # disabled in readonly mode
    needs_worker: bool = False  # acts on the selected worker


ACTIONS = (
    ConsoleAction("migrate", "m", "migrate", "Migrate the selected worker to another device", True, True),
    ConsoleAction("checkpoint", "c", "checkpoint", "Checkpoint the selected worker (stand it down, sessions held)",
                  True, True),
    ConsoleAction("restore", "r", "restore", "Restore a checkpoint on a device", True),
    ConsoleAction("drain", "d", "drain", "Drain the selected worker (no new sessions)", True, True),
    ConsoleAction("resume", "u", "resume", "Resume routing to a drained worker", True, True),
    ConsoleAction("stop", "x", "stop", "Stop the selected worker", True, True),
    ConsoleAction("start", "n", "new worker", "Start a new worker", True),
    ConsoleAction("switch", "w", "switch role", "Switch the selected worker's role in place (weights and KV kept; "
                  "its sessions move live first)", True, True),
    ConsoleAction("rebalance", "b", "rebalance", "Rebalance to a split you type (P:D, P:D:M or colocated N): the dry "
                  "run's steps first", True),
    ConsoleAction("plan", "p", "plan", "Open the planner: the recommended split, its gain and why; apply it",
                  False),
    ConsoleAction("detail", "enter", "detail", "Open the selected worker's detail", False, True),
    ConsoleAction("requests", "R", "requests", "Live and recent requests: their timelines, moves", False),
    ConsoleAction("logs", "l", "logs", "Follow the fleet's and its workers' log lines", False),
    ConsoleAction("sort", "s", "sort", "Sort the worker table by the next column", False),
    ConsoleAction("filter", "slash", "filter", "Filter the worker table: the rows with every word typed", False),
    ConsoleAction("theme", "t", "theme", "Switch between the dark and light theme", False),
    ConsoleAction("help", "question_mark,f1", "keys", "Show every key", False),
    ConsoleAction("quit", "q", "quit", "Quit (an embedded fleet stops with the console)", False),
)
ACTIONS_BY_ID = {action.id: action for action in ACTIONS}
READONLY_REASON = "read-only console (--readonly or readonly = true in config.toml): actions are disabled"
