"""Tokens from the workers' step reports to their clients: each token appended to its request and pushed
through its text stream (stop strings are the controller's), the request's end when it comes, and each
step's model time shared among the requests in it. A prefill worker's first token ends the request's prefill:
it comes with the KV handoff (`TokenEvent.handoff`), which goes on to handoff routing from the same event. A
token from a copy of a request that no longer holds it (a session continued elsewhere, or cancelled) is
dropped and that copy aborted, with any KV it published."""

import time

from fleetctl.domain import Phase, WorkerRole
from fleetctl.engine.fleet import placement
from fleetctl.engine.fleet.dispatch import Dispatcher
from fleetctl.engine.fleet.handoff import HandoffRouting
from fleetctl.engine.fleet.request import RequestStage, StreamEvent
from fleetctl.engine.fleet.state import FleetState
from fleetctl.engine.worker import protocol as m


class TokenStreams:
    def __init__(self, state: FleetState, dispatcher: Dispatcher, handoffs: HandoffRouting) -> None:
        self.state = state
        self.dispatcher = dispatcher
        self.handoffs = handoffs

    def on_step(self, wid: str, report: m.StepReport) -> None:
        self._attribute_model_time(report)
        if report.phase is Phase.PREFILL:  # their prefill is done: no longer work ahead of the worker's next prompt
            prefilling = self.state.views[wid].prefilling
            for event in report.tokens:
                prefilling.pop(event.request_id, None)
        for event in report.tokens:
            self._on_token(wid, event)

    def _attribute_model_time(self, report: m.StepReport) -> None:
        """Split the step's seconds among its sequences by the tokens they computed in it (for `classify`:
        tokens a prefix cache served cost no model time), count each prefill's cached and computed tokens,
        and note when a request's prefill began."""
        total = sum(report.seq_tokens) + sum(report.chunks.values()) or 1
        ran = [*zip((e.request_id for e in report.tokens), report.seq_tokens, strict=True), *report.chunks.items()]
        for request_id, tokens in ran:
            req = self.state.requests.get(request_id)
            if req is None:
                continue
            share = report.seconds * tokens / total
            req.mask_s += report.mask_seconds.get(request_id, 0.0)
            if report.phase is Phase.PREFILL:
                req.times.prefill_start = req.times.prefill_start or report.ended_at - report.seconds
                req.prefill_model_s += share
                req.prefill_cached_tokens += report.cached_tokens.get(request_id, 0)
                for tier, served in report.tier_tokens.get(request_id, {}).items():
                    req.tier_cached_tokens[tier] = req.tier_cached_tokens.get(tier, 0) + served
                req.prefill_computed_tokens += tokens
            else:
                req.decode_model_s += share

    def _on_token(self, wid: str, event: m.TokenEvent) -> None:
        req = self.state.requests.get(event.request_id)
        if req is None or req.done or req.holder() != wid:
            if not event.finished:  # a session continued elsewhere (or cancelled): stop this copy
                self.state.send(wid, m.Abort(event.request_id))
            if event.handoff is not None:
                event.handoff.handle.unlink()
            return
        req.output_token_ids.append(event.token_id)
        req.suspect = False  # it came through a step
        now = time.time()
        if req.times.first_token is None:
            req.times.first_token = now
        else:
            req.token_buckets.add(now - req.times.first_token)
            req.times.second_token = req.times.second_token or now
        delta = req.stream.push(event.token_id)
        if req.stream.stopped:
            self.dispatcher.release_everywhere(req)
            self.dispatcher.finish(req, "stop", StreamEvent(event.token_id, delta, "stop", logprobs=event.logprobs))
        elif event.finished:
            placement.forget(self.state.views[wid], req.request_id)  # it ends here
            reason = event.finish_reason or "stop"
            self.dispatcher.finish(req, reason, StreamEvent(event.token_id, delta + req.stream.flush(), reason,
                                                            logprobs=event.logprobs))
        else:
            req.events.put_nowait(StreamEvent(token_id=event.token_id, text=delta, logprobs=event.logprobs))
            if req.stage is RequestStage.PREFILL and self.state.views[wid].role is WorkerRole.PREFILL:
                self.handoffs.on_prefill_end(req, event.handoff)
