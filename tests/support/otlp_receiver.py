"""An OTLP/HTTP traces endpoint on 127.0.0.1 that decodes what it receives with opentelemetry-proto (the tracing
test's collector, and scripts/bench_tracing.py's)."""

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@contextmanager
def otlp_receiver() -> Iterator[tuple[str, list]]:
    """An OTLP/HTTP traces endpoint; yields its URL and the spans it received (protobuf Span messages)."""
    spans: list = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            assert self.path == "/v1/traces" and self.headers["Content-Type"] == "application/x-protobuf"
            export = ExportTraceServiceRequest.FromString(body)
            spans.extend(span for resource in export.resource_spans for scope in resource.scope_spans
                         for span in scope.spans)
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces", spans
    finally:
        server.shutdown()
