import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import family_models, tiny_model

pytest_plugins = ["support.require_all", "pytester"]

# Pulled models are kept between runs where `make test` pulled them; everything else a test writes
# under $FLEET_HOME (metrics store, checkpoints, admin token) goes to a fresh directory.
PERSISTENT_MODELS = Path(os.environ.get("FLEET_HOME") or "~/.local/share/fleetctl").expanduser() / "models"


@pytest.fixture(scope="session", autouse=True)
def fleet_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("fleet-home")
    previous = os.environ.get("FLEET_HOME")
    os.environ["FLEET_HOME"] = str(home)
    yield home
    if previous is None:
        del os.environ["FLEET_HOME"]
    else:
        os.environ["FLEET_HOME"] = previous


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model.write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def family_model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny random model of each family (support/family_models.FAMILY_CONFIGS), written by transformers."""
    root = tmp_path_factory.mktemp("families")
    return {family: family_models.write_family_model(family, root / family) for family in family_models.FAMILY_CONFIGS}


@pytest.fixture(scope="session")
def small_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Slower than the tiny model (seconds per long stream), so tests can act while streams run."""
    return tiny_model.write_tiny_llama(tmp_path_factory.mktemp("small-llama"), seed=1, hidden_size=256,
                                       intermediate_size=1024, num_hidden_layers=8, num_attention_heads=8,
                                       num_key_value_heads=2, head_dim=32, max_position_embeddings=1024)


@pytest.fixture(scope="session")
def smollm2_shaped_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Random weights in the default model's shape (0.5 GB in float32): for GPUs, where smollm2-135m's own weights
    cannot be carried."""
    return tiny_model.write_tiny_llama(tmp_path_factory.mktemp("smollm2-shaped"), **tiny_model.SMOLLM2_135M)


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The default model, pulled once into the persistent model store (kept between runs)."""
    from fleetctl.engine.model.model_store import ModelStore

    return ModelStore(root=PERSISTENT_MODELS).pull("smollm2-135m")


@pytest.fixture(scope="session")
def gemma3_dir() -> Path:
    """Gemma 3 270M (Gemma Terms of Use), pulled once into the persistent model store (kept between runs)."""
    from fleetctl.engine.model.model_store import ModelStore

    return ModelStore(root=PERSISTENT_MODELS).pull("gemma3-270m")


@pytest.fixture
def four_gpus(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """NVML reporting 4 GPUs (CUDA_VISIBLE_DEVICES unset); yields the calls made to it."""
    from fleetctl.engine.core import local_devices

    calls: list[str] = []
    monkeypatch.setattr(local_devices.pynvml, "nvmlInit", lambda: calls.append("init"))
    monkeypatch.setattr(local_devices.pynvml, "nvmlDeviceGetCount", lambda: calls.append("count") or 4)
    monkeypatch.setattr(local_devices.pynvml, "nvmlShutdown", lambda: calls.append("shutdown"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    local_devices.gpu_count.cache_clear()
    yield calls
    local_devices.gpu_count.cache_clear()
