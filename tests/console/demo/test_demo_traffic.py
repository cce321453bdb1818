"""`fleetctl demo`'s traffic driver against an in-process stand-in for a fleet (httpx MockTransport):
phase logs and their boundaries, the cap on requests in flight, errors, and a stop that cancels what
is in flight."""

import asyncio
import itertools
import json
import time

import httpx

from fleetctl.console.demo.schedule import DemoPhase, TrafficConfig
from fleetctl.console.demo.traffic import DemoTraffic

CONFIG = TrafficConfig(context_len=512, prompt_workers=1, decode_workers=2, phase_seconds=0.5)


class FakeFleet:
    """Streams `max_tokens` SSE chunks, `token_s` apart (`token_s=None`: never finishes), or answers
    every request with `status`."""

    def __init__(self, token_s: float | None = 0.001, status: int = 200) -> None:
        self.token_s = token_s
        self.status = status
        self.bodies: list[dict] = []
        self.in_flight = 0
        self.max_in_flight = 0

    async def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.bodies.append(body)
        if self.status != 200:
            return httpx.Response(self.status, json={"error": {"message": "the fleet is busy"}})
        return httpx.Response(200, content=self._stream(body["max_tokens"]))

    async def _stream(self, tokens: int):
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.token_s is None:
                await asyncio.Event().wait()
            for _ in range(tokens):
                await asyncio.sleep(self.token_s)
                yield f"data: {json.dumps({'choices': [{'text': 'x'}]})}\n\n".encode()
            usage = {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": tokens}}
            yield f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode()
        finally:
            self.in_flight -= 1


def run(fake: FakeFleet, duration: float | None, stop_after: float = 0.0) -> DemoTraffic:
    traffic = DemoTraffic("http://fleet", "fake", CONFIG, transport=httpx.MockTransport(fake.handle))
    traffic.start(duration)
    if duration is None:
        time.sleep(stop_after)
    else:
        traffic.wait()
    traffic.stop()
    return traffic


def test_phases_alternate_on_their_boundaries_and_every_request_is_accounted_for() -> None:
    fake = FakeFleet()
    phases = run(fake, duration=2.2).phases
    assert [(p.index, p.phase) for p in phases] == [
        (0, DemoPhase.RAG), (1, DemoPhase.AGENT), (2, DemoPhase.RAG), (3, DemoPhase.AGENT), (4, DemoPhase.RAG)]
    for before, after in itertools.pairwise(phases):
        assert after.start - before.start == CONFIG.phase_seconds and before.end == after.start
    assert 2.2 <= phases[-1].end - phases[0].start < 2.5  # the last phase ends with the duration
    for p in phases:
        assert p.errors == 0 and p.sent == p.completed + p.cancelled
    assert all(p.sent > 0 for p in phases[:4])  # ~10 arrivals each at 20/s (the last phase is 0.2 s)
    assert sum(p.completed for p in phases if p.phase is DemoPhase.RAG) > 0
    rag = [b for b in fake.bodies if b["max_tokens"] <= 16]
    agent = [b for b in fake.bodies if b["max_tokens"] >= 64]
    assert len(rag) + len(agent) == len(fake.bodies)  # no request between the two shapes
    assert min(len(b["prompt"].split()) for b in rag) > max(len(b["prompt"].split()) for b in agent)
    assert all(b["stream"] and b["ignore_eos"] for b in fake.bodies)


def test_stop_cancels_what_is_in_flight_and_the_cap_holds() -> None:
    fake = FakeFleet(token_s=None)  # nothing ever finishes: no latency measured, so the cap is in_flight
    started = time.monotonic()
    traffic = run(fake, duration=None, stop_after=0.2)
    assert time.monotonic() - started < 1.5
    [rag] = traffic.phases
    assert fake.max_in_flight == rag.sent == rag.cancelled == 2  # RAG keeps 2 in flight per prompt worker
    assert rag.completed == 0 and rag.end is not None


def test_errors_are_counted_with_the_first_message() -> None:
    traffic = run(FakeFleet(status=429), duration=0.2)
    [rag] = traffic.phases
    assert rag.errors >= 1 and rag.completed == 0 and rag.sent == rag.errors + rag.cancelled
    assert traffic.first_error is not None and "HTTP 429" in traffic.first_error
