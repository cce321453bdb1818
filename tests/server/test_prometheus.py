"""A real Prometheus (Debian's `prometheus`, installed by `make test` as chromium is) scraping a real fleet's
/metrics every second: the utilization gauges, the TTFT histogram and the KV handoff counters are queried through
its HTTP API, and every expression of the Grafana dashboard shipped in docs/grafana/fleetctl.json parses and
returns data there."""

import json
import shutil
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from support.fleet_harness import free_port, serve, wait_until

pytestmark = pytest.mark.fleet  # real worker processes, a real server and a real Prometheus

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "fleetctl.json"
RATE_INTERVAL = "30s"  # what Grafana would put for $__rate_interval at a 1 s scrape interval


@contextmanager
def prometheus(target: str, folder: Path) -> Iterator[str]:
    """A Prometheus scraping `target` (host:port) every second; yields its URL."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("no prometheus binary: `make test` installs Debian's prometheus package")
    port = free_port()
    config = folder / "prometheus.yml"
    config.write_text("global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
                      "scrape_configs:\n"
                      f"  - {{job_name: fleetctl, static_configs: [{{targets: ['{target}']}}]}}\n")
    process = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={folder / 'data'}",
                                f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        assert wait_until(lambda: _ready(url) or process.poll() is not None, 60), "prometheus never became ready"
        assert process.poll() is None, process.stderr.read() if process.stderr else ""
        yield url
    finally:
        process.terminate()
        process.wait(10)


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/-/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def query(url: str, expr: str) -> list[dict]:
    """The result vector of an instant query (an expression Prometheus cannot parse fails the test)."""
    answer = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10).json()
    assert answer["status"] == "success", (expr, answer)
    return answer["data"]["result"]


def dashboard_expressions() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"].replace("$__rate_interval", RATE_INTERVAL) for panel in panels
            for target in panel["targets"]]


@contextmanager
def traffic(url: str, model: str) -> Iterator[None]:
    """Completions one after another until the block ends (rates need counters that grow between scrapes)."""
    stop = threading.Event()

    def send() -> None:
        with httpx.Client(timeout=60) as client:
            while not stop.is_set():
                client.post(f"{url}/v1/completions", json={"model": model, "prompt": "The fleet serves " * 8,
                                                           "max_tokens": 8, "temperature": 0})

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(60)


def test_prometheus_scrapes_the_fleet_and_the_dashboard_queries_return_data(tiny_model_dir: Path,
                                                                            tmp_path: Path) -> None:
    fleet = ("--prefill", "1", "--decode", "1", "--devices", "cpu:0,cpu:1")
    with serve(tiny_model_dir, *fleet) as url, prometheus(urlsplit(url).netloc, tmp_path) as prom, \
            traffic(url, tiny_model_dir.name):
        assert wait_until(lambda: len(query(prom, 'fleet_worker_mbu{job="fleetctl"}')) == 2, 60)
        roles = {series["metric"]["worker"]: series["metric"]["role"]
                 for series in query(prom, "fleet_worker_mbu")}
        assert roles == {"prefill-0": "prefill", "decode-0": "decode"}
        ttft_p50 = "histogram_quantile(0.5, sum by (le) (rate(fleet_time_to_first_token_seconds_bucket[30s])))"
        assert wait_until(lambda: _positive(query(prom, ttft_p50)), 60)
        handoffs = 'fleet_kv_handoffs_total{route="local"}'
        assert wait_until(lambda: _positive(query(prom, handoffs)), 60)  # every request's KV went decode-ward
        expressions = dashboard_expressions()
        assert len(expressions) >= 20
        empty = [e for e in expressions if not wait_until(lambda e=e: bool(query(prom, e)), 20)]
        assert empty == []
        scrape = float(query(prom, 'scrape_duration_seconds{job="fleetctl"}')[0]["value"][1])
        print(f"scrape of /metrics (2 workers): {scrape * 1000:.1f} ms")


def _positive(result: list[dict]) -> bool:
    return any(float(series["value"][1]) > 0 for series in result)
