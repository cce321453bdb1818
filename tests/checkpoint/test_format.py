"""Checkpoint format v1 on disk: atomic writes (a writer killed at any point leaves nothing listed or
accepted), verification naming the bad file, compat comparison."""

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from fleetctl.domain import WorkerRole
from fleetctl.engine.checkpoint.format import (
    KV_FILE,
    MANIFEST,
    CheckpointError,
    Compat,
    SessionRecord,
    StopCriteria,
    first_difference,
    list_checkpoints,
    read_checkpoint,
    write_checkpoint,
)
from fleetctl.engine.checkpoint.snapshot import payload_of, payload_of_blocks
from fleetctl.engine.core.sequence import SamplingParams, SequenceStatus

COMPAT = Compat(device_kind="cpu", device_name="test-cpu", driver="", torch="2.13.0", engine="0.1.0",
                model_id="tiny", model_sha256="ab" * 32, dtype="float32", kv_layout=1, block_size=16)
SEQUENCES = [SessionRecord(request_id="r0", prompt_token_ids=[1, 2, 3], output_token_ids=[4],
                           params=SamplingParams(max_tokens=8, stop=("x",)), seed=7, status=SequenceStatus.RUNNING,
                           num_cached_tokens=3, block_table=[0],
                           stop_criteria=StopCriteria(eos_token_ids=[2], max_tokens=8, max_model_len=512))]
DECODE = WorkerRole.DECODE


def kv(blocks: int) -> torch.Tensor:
    return torch.randn(3, 2, blocks, 16, 2, 16, generator=torch.Generator().manual_seed(0))


def load_kv(path: Path) -> torch.Tensor:
    return load_file(str(path / KV_FILE))["kv"]


def test_roundtrip_and_permissions(tmp_path: Path) -> None:
    tensor = kv(4)
    path = write_checkpoint(tmp_path, "w-1", "decode-0", DECODE, COMPAT, SEQUENCES, payload_of(tensor))
    saved = read_checkpoint(path)
    assert saved.worker_id == "decode-0" and saved.role is DECODE
    assert saved.manifest.compat == COMPAT and saved.sessions == SEQUENCES
    assert torch.equal(load_kv(path), tensor)
    assert path.stat().st_mode & 0o777 == 0o700
    assert all(f.stat().st_mode & 0o777 == 0o600 for f in path.iterdir())
    assert list_checkpoints(tmp_path) == [path]


def test_bf16_kv_roundtrip(tmp_path: Path) -> None:
    tensor = kv(2).bfloat16()
    path = write_checkpoint(tmp_path, "w-bf16", "decode-0", DECODE, COMPAT, SEQUENCES, payload_of(tensor))
    read_checkpoint(path)
    assert torch.equal(load_kv(path), tensor)


@pytest.mark.parametrize("damage", ["flip", "truncate", "missing"])
def test_damaged_files_are_refused_by_name(tmp_path: Path, damage: str) -> None:
    path = write_checkpoint(tmp_path, "w-2", "decode-0", DECODE, COMPAT, SEQUENCES, payload_of(kv(4)))
    target = path / "kv.safetensors"
    if damage == "flip":
        data = bytearray(target.read_bytes())
        data[-100] ^= 0x01
        target.write_bytes(bytes(data))
    elif damage == "truncate":
        target.write_bytes(target.read_bytes()[:-10])
    else:
        target.unlink()
    with pytest.raises(CheckpointError, match=r"kv\.safetensors"):
        read_checkpoint(path)


def test_manifest_problems_are_refused(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path, "w-3", "decode-0", DECODE, COMPAT, SEQUENCES, payload_of(kv(1)))
    (path / MANIFEST).write_text("{not json")
    with pytest.raises(CheckpointError, match=MANIFEST):
        read_checkpoint(path)
    (path / MANIFEST).write_text(json.dumps({"format_version": 99}))
    with pytest.raises(CheckpointError, match="format version"):
        read_checkpoint(path)
    (path / MANIFEST).unlink()
    with pytest.raises(CheckpointError, match="missing"):
        read_checkpoint(path)
    assert list_checkpoints(tmp_path) == []


def test_first_difference_names_the_field() -> None:
    assert first_difference(COMPAT, COMPAT) is None
    reason = first_difference(COMPAT, COMPAT.model_copy(update={"device_name": "NVIDIA H200"}))
    assert reason is not None and reason.startswith("device_name")


def test_writer_killed_at_any_point_leaves_nothing_listed(tmp_path: Path) -> None:
    """Fork a writer of a 48 MiB checkpoint and SIGKILL it after increasing delays: a checkpoint is
    either complete and verifies, or it is not listed and cannot be read."""
    payload = payload_of(kv(1024))  # 3 layers * 2 * 1024 blocks * 16 * 2 * 16 * 4 bytes
    outcomes = set()
    for attempt, delay in enumerate((0.0, 0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.2, 1.0)):
        name = f"kill-{attempt}"
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                write_checkpoint(tmp_path, name, "decode-0", DECODE, COMPAT, SEQUENCES, payload)
                code = 0
            finally:
                os._exit(code)
        time.sleep(delay)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        complete = tmp_path / name
        if complete.exists():
            outcomes.add("complete")
            read_checkpoint(complete)
        else:
            outcomes.add("killed")
            with pytest.raises(CheckpointError):
                read_checkpoint(tmp_path / f"{name}.partial")
        for listed in list_checkpoints(tmp_path):
            read_checkpoint(listed)
    assert "killed" in outcomes  # at least one kill landed mid-write


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_blocks_gathered_from_the_pool_equal_the_gathered_tensor(tmp_path: Path, dtype: torch.dtype) -> None:
    pool = kv(40).to(dtype)  # [layers, 2, blocks, block_size, Hkv, d]
    blocks = [7, 3, 39, 0, 12] * 3
    path = write_checkpoint(tmp_path, f"pool-{dtype}", "decode-0", DECODE, COMPAT, SEQUENCES,
                            payload_of_blocks(pool, blocks))
    expected = pool.index_select(2, torch.tensor(blocks))
    read_checkpoint(path)
    assert torch.equal(load_kv(path), expected)
