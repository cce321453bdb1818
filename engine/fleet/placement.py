"""Where a request is: the one module that changes it. A request's placement is a relation with two
sides — the request names its workers (`TrackedRequest.stage`, `prefill_worker`, `decode_worker`) and each
worker's view lists the requests it holds (`WorkerView.requests`) — and every change below moves both
sides together, so that they never disagree: a worker holds a live request only if the request names it,
and a request's decode worker holds it. (`prefill_worker` stays set once its copy is released: it says
where the prompt was prefilled, for the request's record and its siblings' routing.)"""

from fleetctl.engine.fleet.request import RequestStage, TrackedRequest
from fleetctl.engine.fleet.worker_view import WorkerView


def place_prefill(req: TrackedRequest, view: WorkerView) -> None:
    """`view`'s worker prefills `req` (a prefill or mixed worker, or a peer recomputing it)."""
    req.stage, req.prefill_worker = RequestStage.PREFILL, view.worker_id
    view.requests.add(req.request_id)


def place_decode(req: TrackedRequest, view: WorkerView) -> None:
    """Decode worker `view` prefills and decodes `req` itself (a recompute, or a local prefill): no handoff."""
    req.stage, req.decode_worker = RequestStage.DECODE, view.worker_id
    view.requests.add(req.request_id)


def prefilled(req: TrackedRequest) -> None:
    """Its prefill worker made the first token: its KV waits for a decode worker."""
    req.stage = RequestStage.HANDOFF


def hand_over(req: TrackedRequest, view: WorkerView) -> None:
    """Decode worker `view` is adopting `req`'s published KV (its prefill worker still holds its copy)."""
    req.decode_worker = view.worker_id
    view.requests.add(req.request_id)


def adopted(req: TrackedRequest) -> None:
    """Its decode worker has its KV and decodes it."""
    req.stage = RequestStage.DECODE


def requeue(req: TrackedRequest) -> None:
    """It waits in the controller's queue for a worker (it holds none)."""
    req.stage = RequestStage.QUEUED


def move(req: TrackedRequest, source: WorkerView, dest: WorkerView) -> None:
    """Its session moved live from `source` to `dest` (a decode worker's, or a mixed worker's)."""
    if req.decode_worker == source.worker_id:
        req.decode_worker = dest.worker_id
    else:
        req.prefill_worker = dest.worker_id
    source.requests.discard(req.request_id)
    dest.requests.add(req.request_id)


def release(req: TrackedRequest, view: WorkerView) -> None:
    """`view`'s worker no longer holds `req`: its prefill copy freed, or its decode worker lost it (the
    request goes on elsewhere)."""
    view.requests.discard(req.request_id)
    if req.decode_worker == view.worker_id:
        req.decode_worker = None


def forget(view: WorkerView, request_id: str) -> None:
    """`view`'s worker no longer holds a request that has ended or that the fleet no longer follows (the
    ended request keeps naming the workers it ran on: they are its record)."""
    view.requests.discard(request_id)


def rename(requests: list[TrackedRequest], old: str, new: str) -> None:
    """Worker `old` is `new` now (a migration's standby took its source's id, or a switch kept the sessions it
    held): the requests given name it so; its view moves with it."""
    for req in requests:
        if req.decode_worker == old:
            req.decode_worker = new
        if req.prefill_worker == old:
            req.prefill_worker = new
