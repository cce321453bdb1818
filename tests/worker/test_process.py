"""The worker process's set-up: its GPU made the current CUDA device before any CUDA work (Triton launches
on the current device, so a worker on cuda:1 would otherwise fault on cuda:0's context)."""

import multiprocessing as mp
from pathlib import Path

import pytest
import torch

from fleetctl.domain import WorkerRole
from fleetctl.engine.worker import protocol as m
from fleetctl.engine.worker.process import run_worker
from fleetctl.engine.worker.spec import WorkerSpec


@pytest.mark.parametrize(("device", "current"), [("cuda:1", [1]), ("node2/cuda:3", [3]), ("cpu:1", [])])
def test_the_worker_makes_its_gpu_current_first(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, device: str,
                                                  current: list[int]) -> None:
    made_current: list[int] = []
    monkeypatch.setattr(torch.cuda, "set_device", made_current.append)
    parent, child = mp.Pipe(duplex=True)
    # an empty model directory: the engine cannot load, so the worker stops right after its set-up
    assert not run_worker(WorkerSpec("decode-0", WorkerRole.DECODE, device, tmp_path, shm_dir=tmp_path), child)
    assert made_current == current
    messages = [parent.recv() for _ in range(2)]
    assert isinstance(messages[-1], m.WorkerFailed)
