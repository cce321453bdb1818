"""A fleet on a two-node Ray cluster (`ray.cluster_utils.Cluster` on this one machine: node1 holds the
prefill worker, node2 the two decode workers, each node a few CPU slots as custom resources): completions,
KV handed off across nodes through the object store, a killed actor's and a lost node's sessions recomputed,
a decode worker migrated across nodes, one checkpointed and restored on another node, and the fleet left
without a decode worker when that node goes too (503). One cluster and one fleet for the module, the tests in order
(each one leaves the fleet as the next expects it), to stay bounded on a 2-core CI machine.

Token identity relies on `--deterministic` (batch-invariant numerics: a recompute or a restore continues
each stream exactly, whatever it is batched with)."""

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from support.fleet_harness import admin, fleetctl, generate_json, serve, start_streams, wait_until

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

pytestmark = pytest.mark.fleet  # a Ray cluster, worker actors and a real server

PROMPTS = ["The quick brown fox", "Once upon a time there was", "def add(a, b):"]
TOKENS = 160
OBJECT_STORE = 80 * 2**20
DEVICES = "node1/cpu:0,node2/cpu:0,node2/cpu:1"


def node_resources(name: str, slots: int) -> dict:
    return {f"fleetctl-node-{name}": 1, "fleetctl-cpu-slot": slots}


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[Cluster, object]]:
    with pytest.MonkeyPatch.context() as env:
        # Ray's memory monitor kills workers when the machine is near full, whoever fills it: on a shared CI
        # machine that would be other tests' memory failing this one
        env.setenv("RAY_memory_monitor_refresh_ms", "0")
        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 1, "resources": node_resources("node1", 2), "object_store_memory": OBJECT_STORE,
            "include_dashboard": False})
        node2 = cluster.add_node(num_cpus=1, resources=node_resources("node2", 2), object_store_memory=OBJECT_STORE)
        ray.init(address=cluster.address, namespace="fleetctl", include_dashboard=False)
        yield cluster, node2
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="module")
def expected(small_model_dir: Path) -> list[str]:
    common = ("--dtype", "float32", "--deterministic", "--max-tokens", str(TOKENS), "--ignore-eos")
    return [r["text"] for r in generate_json(small_model_dir, PROMPTS, *common)]


@pytest.fixture(scope="module")
def url(cluster: tuple[Cluster, object], small_model_dir: Path) -> Iterator[str]:
    with serve(small_model_dir, "--ray", cluster[0].address, "--prefill", "1", "--decode", "2", "--devices", DEVICES,
               "--dtype", "float32", "--deterministic", "--kv-blocks", "256") as url:
        yield url


def workers(url: str) -> dict[str, dict]:
    return {w["id"]: w for w in httpx.get(f"{url}/fleet/workers", timeout=10).json()["workers"]}


def handoffs(url: str, route: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith(f'fleet_kv_handoffs_total{{route="{route}"}}'))


def test_completions_across_nodes_hand_off_through_the_object_store(url: str, expected: list[str]) -> None:
    placed = workers(url)
    assert {wid: (w["node"], w["device"]) for wid, w in placed.items()} == {
        "prefill-0": ("node1", "node1/cpu:0"), "decode-0": ("node2", "node2/cpu:0"),
        "decode-1": ("node2", "node2/cpu:1")}
    assert start_streams(url, PROMPTS, TOKENS, "small-llama0").result(timeout=300) == expected
    assert handoffs(url, "cross-node") >= len(PROMPTS)  # node1's prefill to node2's decode workers
    table = fleetctl("workers", "--url", url)
    assert table.returncode == 0 and "node2" in table.stdout.splitlines()[2]


def test_migrate_decode_worker_to_another_node_is_token_identical(url: str, expected: list[str]) -> None:
    streams = start_streams(url, PROMPTS, TOKENS, "small-llama0")
    assert wait_until(lambda: workers(url)["decode-0"]["sessions"] >= 1, 120)
    result = fleetctl("migrate", "decode-0", "--to", "node1/cpu:1", "--url", url, "--json")
    assert result.returncode == 0, result.stderr
    moved = json.loads(result.stdout)
    assert (moved["from"], moved["to"], moved["mode"]) == ("node2/cpu:0", "node1/cpu:1", "live")
    assert streams.result(timeout=300) == expected
    assert workers(url)["decode-0"]["node"] == "node1"
    local_before = handoffs(url, "local")
    assert start_streams(url, PROMPTS, TOKENS, "small-llama0").result(timeout=300) == expected
    assert handoffs(url, "local") > local_before  # decode-0 now shares node1 with prefill-0: shared memory


def test_killed_actor_has_its_sessions_recomputed(url: str, expected: list[str]) -> None:
    streams = start_streams(url, PROMPTS, TOKENS, "small-llama0")
    assert wait_until(lambda: workers(url)["decode-1"]["sessions"] >= 1, 120)
    (name,) = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith("decode-1-")]
    ray.kill(ray.get_actor(name, namespace="fleetctl"), no_restart=True)
    assert streams.result(timeout=300) == expected
    assert wait_until(lambda: workers(url)["decode-1"]["state"] == "running", 120)  # restarted by the supervisor
    assert 'fleet_worker_failures_total{role="decode"} 1.0' in httpx.get(f"{url}/metrics", timeout=10).text


def test_lost_node_recomputes_its_sessions_and_shows_as_lost(cluster: tuple[Cluster, object], url: str,
                                                             expected: list[str]) -> None:
    streams = start_streams(url, PROMPTS, TOKENS, "small-llama0")
    assert wait_until(lambda: workers(url)["decode-1"]["sessions"] >= 1, 120)
    cluster[0].remove_node(cluster[1])
    assert streams.result(timeout=300) == expected  # continued on decode-0, on node1
    assert wait_until(lambda: workers(url)["decode-1"]["node_lost"], 60)
    assert workers(url)["decode-1"]["state"] == "failed"
    assert "(lost)" in fleetctl("workers", "--url", url).stdout
    refused = httpx.post(f"{url}/fleet/workers", json={"role": "decode", "device": "node2/cpu:0"}, headers=admin(),
                         timeout=30)
    assert refused.status_code == 400 and "node node2 is lost" in refused.text


def test_restore_on_another_node_then_losing_it_refuses_new_requests(cluster: tuple[Cluster, object], url: str,
                                                                     expected: list[str]) -> None:
    """decode-0 (node1, the only decode worker left) is checkpointed mid-stream and restored on a new node3
    (the checkpoint read there from the shared directory): its streams finish there unchanged. Losing node3
    then leaves no decode worker: new requests get 503 naming the lost node, /health says degraded."""
    node3 = cluster[0].add_node(num_cpus=1, resources=node_resources("node3", 1), object_store_memory=OBJECT_STORE)
    cluster[0].wait_for_nodes()
    streams = start_streams(url, PROMPTS, TOKENS, "small-llama0")
    assert wait_until(lambda: workers(url)["decode-0"]["sessions"] >= 1, 120)
    saved = fleetctl("checkpoint", "decode-0", "--hold", "300", "--url", url, "--json")
    assert saved.returncode == 0, saved.stderr
    restored = fleetctl("restore", Path(json.loads(saved.stdout)["checkpoint"]).name, "--device", "node3/cpu:0",
                        "--url", url, "--json")
    assert restored.returncode == 0, restored.stderr
    assert streams.result(timeout=300) == expected
    assert (workers(url)["decode-0"]["node"], workers(url)["decode-0"]["device"]) == ("node3", "node3/cpu:0")

    cluster[0].remove_node(node3)
    assert wait_until(lambda: workers(url)["decode-0"]["node_lost"], 60)
    refused = httpx.post(f"{url}/v1/completions", json={"model": "small-llama0", "prompt": "hi", "max_tokens": 4},
                         timeout=30)
    assert refused.status_code == 503, refused.text
    # refused at admission, or admitted in the instant before the loss was final and failed at once
    assert "worker is " in refused.json()["error"]["message"]
    assert "(the Ray cluster lost the node of decode-0 on node3" in refused.json()["error"]["message"]
    assert httpx.get(f"{url}/health", timeout=10).json() == {"status": "degraded"}
