"""Moving a decode worker that holds 16 sessions of ~512 tokens (default model): checkpoint seconds and
bytes, restore seconds, migrate downtime, against a cold start that starts a new process, reloads the
model and re-prefills every session (target: migrate downtime >= 10x shorter).

    python scripts/bench_migrate.py [--model smollm2-135m] [--sessions 16] [--prompt-words 400]

Runs one fleet (1 prefill + 1 decode worker on cpu:0/cpu:1, spare slots cpu:2/cpu:3) with the sessions
streaming throughout: migrate decode-0 to cpu:2; then checkpoint it, make the checkpoint incompatible
(another torch version in its manifest) and restore it on cpu:3 — a cold start, measured from the
restore request (new process + model load + re-prefill) to the first token.
"""

import argparse
import asyncio
import json
import threading
import time

import httpx

from fleetctl.console.local_fleet import local_fleet
from fleetctl.console.models_cmd import resolve_model
from fleetctl.console.traces import WORDS


def run_op(url: str, path: str, body: dict) -> dict:
    op = httpx.post(f"{url}{path}", json=body, timeout=60).json()
    while op["state"] == "running":
        time.sleep(0.05)
        op = httpx.get(f"{url}/fleet/operations/{op['id']}", timeout=60).json()
    if op["state"] != "done":
        raise SystemExit(f"{path} failed: {op['error']}")
    return op["result"]


def sessions(url: str) -> int:
    workers = httpx.get(f"{url}/fleet/workers", timeout=60).json()["workers"]
    return next(w["sessions"] for w in workers if w["id"] == "decode-0")


def stream_all(url: str, model: str, prompts: list[str], max_tokens: int, errors: list[str]) -> None:
    async def one(http: httpx.AsyncClient, prompt: str) -> None:
        body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                "stream": True}
        async with http.stream("POST", "/v1/completions", json=body) as response:
            async for line in response.aiter_lines():
                if '"error"' in line:
                    errors.append(line)

    async def main() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(3600.0)) as http:
            await asyncio.gather(*[one(http, p) for p in prompts])

    asyncio.run(main())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--prompt-words", type=int, default=400)
    parser.add_argument("--max-tokens", type=int, default=400)
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args()
    model_dir = resolve_model(args.model)
    prompts = [f"Session {i}: " + " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(args.prompt_words))
               for i in range(args.sessions)]
    with local_fleet(model_dir, "--prefill", "1", "--decode", "1", "--devices", "cpu:0,cpu:1",
                     "--dtype", args.dtype) as url:
        model = httpx.get(f"{url}/v1/models", timeout=60).json()["data"][0]["id"]
        errors: list[str] = []
        streams = threading.Thread(target=stream_all, args=(url, model, prompts, args.max_tokens, errors))
        streams.start()
        while sessions(url) < args.sessions:
            time.sleep(0.2)
        time.sleep(1.0)  # every session decoding
        migrated = run_op(url, "/fleet/workers/decode-0/migrate", {"to": "cpu:2"})
        print("migrate", json.dumps(migrated), flush=True)
        saved = run_op(url, "/fleet/workers/decode-0/checkpoint", {"hold_s": 600})
        print("checkpoint", json.dumps(saved), flush=True)
        manifest_path = f"{saved['checkpoint']}/manifest.json"
        with open(manifest_path) as f:
            manifest = json.load(f)
        manifest["compat"]["torch"] = "another-torch"
        with open(manifest_path, "w") as f:
            json.dump(manifest, f)
        cold = run_op(url, "/fleet/restore", {"checkpoint": saved["checkpoint"], "device": "cpu:3"})
        print("cold start", json.dumps(cold), flush=True)
        streams.join()
    print(f"sessions {migrated['sessions']}, checkpoint {saved['bytes'] / 2**20:.1f} MiB in {saved['seconds']:.3f} s "
          f"(migrate: write {migrated['checkpoint_s']:.3f} s, restore {migrated['restore_s']:.3f} s)")
    print(f"migrate downtime {migrated['downtime_s']:.3f} s vs cold start {cold['downtime_s']:.3f} s: "
          f"{cold['downtime_s'] / migrated['downtime_s']:.1f}x shorter (target >= 10x); stream errors: {len(errors)}")


if __name__ == "__main__":
    main()
