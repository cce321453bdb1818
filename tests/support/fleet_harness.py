"""Helpers for integration tests against a real `fleetctl serve` process on 127.0.0.1."""

import asyncio
import copy
import json
import os
import socket
import subprocess
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai

from fleetctl.console.loadgen.local_fleet import FLEETCTL
from fleetctl.console.loadgen.local_fleet import local_fleet as serve

__all__ = ["Stream", "admin", "decoding_on", "fleetctl", "free_port", "generate_json", "serve", "start_streams",
           "wait_until", "worker_pids", "workers"]


def admin() -> dict[str, str]:
    """The header calls that change a fleet need (the token `serve` wrote under this test run's $FLEET_HOME)."""
    from fleetctl.engine.api.admin_token import read_admin_token

    return {"Authorization": f"Bearer {read_admin_token()}"}


def fleetctl(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*FLEETCTL, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


_generated: dict[tuple, list[dict]] = {}  # generate_json's answers, by its arguments


def generate_json(model: Path, prompts: list[str], *extra: str, env: dict | None = None) -> list[dict]:
    """`fleetctl generate --json` for the prompts (one batch), parsed; `env` adds to the environment. Run once a test
    session for the same arguments: tests compare a fleet's streams with it, several modules with the same run
    (a process that loads the model and decodes hundreds of tokens)."""
    key = (model, tuple(prompts), extra, tuple(sorted((env or {}).items())))
    if key not in _generated:
        result = fleetctl("generate", "--model", str(model), "--json", *extra, *prompts, env=env)
        assert result.returncode == 0, result.stderr
        _generated[key] = [json.loads(line) for line in result.stdout.splitlines()]
    return copy.deepcopy(_generated[key])


def cli_json(*args: str) -> dict:
    """A fleetctl command's --json answer (it must succeed)."""
    result = fleetctl(*args, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def worker_pids(url: str) -> dict[str, int]:
    workers = httpx.get(f"{url}/fleet/workers", timeout=10).json()["workers"]
    return {w["id"]: w["pid"] for w in workers}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (at the time of asking)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


@dataclass(frozen=True)
class Stream:
    """One streamed completion: greedy unless `temperature` (with `seed`) says otherwise; `request_id` is sent
    as X-Request-Id (to find the session on its worker); `extra_body` adds fields to the request."""
    prompt: str
    temperature: float = 0.0
    seed: int | None = None
    request_id: str | None = None
    extra_body: dict[str, object] = field(default_factory=dict)


def start_streams(url: str, streams: Sequence[str | Stream], max_tokens: int,
                  model: str = "tiny-llama0") -> "Future[list[str]]":
    """The streams (a plain prompt: greedy) at once, EOS ignored, in a thread: the future gives their texts in
    order, or raises what failed one of them."""
    wanted = [Stream(s) if isinstance(s, str) else s for s in streams]

    async def run() -> list[str]:
        api = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)

        async def one(stream: Stream) -> str:
            headers = {"X-Request-Id": stream.request_id} if stream.request_id else None
            seed = {"seed": stream.seed} if stream.seed is not None else {}
            chunks = await api.completions.create(model=model, prompt=stream.prompt, max_tokens=max_tokens,
                                                  temperature=stream.temperature, stream=True,
                                                  extra_body={"ignore_eos": True, **stream.extra_body},
                                                  extra_headers=headers, **seed)
            return "".join([c.choices[0].text async for c in chunks if c.choices])

        return await asyncio.gather(*[one(s) for s in wanted])

    runner = ThreadPoolExecutor(1)
    try:
        return runner.submit(asyncio.run, run())
    finally:
        runner.shutdown(wait=False)  # the streams run on; the thread ends with them


def workers(url: str) -> dict[str, dict]:
    """/fleet/workers by worker id."""
    return {w["id"]: w for w in httpx.get(f"{url}/fleet/workers", timeout=10).json()["workers"]}


def decoding_on(url: str, request_id: str, min_tokens: int, decode_workers: Sequence[str] = ("decode-0", "decode-1"),
                ) -> str | None:
    """The decode worker holding session `request_id` once it has decoded `min_tokens` tokens, else None."""
    for worker in decode_workers:
        sessions = httpx.get(f"{url}/fleet/workers/{worker}/sessions", timeout=10).json()["sessions"]
        if any(s["id"] == request_id and s["stage"] == "decode" and s["output_tokens"] >= min_tokens
               for s in sessions):
            return worker
    return None


def move_each_live(url: str, request_ids: Sequence[str]) -> None:
    """Move each session live to the other of decode-0 and decode-1, once it has decoded 8 tokens where it is."""
    for request_id in request_ids:
        assert wait_until(lambda request_id=request_id: decoding_on(url, request_id, 8) is not None, 60)
        to = "decode-1" if decoding_on(url, request_id, 8) == "decode-0" else "decode-0"
        moved = httpx.post(f"{url}/fleet/requests/{request_id}/move", json={"to": to}, headers=admin(), timeout=30)
        assert moved.status_code in (200, 202), moved.text
