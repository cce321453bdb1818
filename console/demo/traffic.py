"""`fleetctl demo`'s synthetic traffic: streamed OpenAI completions against a fleet URL, swinging
between a prompt-heavy and a decode-heavy phase (see schedule.py). It runs on its own thread and
event loop, so that the console (or a plain wait) can hold the main thread; `stop()` cancels the
requests in flight and returns what each phase sent."""

import asyncio
import math
import random
import threading
import time
from dataclasses import dataclass

import httpx

from fleetctl.console.client import FleetClient
from fleetctl.console.demo.schedule import ArrivalRate, DemoPhase, TrafficConfig, TrafficSchedule
from fleetctl.console.loadgen.requests import prompt_text
from fleetctl.console.loadgen.runner import stream_request
from fleetctl.domain import WorkerRole
from fleetctl.errors import FleetctlError

PROBE_WORDS = 64
POLL_S = 0.05  # how often waits look at the stop flag and at the requests in flight


@dataclass
class PhaseLog:
    """One phase as it ran. Times are wall-clock (time.time()), as the store's rows are."""

    index: int
    phase: DemoPhase
    start: float
    end: float | None = None  # None while it runs
    sent: int = 0
    completed: int = 0
    errors: int = 0
    cancelled: int = 0  # still in flight when the traffic stopped


def plan_traffic(url: str, phase_seconds: float, seed: int = 0) -> tuple[str, TrafficConfig]:
    """Ask the fleet at `url` what the traffic must fit: its model and context, its pools, and how many
    tokens its tokenizer makes of the prompt words (one short probe completion). Returns (model, config); raises
    FleetClientError when the fleet's API does not answer, FleetctlError when the rest does not (UserError when
    its model or pools cannot carry the demo)."""
    try:
        status = FleetClient(url).status()
        with httpx.Client(base_url=url, timeout=60.0) as http:
            card = http.get("/v1/models").raise_for_status().json()["data"][0]
            probe = http.post("/v1/completions", json={
                "model": card["id"], "prompt": prompt_text(random.Random(seed), PROBE_WORDS), "max_tokens": 1,
            }).raise_for_status().json()
    except (httpx.HTTPError, ValueError) as exc:  # ValueError: a body that is not JSON
        raise FleetctlError(f"the fleet at {url} did not answer the demo's probe ({exc})") from None
    if "max_model_len" not in card:
        raise FleetctlError(f"the fleet at {url} does not report its context length (max_model_len in /v1/models)")
    workers = {role: pool.workers for role, pool in status.pools.items()}
    mixed = workers.get(WorkerRole.MIXED.value, 0)
    config = TrafficConfig(
        context_len=card["max_model_len"],
        prompt_workers=workers.get(WorkerRole.PREFILL.value, 0) or mixed,
        decode_workers=workers.get(WorkerRole.DECODE.value, 0) or mixed,
        phase_seconds=phase_seconds,
        tokens_per_word=probe["usage"]["prompt_tokens"] / PROBE_WORDS,
        seed=seed,
    )
    return card["id"], config


class DemoTraffic:
    def __init__(self, url: str, model: str, config: TrafficConfig,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.url = url
        self._transport = transport  # None: the network (a test passes an in-process fleet)
        self.model = model
        self.schedule = TrafficSchedule(config)
        self.rate = ArrivalRate(self.schedule.shapes)
        self.phases: list[PhaseLog] = []
        self.first_error: str | None = None
        self._in_flight = dict.fromkeys(DemoPhase, 0)
        self._stop = threading.Event()
        self._duration = math.inf
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="demo-traffic", daemon=True)

    def start(self, duration: float | None = None) -> None:
        """Send for `duration` seconds (None: until `stop()`)."""
        self._duration = math.inf if duration is None else duration
        self._thread.start()

    def wait(self) -> None:
        """Until the duration has passed (Ctrl-C still reaches the caller)."""
        while self._thread.is_alive():
            self._thread.join(0.2)

    def stop(self) -> list[PhaseLog]:
        """Stop sending, cancel what is in flight, and return the phases (the last one ends now)."""
        self._stop.set()
        self._thread.join()
        if self._failure is not None:
            raise FleetctlError(f"the demo traffic failed: {self._failure!r}") from self._failure
        return self.phases

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported by stop(), on the caller's thread
            self._failure = exc

    async def _main(self) -> None:
        schedule = self.schedule
        tasks: set[asyncio.Task] = set()
        started, wall_start = time.monotonic(), time.time()
        async with httpx.AsyncClient(base_url=self.url, timeout=600.0, transport=self._transport) as http:
            try:
                while not self._stop.is_set() and time.monotonic() - started < self._duration:
                    index, phase = schedule.phase_at(time.monotonic() - started)
                    log = self._enter(index, wall_start)
                    phase_end = started + min(schedule.phase_end(index), self._duration)
                    if await self._next_arrival(phase, phase_end):
                        task = asyncio.create_task(self._send(http, log))
                        tasks.add(task)
                        task.add_done_callback(tasks.discard)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                if self.phases:
                    self.phases[-1].end = time.time()

    def _enter(self, index: int, wall_start: float) -> PhaseLog:
        """The log of phase `index`, closing the ones before it at their boundaries."""
        while not self.phases or self.phases[-1].index < index:
            next_index = self.phases[-1].index + 1 if self.phases else index
            boundary = wall_start + next_index * self.schedule.config.phase_seconds
            if self.phases:
                self.phases[-1].end = boundary
            self.phases.append(PhaseLog(next_index, self.schedule.phase_kind(next_index), boundary))
        return self.phases[-1]

    async def _next_arrival(self, phase: DemoPhase, phase_end: float) -> bool:
        """Wait for the next Poisson arrival, then for room under the cap. False when the phase ended or
        the traffic was stopped first."""
        arrival = time.monotonic() + self.schedule.next_gap(self.rate.rate(phase))
        if not await self._sleep_until(min(arrival, phase_end)):
            return False
        while self._in_flight[phase] >= self.rate.cap(phase) and time.monotonic() < phase_end:
            if not await self._sleep_until(time.monotonic() + POLL_S):
                return False
        return time.monotonic() < phase_end

    async def _sleep_until(self, deadline: float) -> bool:
        """False as soon as the traffic is told to stop."""
        while (left := deadline - time.monotonic()) > 0 and not self._stop.is_set():
            await asyncio.sleep(min(POLL_S, left))
        return not self._stop.is_set()

    async def _send(self, http: httpx.AsyncClient, log: PhaseLog) -> None:
        phase = log.phase
        log.sent += 1
        self._in_flight[phase] += 1
        try:
            outcome = await stream_request(http, self.model, self.schedule.draw(phase), time.perf_counter())
        except asyncio.CancelledError:
            log.cancelled += 1
            raise
        finally:
            self._in_flight[phase] -= 1
        if outcome.error:
            log.errors += 1
            self.first_error = self.first_error or outcome.error
        else:
            log.completed += 1
            self.rate.observe(phase, outcome.e2e_s)
