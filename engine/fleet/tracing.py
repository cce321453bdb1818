"""OpenTelemetry traces of the request path (`serve --otlp-endpoint URL`): one trace per finished request, exported
over OTLP/HTTP by the opentelemetry SDK's batch processor (a background thread: the event loop never waits for
the collector, and a collector that is down loses spans, never requests).

A request's spans are made when it ends, from the times the controller kept (`RequestTimes`, the ones its
`/fleet/requests` record is computed from, so the two agree): `request` (arrival → end) is the parent of
`admission` (the controller's checks at arrival: an instant), `queue` (arrival → its prefill step starts),
`prefill` (→ its first token, on its prefill worker, or its decode worker for a local prefill), `kv_handoff` (the
KV on its way to the decode worker, with its bytes), `decode` (→ its end, on the worker that finished it) and one
`move` per live move (its stall: the last token from the source → the first from the destination)."""

from fleetctl.engine.fleet.request import TrackedRequest


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


class RequestTracer:
    def __init__(self, endpoint: str, service_name: str = "fleetctl") -> None:
        # imported here: a fleet without --otlp-endpoint never loads the SDK
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        self.provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
        self.tracer = self.provider.get_tracer("fleetctl.request")

    def on_request_done(self, req: TrackedRequest) -> None:
        from opentelemetry import trace
        from opentelemetry.trace import Status, StatusCode

        record, t = req.record(), req.times
        end = t.finished or t.arrival + record["e2e_s"]
        root = self.tracer.start_span("request", start_time=_ns(t.arrival), attributes={
            "fleet.request_id": req.request_id, "fleet.prompt_tokens": record["prompt_tokens"],
            "fleet.output_tokens": record["output_tokens"], "fleet.outcome": record["outcome"],
            "fleet.session": req.session, "fleet.recomputes": req.recomputes})
        if req.error:
            root.set_status(Status(StatusCode.ERROR, req.error))
        context = trace.set_span_in_context(root)

        def child(name: str, start: float, stop: float, **attributes: str | int | float | bool) -> None:
            span = self.tracer.start_span(name, context=context, start_time=_ns(start),
                                          attributes={f"fleet.{k}": v for k, v in attributes.items()})
            span.end(end_time=_ns(max(start, stop)))

        child("admission", t.arrival, t.arrival)
        prefill_start = t.arrival + record["queue_s"]
        child("queue", t.arrival, prefill_start)
        if t.first_token is not None:
            prefill_worker = req.decode_worker if req.local_prefill else req.prefill_worker
            child("prefill", prefill_start, t.first_token, worker=prefill_worker or "",
                  cached_tokens=req.prefill_cached_tokens, computed_tokens=req.prefill_computed_tokens,
                  local=req.local_prefill)
        if t.handoff_start is not None and t.handoff_end is not None:
            child("kv_handoff", t.handoff_start, t.handoff_end, bytes=t.handoff_bytes, worker_s=t.handoff_seconds,
                  source=req.prefill_worker or "", destination=req.decode_worker or "")
        if t.first_token is not None and req.output_token_ids:
            child("decode", t.handoff_end or t.first_token, end, worker=req.decode_worker or req.prefill_worker or "",
                  output_tokens=len(req.output_token_ids))
        for move in req.moves:
            child("move", move.start, move.end, source=move.source, destination=move.dest, bytes=move.nbytes)
        root.end(end_time=_ns(end))

    def close(self) -> None:
        """Export what is queued (a stopping fleet's last requests) and stop the exporter's thread."""
        self.provider.shutdown()
