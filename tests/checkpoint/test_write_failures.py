"""A checkpoint that cannot be written says why: a read-only volume, or a disk without room for it (with how much
it needs), is refused before anything is written, and a writer that fails mid-write (ENOSPC, EIO, EROFS) reports
that error by name; either way nothing partial is left or listed and the engine keeps every session it held,
decoding on to the same tokens. The volumes are real tmpfs mounts where this machine lets the tests mount them;
elsewhere the disk says what such a volume would (tests/support/volumes.py)."""

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.volumes import tmpfs

from fleetctl.domain import WorkerRole
from fleetctl.engine.checkpoint.engine_io import current_compat, write_engine_checkpoint
from fleetctl.engine.checkpoint.format import CheckpointError, list_checkpoints
from fleetctl.engine.core.engine_settings import EngineConfig, EngineSettings
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.sequence import SamplingParams

PARAMS = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
PROMPTS = ["The quick brown fox", "def add(a, b):", "Once upon a time there was"]


def engine(model_dir: Path) -> LLMEngine:
    settings = EngineSettings(dtype="float32", deterministic=True, num_kv_blocks=64)
    return LLMEngine(EngineConfig(model_dir=model_dir, settings=settings))


def decoded(eng: LLMEngine) -> dict[str, list[int]]:
    tokens: dict[str, list[int]] = {}
    while eng.has_unfinished():
        for out in eng.step():
            tokens.setdefault(out.request_id, []).append(out.token_id)
    return tokens


def midway(model_dir: Path) -> tuple[LLMEngine, dict[str, list[int]]]:
    """An engine three steps into the prompts, and what it had emitted."""
    eng = engine(model_dir)
    for i, prompt in enumerate(PROMPTS):
        eng.add_request(prompt, PARAMS, request_id=f"r{i}")
    tokens: dict[str, list[int]] = {}
    for _ in range(3):
        for out in eng.step():
            tokens.setdefault(out.request_id, []).append(out.token_id)
    return eng, tokens


def checkpoint(eng: LLMEngine, root: Path) -> None:
    write_engine_checkpoint(eng, "decode-0", WorkerRole.DECODE, current_compat(eng, "cpu"), root, "decode-0-test",
                            on_writer=lambda pid: None)


@pytest.fixture(scope="module")
def uninterrupted(tiny_model_dir: Path) -> dict[str, list[int]]:
    eng, tokens = midway(tiny_model_dir)
    for rid, more in decoded(eng).items():
        tokens[rid] += more
    return tokens


def serves_on(eng: LLMEngine, tokens: dict[str, list[int]], uninterrupted: dict[str, list[int]]) -> None:
    assert len(eng.scheduler.running) == len(PROMPTS)  # every session still held
    for rid, more in decoded(eng).items():
        tokens[rid] += more
    assert tokens == uninterrupted


def nothing_left(root: Path) -> None:
    """No checkpoint listed, and not a file or folder of one (a `.partial`) left behind."""
    assert not root.exists() or (list_checkpoints(root) == [] and not any(root.iterdir()))


@pytest.fixture
def small_volume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder whose disk has 64 KiB free: a tmpfs of that size, or where mounting is not allowed a folder whose
    disk says so."""
    folder = tmp_path / "volume"
    with tmpfs(folder, "64k") as mounted:
        if not mounted:
            real = shutil.disk_usage
            monkeypatch.setattr(shutil, "disk_usage", lambda path: real(path)._replace(free=64 * 1024))
        yield folder


def test_a_disk_without_room_is_refused_before_writing(small_model_dir: Path, small_volume: Path) -> None:
    """The small model's KV for these prompts (~0.4 MiB) alone overflows the volume."""
    eng, tokens = midway(small_model_dir)
    later, earlier = midway(small_model_dir)
    for rid, more in decoded(later).items():
        earlier[rid] += more
    root = small_volume / "checkpoints"
    with pytest.raises(CheckpointError, match=rf"no room for the checkpoint in {root}: it needs [\d.]+ MiB and its "
                                              r"disk has 0\.1 MiB free; free some space there"):
        checkpoint(eng, root)
    nothing_left(root)
    serves_on(eng, tokens, earlier)


def test_a_read_only_volume_is_refused_before_writing(tiny_model_dir: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      uninterrupted: dict[str, list[int]]) -> None:
    eng, tokens = midway(tiny_model_dir)
    folder = tmp_path / "volume"
    with tmpfs(folder, "1m", read_only=True) as mounted:
        if not mounted:
            monkeypatch.setattr("os.access", lambda path, mode: Path(path) != folder)
        with pytest.raises(CheckpointError, match=rf"cannot write the checkpoint in {folder}/checkpoints: {folder} "
                                                  r"is read-only"):
            checkpoint(eng, folder / "checkpoints")
        nothing_left(folder / "checkpoints")
    serves_on(eng, tokens, uninterrupted)


@pytest.mark.parametrize(("error", "reason"), [("ENOSPC", "No space left on device (ENOSPC)"),
                                               ("EIO", "Input/output error (EIO)"),
                                               ("EROFS", "Read-only file system (EROFS)")])
def test_a_writer_that_fails_mid_write_says_why(tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                uninterrupted: dict[str, list[int]], error: str, reason: str) -> None:
    monkeypatch.setenv("FLEET_FAULTS", f"checkpoint-write=oserror:{error}")  # after the KV file, before the manifest
    eng, tokens = midway(tiny_model_dir)
    root = tmp_path / "checkpoints"
    with pytest.raises(CheckpointError) as failed:
        checkpoint(eng, root)
    assert str(failed.value) == f"the checkpoint writer failed: {reason} writing {root}; nothing was saved"
    nothing_left(root)
    serves_on(eng, tokens, uninterrupted)
