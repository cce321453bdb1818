"""`serve --otlp-endpoint`: a real fleet (1 prefill + 2 decode workers, steps slowed) exports each request's trace
over OTLP/HTTP to a receiver in this test, which decodes the protobuf with opentelemetry-proto. A request's spans
are one `request` root over admission, queue, prefill (on its prefill worker), the KV handoff (with its bytes) and
decode (on its decode worker), their times those of its `/fleet/requests` record; a session moved live has a
`move` span naming both workers."""

import itertools
from pathlib import Path

import httpx
import pytest
from support.fleet_harness import Stream, decoding_on, fleetctl, serve, start_streams, wait_until
from support.otlp_receiver import otlp_receiver

pytestmark = pytest.mark.fleet  # real worker processes, a real server, a real OTLP/HTTP exchange

FLEET = ("--prefill", "1", "--decode", "2", "--devices", "cpu:0,cpu:1,cpu:2", "--deterministic")


def attributes(span) -> dict[str, object]:
    return {kv.key: getattr(kv.value, kv.value.WhichOneof("value")) for kv in span.attributes}


def seconds(span) -> float:
    return (span.end_time_unix_nano - span.start_time_unix_nano) / 1e9


def trace_of(spans: list, request_id: str) -> tuple[object, dict[str, list]]:
    """The request's root span and its children by name (each checked to be the root's child)."""
    roots = [s for s in spans if s.name == "request" and attributes(s)["fleet.request_id"] == request_id]
    assert len(roots) == 1, f"{len(roots)} traces of {request_id}"
    root = roots[0]
    assert not root.parent_span_id
    children: dict[str, list] = {}
    for span in spans:
        if span.trace_id == root.trace_id and span is not root:
            assert span.parent_span_id == root.span_id, span.name
            children.setdefault(span.name, []).append(span)
    return root, children


def test_each_request_is_a_trace_whose_spans_are_its_record(tiny_model_dir: Path) -> None:
    with otlp_receiver() as (endpoint, spans), serve(tiny_model_dir, *FLEET, "--otlp-endpoint", endpoint,
               env={"FLEET_FAULTS": "step=stall:0.03"}) as url:
        model = tiny_model_dir.name
        answer = httpx.post(f"{url}/v1/completions", timeout=120, json={
            "model": model, "prompt": "Prefill reads the prompt, decode writes the answer.", "max_tokens": 6})
        assert answer.status_code == 200
        short_id = answer.json()["id"]
        stream = start_streams(url, [Stream("A session that moves between decode workers.",
                                            request_id="s0")], 48, model)
        assert wait_until(lambda: decoding_on(url, "s0", 4) is not None, 120)
        source = decoding_on(url, "s0", 4)
        target = "decode-1" if source == "decode-0" else "decode-0"
        moved = fleetctl("move", "s0", "--to", target, "--url", url)
        assert moved.returncode == 0, moved.stderr
        stream.result(timeout=300)
        records = {r["request_id"]: r for r in httpx.get(f"{url}/fleet/requests", timeout=10).json()["requests"]}
        # the fleet stopped: its tracer exported what was queued

    record = records[short_id]
    root, children = trace_of(spans, short_id)
    assert set(children) == {"admission", "queue", "prefill", "kv_handoff", "decode"}
    assert attributes(root)["fleet.output_tokens"] == record["output_tokens"] == 6
    assert seconds(root) == pytest.approx(record["e2e_s"], abs=1e-3)
    assert seconds(children["queue"][0]) == pytest.approx(record["queue_s"], abs=1e-3)
    assert seconds(children["prefill"][0]) == pytest.approx(record["prefill_s"], abs=1e-3)
    assert attributes(children["prefill"][0])["fleet.worker"] == record["prefill_worker"] == "prefill-0"
    handoff = attributes(children["kv_handoff"][0])
    assert handoff["fleet.bytes"] == record["handoff_bytes"] > 0
    assert handoff["fleet.destination"] == record["decode_worker"]
    assert attributes(children["decode"][0])["fleet.worker"] == record["decode_worker"]
    ordered = [children[name][0] for name in ("admission", "queue", "prefill", "kv_handoff", "decode")]
    assert all(a.start_time_unix_nano <= b.start_time_unix_nano for a, b in itertools.pairwise(ordered))
    assert root.start_time_unix_nano <= ordered[0].start_time_unix_nano
    assert ordered[-1].end_time_unix_nano <= root.end_time_unix_nano

    _, moved_children = trace_of(spans, "s0")
    move = attributes(moved_children["move"][0])
    assert (move["fleet.source"], move["fleet.destination"]) == (source, target) and move["fleet.bytes"] > 0
    assert attributes(moved_children["decode"][0])["fleet.worker"] == records["s0"]["decode_worker"] == target
