"""Helpers for integration tests against a real `fleetctl serve` process on 127.0.0.1."""

import asyncio
import json
import os
import subprocess
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import httpx
import openai

from fleetctl.console.loadgen.local_fleet import FLEETCTL
from fleetctl.console.loadgen.local_fleet import local_fleet as serve

__all__ = ["admin", "fleetctl", "generate_json", "serve", "start_streams", "wait_until", "worker_pids", "workers"]


def admin() -> dict[str, str]:
    """The header calls that change a fleet need (the token `serve` wrote under this test run's $FLEET_HOME)."""
    from fleetctl.engine.server.admin_auth import read_admin_token

    return {"Authorization": f"Bearer {read_admin_token()}"}


def fleetctl(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*FLEETCTL, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def generate_json(model: Path, prompts: list[str], *extra: str) -> list[dict]:
    """`fleetctl generate --json` for the prompts (one batch), parsed."""
    result = fleetctl("generate", "--model", str(model), "--json", *extra, *prompts)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def worker_pids(url: str) -> dict[str, int]:
    workers = httpx.get(f"{url}/fleet/workers", timeout=10).json()["workers"]
    return {w["id"]: w["pid"] for w in workers}


def wait_until(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def start_streams(url: str, prompts: list[str], max_tokens: int, model: str = "tiny-llama0") -> "Future[list[str]]":
    """Greedy streamed completions of `prompts` (EOS ignored) in a thread: the future gives their texts."""
    async def run() -> list[str]:
        api = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)

        async def one(prompt: str) -> str:
            stream = await api.completions.create(model=model, prompt=prompt, max_tokens=max_tokens,
                                                  temperature=0, stream=True, extra_body={"ignore_eos": True})
            return "".join([c.choices[0].text async for c in stream if c.choices])

        return await asyncio.gather(*[one(p) for p in prompts])

    return ThreadPoolExecutor(1).submit(asyncio.run, run())


def workers(url: str) -> dict[str, dict]:
    """/fleet/workers by worker id."""
    return {w["id"]: w for w in httpx.get(f"{url}/fleet/workers", timeout=10).json()["workers"]}
