"""An idle keep-alive connection outlives every common client's idle expiry (httpx's and the openai client's 5 s):
with the server closing it at the same 5 s, a request sent on a pooled connection just as the server closed it was
reset — the demo's `ReadError:` with no message, 3 of 300 requests sent 5 s apart. A real server still answers on
the same connection after 6 s of silence."""

import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from support.fleet_harness import serve

from fleetctl.console.cli.serve import KEEP_ALIVE_S

pytestmark = pytest.mark.fleet  # real worker processes and a real server

HTTPX_KEEPALIVE_EXPIRY_S = 5.0  # httpx.Limits' default, which the openai client keeps
FLEET = ("--prefill", "1", "--decode", "1", "--devices", "cpu:0,cpu:1", "--dtype", "float32")


def health(connection: socket.socket, host: str) -> bytes:
    """GET /health on `connection`: the whole response (head and body), or what came before the server closed."""
    connection.sendall(f"GET /health HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    response = b""
    while b"\r\n\r\n" not in response and (chunk := connection.recv(65536)):
        response += chunk
    head, _, body = response.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length and (chunk := connection.recv(65536)):
        body += chunk
    return head + b"\r\n\r\n" + body if head else b""


def test_an_idle_connection_still_answers_past_the_clients_expiry(tiny_model_dir: Path) -> None:
    assert KEEP_ALIVE_S > 2 * HTTPX_KEEPALIVE_EXPIRY_S
    with serve(tiny_model_dir, *FLEET) as url:
        address = urlsplit(url)
        with socket.create_connection((address.hostname, address.port), timeout=10) as connection:
            first = health(connection, address.netloc)
            time.sleep(HTTPX_KEEPALIVE_EXPIRY_S + 1.0)
            second = health(connection, address.netloc)
    assert first.startswith(b"HTTP/1.1 200")
    assert second.startswith(b"HTTP/1.1 200"), second  # b"": the server had closed it
