"""Workers as Ray actors (`serve --ray ADDRESS`): each one placed by Ray on its device's node (`node2/cpu:0`
holds one of node2's CPU slots, `node2/cuda:0` one of its GPUs), the controller being the Ray driver.
Everything above the launcher is unchanged: an actor runs the same worker loop over a socket channel
that carries the same messages as a local pipe (`ray_channel.py`).

Deaths are Ray's word, not a guess: a thread per actor waits on its `run` call; when Ray reports the
actor dead (killed, crashed, or its node lost) the channel is closed, and the link's exit carries the
cause (`ExitCause`), so the controller recomputes the worker's sessions as for a dead local process."""

import contextlib
import dataclasses
import os
import secrets
import threading
import uuid

import ray
from ray.exceptions import RayError

from fleetctl.engine.core.local_devices import check_device
from fleetctl.engine.worker import ray_nodes
from fleetctl.engine.worker.launcher import ExitCause, LaunchedWorker
from fleetctl.engine.worker.ray_actor import RayWorker
from fleetctl.engine.worker.ray_channel import SocketChannel
from fleetctl.engine.worker.spec import WorkerSpec

CAUSE_WAIT_S = 5.0  # how long a closed channel waits for Ray's verdict on its actor
KILL_WAIT_S = 1.0
_ACTOR = ray.remote(max_concurrency=4)(RayWorker)  # run + where + read_kv side by side


class RayActorProcess:
    """A worker's actor as the controller's `WorkerProcess`: pid, liveness, kill and join, from Ray."""

    def __init__(self, actor: ray.actor.ActorHandle, run: ray.ObjectRef, channel: SocketChannel, node: str) -> None:
        self.actor = actor
        self.pid: int | None = None
        self._run = run
        self._channel = channel
        self._node = node
        self._node_id = ""
        self._cause: ExitCause | None = None
        self._ended = threading.Event()
        threading.Thread(target=self._watch, daemon=True, name=f"ray-watch-{node}").start()

    def _watch(self) -> None:
        with contextlib.suppress(RayError):
            self._node_id, self.pid = ray.get(self.actor.where.remote())
        try:
            ray.get(self._run)  # the worker's whole life
        except RayError as exc:
            self._cause = self._death(exc)
        self._ended.set()
        self._channel.close()
        with contextlib.suppress(RayError):  # its device (a CPU slot, a GPU) is free for the next actor
            ray.kill(self.actor, no_restart=True)

    def _death(self, exc: RayError) -> ExitCause:
        node = ray_nodes.node_by_id(self._node_id)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if node is not None and not node.alive:
            return ExitCause(f"node {self._node} lost (Ray: {type(exc).__name__})", node_lost=True)
        return ExitCause(f"Ray actor on {self._node} died: {first}")

    def exit_cause(self) -> ExitCause | None:
        self._ended.wait(CAUSE_WAIT_S)
        return self._cause

    def is_alive(self) -> bool:
        return not self._ended.is_set()

    def kill(self) -> None:
        with contextlib.suppress(RayError):
            ray.kill(self.actor, no_restart=True)

    def join(self, timeout: float | None = None) -> None:
        self._ended.wait(timeout)


class RayLauncher:
    """Places each worker as a Ray actor; `address` is `auto` (this machine's instance, started if none
    runs) or a cluster's address."""

    def __init__(self, address: str) -> None:
        ray_nodes.connect(address)
        self._authkey = secrets.token_bytes(32)
        self._host = ray.util.get_node_ip_address()  # where actors on every node reach the controller

    def check_device(self, device: str) -> None:
        ray_nodes.resolve(check_device(device, indexed=True))

    def launch(self, spec: WorkerSpec) -> LaunchedWorker:
        device = check_device(spec.device, indexed=True)
        node = ray_nodes.resolve(device)
        spec = dataclasses.replace(spec, fleet_pid=os.getpid())  # its buffers are this fleet's, swept with it
        name = f"{spec.worker_id}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        actor = _ACTOR.options(name=name, namespace=ray_nodes.NAMESPACE, max_restarts=0,
                               **ray_nodes.placement(device, node)).remote(name)
        channel = SocketChannel(self._host, self._authkey)
        process = RayActorProcess(actor, actor.run.remote(spec, channel.address, self._authkey), channel, node.name)
        return LaunchedWorker(spec, channel, process, node=node.name, exit_cause=process.exit_cause)
