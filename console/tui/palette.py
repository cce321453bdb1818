"""The command palette (ctrl+p) lists every console action by name, with its key."""

from functools import partial

from textual.command import Hit, Hits, Provider

from fleetctl.console.tui.actions import ACTIONS


class ActionCommands(Provider):
    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for action in ACTIONS:
            text = f"{action.id}: {action.description}"
            score = matcher.match(text)
            if score > 0:
                yield Hit(score, matcher.highlight(text), partial(self.app.action_act, action.id),
                          help=f"key: {action.keys.replace('question_mark', '?')}")
