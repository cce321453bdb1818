"""What /v1/responses keeps so that a later turn sends only its new items (`previous_response_id`): each stored
response's conversation — every message before the next turn's input, its own answer included, the turn's
`instructions` not — and the agent session its turns share, so their KV stays in the workers' pools for
`--session-ttl`. Kept in the server's memory for `--response-ttl`; the oldest go first past `MAX_KEPT`."""

import time
from collections import OrderedDict
from dataclasses import dataclass

from fleetctl.engine.server.openai_protocol import ChatMessage
from fleetctl.errors import NotFound

MAX_KEPT = 10_000  # responses kept at once


class ResponseNotFound(NotFound):
    """A previous_response_id that names no kept response: never stored, expired, or from before a restart."""

    error_type = "invalid_request_error"
    code = "previous_response_not_found"


@dataclass(frozen=True)
class Conversation:
    messages: list[ChatMessage]
    session: str  # the agent session of every turn: X-Session-Id, `user`, else the first response's id
    expires_at: float  # time.monotonic()


class Conversations:
    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._kept: OrderedDict[str, Conversation] = OrderedDict()

    def get(self, response_id: str) -> Conversation:
        self._expire()
        conversation = self._kept.get(response_id)
        if conversation is None:
            raise ResponseNotFound(
                f"previous_response_id: no response `{response_id}` is kept (responses are kept "
                f"{self.ttl_s:g} s after they end, in this server's memory, unless sent with `store: false`)")
        return conversation

    def keep(self, response_id: str, messages: list[ChatMessage], session: str) -> None:
        self._kept[response_id] = Conversation(messages, session, time.monotonic() + self.ttl_s)
        while len(self._kept) > MAX_KEPT:
            self._kept.popitem(last=False)

    def _expire(self) -> None:
        now = time.monotonic()
        while self._kept and next(iter(self._kept.values())).expires_at <= now:
            self._kept.popitem(last=False)
