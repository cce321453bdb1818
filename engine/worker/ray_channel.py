"""The controller's end of a Ray worker's channel. The actor connects back to a TCP port with
multiprocessing's `Client`; from then on both ends hold the same pickled `Connection` as a local pipe,
so the worker loop and the controller's `WorkerLink` run unchanged. Accepting happens on a thread:
launching never blocks the controller's event loop, and `send`/`recv` wait until the actor is in.
Ray-free and torch-free."""

import contextlib
import os
import socket
import threading
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection, answer_challenge, deliver_challenge

ACCEPT_POLL_S = 0.5


def no_delay(sock: socket.socket) -> None:
    """Send each message at once: `Connection` writes a large message's header and body separately, and
    Nagle's algorithm would hold the body back for the peer's delayed acknowledgement (up to 40 ms)."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def connect(address: tuple[str, int], authkey: bytes) -> Connection:
    """The actor's end: multiprocessing's authenticated `Client`, without Nagle's delay."""
    conn = Client(address, authkey=authkey)
    with socket.socket(fileno=os.dup(conn.fileno())) as sock:
        no_delay(sock)
    return conn


class SocketChannel:
    def __init__(self, host: str, authkey: bytes) -> None:
        self._authkey = authkey
        self._server = socket.create_server((host, 0))
        self._server.settimeout(ACCEPT_POLL_S)
        self.address: tuple[str, int] = (host, self._server.getsockname()[1])
        self._conn: Connection | None = None
        self._closed = False
        self._ready = threading.Event()
        threading.Thread(target=self._accept, daemon=True, name=f"accept-{self.address[1]}").start()

    def _accept(self) -> None:
        try:
            while not self._closed:
                try:
                    sock, _ = self._server.accept()
                except TimeoutError:
                    continue
                no_delay(sock)
                conn = Connection(sock.detach())
                try:  # the same handshake as multiprocessing's Listener: only the actor holding the key gets in
                    deliver_challenge(conn, self._authkey)
                    answer_challenge(conn, self._authkey)
                except (OSError, EOFError, ValueError, AuthenticationError):
                    conn.close()
                    continue
                self._conn = conn
                return
        finally:
            self._server.close()
            self._ready.set()

    def _connected(self) -> Connection:
        self._ready.wait()
        if self._conn is None or self._closed:
            raise EOFError("the worker's channel is closed")
        return self._conn

    def send(self, msg: object) -> None:
        self._connected().send(msg)

    def recv(self) -> object:
        return self._connected().recv()

    def close(self) -> None:
        """End the channel from this side (the actor died): a reader blocked in `recv` gets EOF."""
        self._closed = True
        if self._conn is not None:
            with contextlib.suppress(OSError), socket.socket(fileno=os.dup(self._conn.fileno())) as sock:
                sock.shutdown(socket.SHUT_RDWR)
