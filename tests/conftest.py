from pathlib import Path

import pytest
import tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model.write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The default model, pulled once into $FLEET_HOME (kept between runs)."""
    from fleetctl.engine.model.store import ModelStore

    return ModelStore().pull("smollm2-135m")
