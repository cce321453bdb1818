"""The node's finished outputs for prompt lookup (engine/core/node_outputs.py): what one engine records another
drafts from, a restarted one too; the file stays bounded; a reader merges what was appended."""

from pathlib import Path

import pytest

from fleetctl.engine.core import node_outputs
from fleetctl.engine.core.engine_settings import EngineConfig, EngineSettings, SpeculativeMode
from fleetctl.engine.core.llm_engine import LLMEngine
from fleetctl.engine.core.node_outputs import NodeOutputs
from fleetctl.engine.core.sequence import SamplingParams, Sequence


def test_what_one_reader_records_another_drafts_from(tmp_path: Path) -> None:
    path = tmp_path / "outputs.tokens"
    writer, reader = NodeOutputs(path), NodeOutputs(path)
    writer.record([10, 11, 12, 13, 14, 15])
    writer.record([20, 11, 12, 13, 30, 31, 32])  # (11, 12, 13) again, later: its latest continuation wins
    assert reader.propose([1, 11, 12, 13], 8) == []  # not refreshed yet
    reader.refresh(force=True)
    assert reader.propose([1, 11, 12, 13], 8) == [30, 31, 32]  # to the end of that output, not into the next
    assert reader.propose([5, 10, 11, 12], 2) == [13, 14]
    assert reader.propose([12, 13, 99], 4) == []
    assert NodeOutputs(path).propose([7, 31, 32], 4) == []  # nothing follows an output's last token
    assert NodeOutputs(path).propose([7, 13, 30, 31], 4) == [32]  # a new reader (a restarted worker) reads it all


def test_a_reader_merges_what_was_appended(tmp_path: Path) -> None:
    path = tmp_path / "outputs.tokens"
    writer, reader = NodeOutputs(path), NodeOutputs(path)
    for i in range(50):
        writer.record([i, 1000 + i, 2000 + i, 3000 + i, 4000 + i])
        reader.refresh(force=True)
    assert all(reader.propose([i, 1000 + i, 2000 + i], 2) == [3000 + i, 4000 + i] for i in range(50))
    writer.record([5, 1005, 2005, 9])  # a later occurrence replaces the earlier one's position
    reader.refresh(force=True)
    assert reader.propose([5, 1005, 2005], 2) == [9]


def test_the_file_is_bounded_and_a_rotation_is_read_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node_outputs, "MAX_TOKENS", 20)
    path = tmp_path / "outputs.tokens"
    writer, reader = NodeOutputs(path), NodeOutputs(path)
    for i in range(10):
        writer.record([100 + i, 1, 2, 3, 200 + i])
    assert path.stat().st_size // 4 <= 20 + 6 and path.with_suffix(".old").stat().st_size // 4 <= 20 + 6
    reader.refresh(force=True)
    assert reader.propose([9, 1, 2, 3], 1) == [209]  # the latest
    assert reader.propose([7, 108, 1, 2], 2) == [3, 208]
    assert reader.propose([7, 100, 1, 2], 2) == []  # rotated out


def test_an_engine_drafts_from_another_engines_finished_output(tiny_model_dir: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Two engines of one node (as two decode workers): a sequence on the second drafts what the first one's
    sequence wrote, having never seen it itself."""
    monkeypatch.setenv("FLEET_HOME", str(tmp_path))
    settings = EngineSettings(dtype="float32", num_kv_blocks=64, speculative=SpeculativeMode.NGRAM, deterministic=True)
    first, second = (LLMEngine(EngineConfig(tiny_model_dir, settings=settings)) for _ in range(2))
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    done = first.generate(["The story begins"], params)[0]
    output = done.token_ids
    assert second.speculator is not None and second.speculator.node is not None
    second.speculator.node.refresh(force=True)
    seq = Sequence([5, *output[:6]], params, output_token_ids=[])
    second.speculator.draft([seq], 1000)
    assert seq.draft_token_ids and seq.draft_token_ids == output[6:6 + len(seq.draft_token_ids)]


def test_a_reader_of_a_full_file_merges_a_new_output(tmp_path: Path) -> None:
    path = tmp_path / "outputs.tokens"
    writer = NodeOutputs(path)
    writer.record(list(range(1, node_outputs.MAX_TOKENS - 10)))
    reader = NodeOutputs(path)
    writer.record([*range(5, 1005), 7, 8, 9, 77])
    reader.refresh(force=True)
    assert reader.propose([7, 8, 9], 3) == [77]
    assert reader.propose([500, 501, 502], 2) == [503, 504]
