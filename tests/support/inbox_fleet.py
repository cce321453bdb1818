"""A controller assembled but never started: no worker process, no event loop. Each worker's link records what
the controller sends it, and a test hands the controller worker messages itself, in whatever order it wants
(`deliver`, through the controller's one inbox), to see what the controller makes of them."""

from pathlib import Path

from fleetctl.domain import Phase
from fleetctl.engine.core.sequence import SamplingParams
from fleetctl.engine.fleet.controller import Fleet
from fleetctl.engine.fleet.fleet_config import FleetConfig
from fleetctl.engine.fleet.request import StreamEvent, TrackedRequest
from fleetctl.engine.worker import protocol as m

PARAMS = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


class RecordingLink:
    def __init__(self) -> None:
        self.sent: list[object] = []

    def send(self, msg: object) -> None:
        self.sent.append(msg)


class InboxFleet:
    """prefill-0 and decode-0, ready, with `decode_blocks` KV blocks of 16 tokens on decode-0."""

    def __init__(self, model_dir: Path, shm_dir: Path, decode_blocks: int = 64) -> None:
        self.shm_dir = shm_dir
        self.fleet = Fleet(FleetConfig(model_dir, devices=("cpu:0", "cpu:1"), shm_dir=shm_dir))
        self.links = {wid: RecordingLink() for wid in self.fleet.views}
        self.fleet.state.links.update(self.links)  # the controller uses a link's send side only here
        self.deliver("prefill-0", m.WorkerReady("prefill-0", 1, 64, 16, 0.0, "fake", 1e12, 1e11))
        self.deliver("decode-0", m.WorkerReady("decode-0", 2, decode_blocks, 16, 0.0, "fake", 1e12, 1e11))

    def deliver(self, wid: str, msg: object) -> None:
        self.fleet.inbox.deliver(wid, msg)

    def submit(self, request_id: str, prompt: list[int]) -> TrackedRequest:
        """A request, sent to prefill-0."""
        return self.fleet.submit(prompt, PARAMS, request_id=request_id)

    def handoff(self, request_id: str) -> m.Handoff:
        """What prefill-0 publishes for `request_id`: a buffer in shared memory."""
        path = self.shm_dir / f"{request_id}.kv"
        path.write_bytes(b"kv")
        return m.Handoff(m.KVHandle(request_id, m.HandleKind.SHM, (1,), "float32", 2, str(path)), 0.25)

    def sent(self, wid: str, kind: type, request_id: str) -> list:
        return [msg for msg in self.links[wid].sent if isinstance(msg, kind) and msg.request_id == request_id]


def step(wid: str, events: list[m.TokenEvent], free_blocks: int, prefill: bool = True) -> m.StepReport:
    """One step's report from `wid`: its token events, each sequence having run 3 tokens."""
    return m.StepReport(
        worker_id=wid, phase=Phase.PREFILL if prefill else Phase.DECODE, tokens=events,
        seq_tokens=[3] * len(events), num_seqs=len(events), num_tokens=3 * len(events), context_tokens=3,
        seconds=0.01, flops=1, bytes=1, free_blocks=free_blocks, running=len(events), waiting=0, ended_at=1000.0)


def streamed(req: TrackedRequest) -> list[StreamEvent]:
    """What the request's client has been sent so far."""
    events = []
    while not req.events.empty():
        events.append(req.events.get_nowait())
    return events
