"""`fleetctl serve`'s options a vLLM user reaches for — a served model name, an API key on /v1/*, a
context cap — plus /version, /tokenize, /detokenize, vLLM's counters, and a fleet whose workers cannot
start saying why in one line."""

from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.fleet_harness import fleetctl, serve

pytestmark = pytest.mark.fleet


def test_served_name_api_key_and_context_cap(tiny_model_dir: Path) -> None:
    with serve(tiny_model_dir, "--prefill", "1", "--decode", "1", "--devices", "cpu:0,cpu:1", "--served-model-name",
               "house-model", "--api-key", "k-123", "--max-model-len", "100") as url:
        assert httpx.post(f"{url}/v1/completions", json={"model": "house-model", "prompt": "hi"}).status_code == 401
        api = openai.OpenAI(base_url=f"{url}/v1", api_key="k-123", max_retries=0, timeout=60)
        assert [m.id for m in api.models.list().data] == ["house-model"]
        done = api.completions.create(model="house-model", prompt="hello", max_tokens=4, temperature=0)
        assert done.usage.completion_tokens == 4
        with pytest.raises(openai.BadRequestError, match="context of 100 tokens"):
            api.completions.create(model="house-model", prompt="hello", max_tokens=200)
        assert httpx.get(f"{url}/version").json()["model"] == "house-model"
        tokens = httpx.post(f"{url}/tokenize", json={"prompt": "hello world"}).json()
        assert tokens["count"] == len(tokens["tokens"]) > 0 and tokens["max_model_len"] == 100
        chat = httpx.post(f"{url}/tokenize", json={"messages": [{"role": "user", "content": "hello world"}]}).json()
        assert chat["count"] > tokens["count"]  # the chat template adds its markers
        assert httpx.post(f"{url}/detokenize", json={"tokens": tokens["tokens"]}).json()["prompt"] == "hello world"
        assert httpx.post(f"{url}/detokenize", json={"tokens": [10**7]}).status_code == 400
        names = {f.name for f in text_string_to_metric_families(httpx.get(f"{url}/metrics").text)}
        assert {"vllm:prompt_tokens", "vllm:generation_tokens", "vllm:request_success"} <= names


def test_workers_that_cannot_start_say_why_in_one_line(tiny_model_dir: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in tiny_model_dir.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    weights = broken / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[8:40] = b"x" * 32  # the safetensors header is no longer JSON
    weights.write_bytes(bytes(data))
    result = fleetctl("serve", "--model", str(broken), "--port", "0", "--prefill", "1", "--decode", "1",
                      "--devices", "cpu:0,cpu:1", timeout=120)
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("fleetctl: error:")]
    assert len(errors) == 1 and "prefill-0 (SafetensorError" in errors[0], result.stderr
    assert "Traceback" not in result.stderr


def test_serve_logs_requests_and_a_periodic_stats_line_and_status_names_its_window(tiny_model_dir: Path,
                                                                                   tmp_path: Path) -> None:
    import re
    import subprocess
    import time

    from fleetctl.console.loadgen.local_fleet import FLEETCTL

    log = tmp_path / "serve.log"
    with log.open("w") as out:
        proc = subprocess.Popen([*FLEETCTL, "serve", "--model", str(tiny_model_dir), "--port", "0", "--prefill", "1",
                                 "--decode", "1", "--devices", "cpu:0,cpu:1"], stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while not (found := re.search(r"serving \S+ on (http://\S+)", log.read_text())):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        url = found.group(1)
        body = {"model": tiny_model_dir.name, "prompt": "hello", "max_tokens": 4}
        assert httpx.post(f"{url}/v1/completions", json=body, timeout=60).status_code == 200
        status = fleetctl("status", "--url", url)
        assert "over the last 5 s" in status.stdout, status.stdout  # the window busy/MFU/MBU are measured over
        deadline = time.monotonic() + 60
        while "generation" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.5)
        text = log.read_text()
        assert re.search(r'"POST /v1/completions HTTP/1\.1" 200', text), text  # the access log
        stats = next(line for line in text.splitlines() if "fleetctl.stats" in line and "generation" in line)
        for part in ("tokens/s", "running", "waiting", "KV"):
            assert part in stats, stats
    finally:
        proc.terminate()
        proc.wait(60)
