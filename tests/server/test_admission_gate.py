"""The admission gate counts the generation requests still being read and refuses one before its body is read
once the queue and they together would pass max_queue; a request gives its place back when the route admits it
(or refuses it, or it ends). Driven as ASGI calls, with a route that waits until told to admit."""

import asyncio
import json

from fleetctl.engine.server.admission_gate import AdmissionGate, prepared

MAX_QUEUE = 2


class Queue:
    """The fleet's queue, as the gate asks it (`FleetFacade.queue_full`): `waiting` admitted requests."""

    def __init__(self) -> None:
        self.waiting, self.early_refusals = 0, 0

    def queue_full(self, arriving: int) -> int | None:
        if self.waiting + arriving <= MAX_QUEUE:
            return None
        self.early_refusals += 1
        return self.waiting


def test_requests_past_the_queue_are_refused_before_they_are_read() -> None:
    queue = Queue()
    reached: list[str] = []
    admit = {name: asyncio.Event() for name in ("a", "b", "d")}

    async def route(scope, receive, send) -> None:
        name = scope["query_string"].decode()
        reached.append(name)
        if scope["path"] == "/v1/completions":
            await admit[name].wait()  # reading, validating, tokenizing
            queue.waiting += 1
            prepared()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    gate = AdmissionGate(route, queue)  # type: ignore[arg-type]

    async def call(name: str, path: str = "/v1/completions") -> dict:
        sent: list[dict] = []

        async def send(message: dict) -> None:
            sent.append(message)

        async def receive() -> dict:
            return {"type": "http.request", "body": b"", "more_body": False}

        scope = {"type": "http", "method": "POST", "path": path, "query_string": name.encode(), "headers": []}
        await gate(scope, receive, send)
        start = sent[0]
        return {"status": start["status"], "headers": dict(start["headers"]), "body": sent[1]["body"]}

    async def scenario() -> None:
        a, b = asyncio.create_task(call("a")), asyncio.create_task(call("b"))
        await asyncio.sleep(0.01)
        assert reached == ["a", "b"] and gate.preparing == 2
        refused = await call("c")  # two being read fill the queue of 2: refused unread
        assert reached == ["a", "b"] and refused["status"] == 429
        assert refused["headers"][b"retry-after"] == b"1"
        error = json.loads(refused["body"])["error"]
        assert error["type"] == "rate_limit_error" and "0 requests are already waiting and 2 more" in error["message"]
        assert queue.early_refusals == 1
        assert (await call("models", "/v1/models"))["status"] == 200  # only generation is gated
        admit["a"].set()
        assert (await a)["status"] == 200 and (gate.preparing, queue.waiting) == (1, 1)
        queue.waiting = 0  # a finished
        d = asyncio.create_task(call("d"))
        await asyncio.sleep(0.01)
        assert reached[-1] == "d" and gate.preparing == 2
        admit["b"].set()
        admit["d"].set()
        assert [(await b)["status"], (await d)["status"]] == [200, 200]
        assert gate.preparing == 0

    asyncio.run(scenario())
