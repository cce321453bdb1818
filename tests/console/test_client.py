"""The one fleet client, sync and async: a fleet that does not answer is FleetUnreachable, one that answers with
an HTTP error is FleetRefused carrying the status and the fleet's own message (or the start of a body that is not
the fleet's error JSON); a success is the contract's model, and one that is not (or not JSON) is one
FleetAnswerInvalid line."""

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from fleetctl.console.client import AsyncFleetClient, FleetAnswerInvalid, FleetClient, FleetRefused, FleetUnreachable
from fleetctl.engine.api.status import WorkerList

NO_FLEET = "127.0.0.1:9"  # discard port: nothing answers HTTP there
ANSWERS = {  # path -> (status, content type, body)
    "/fleet/workers": (200, "application/json", json.dumps({"workers": []})),
    "/fleet/workers/decode-0/drain": (409, "application/json",
                                      json.dumps({"error": {"message": "decode-0 is draining"}})),
    "/fleet/status": (500, "text/plain", "  Internal Server Error  "),
    "/fleet/checkpoints": (200, "application/json", json.dumps({"checkpoints": [{"name": 7}]})),
    "/fleet/operations/op-1": (200, "text/html", "<html>a proxy's page</html>"),
}


class Fleet(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        status, kind, body = ANSWERS[self.path.split("?")[0]]
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.end_headers()
        self.wfile.write(body.encode())

    do_POST = do_GET

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Fleet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"  # no scheme: the client adds it
    server.shutdown()


def test_answers_and_refusals_are_decoded_once_for_both_clients(url: str) -> None:
    sync = FleetClient(url)
    assert sync.workers() == WorkerList(workers=[])
    with pytest.raises(FleetRefused) as refused:
        sync.start("/fleet/workers/decode-0/drain", {"move": False})
    assert (refused.value.status, refused.value.message) == (409, "decode-0 is draining")
    assert str(refused.value) == "POST /fleet/workers/decode-0/drain: HTTP 409: decode-0 is draining"

    async def asynchronous() -> tuple[WorkerList, FleetRefused]:
        client = AsyncFleetClient(url)
        try:
            answer = await client.workers()
            try:
                await client.status()
            except FleetRefused as exc:
                return answer, exc
            raise AssertionError("HTTP 500 was not refused")
        finally:
            await client.close()

    answer, broken = asyncio.run(asynchronous())
    assert answer == WorkerList(workers=[])
    assert (broken.status, str(broken)) == (500, "GET /fleet/status: HTTP 500: Internal Server Error")


def test_an_answer_that_is_not_the_contract_is_one_error(url: str) -> None:
    with pytest.raises(FleetAnswerInvalid) as invalid:
        FleetClient(url).checkpoints()
    assert str(invalid.value) == ("GET /fleet/checkpoints: the answer is not a valid CheckpointList: "
                                  "checkpoints.0.checkpoint: Field required (and 3 more)")

    async def not_json() -> FleetAnswerInvalid:
        client = AsyncFleetClient(url)
        try:
            await client.operation("op-1")
        except FleetAnswerInvalid as exc:
            return exc
        finally:
            await client.close()
        raise AssertionError("a page that is not JSON was taken for an operation")

    assert str(asyncio.run(not_json())) == ("GET /fleet/operations/op-1: the answer is not a valid JSON body: "
                                            "<html>a proxy's page</html>")


def test_no_answer_is_unreachable() -> None:
    with pytest.raises(FleetUnreachable) as sync:
        FleetClient(NO_FLEET, timeout=2.0).status()
    assert (sync.value.url, sync.value.cause) == ("http://127.0.0.1:9", "ConnectError")
    assert str(sync.value) == "no fleet answers at http://127.0.0.1:9 (ConnectError)"

    async def asynchronous() -> FleetUnreachable:
        client = AsyncFleetClient(NO_FLEET, timeout=2.0)
        try:
            await client.start("/fleet/workers", {})
        except FleetUnreachable as exc:
            return exc
        finally:
            await client.close()
        raise AssertionError("nothing answered, yet no error")

    assert str(asyncio.run(asynchronous())) == str(sync.value)
