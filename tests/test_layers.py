"""The import graph: layers import downwards only (server → fleet → planner → worker → checkpoint → core →
metrics → model → kernels; `store` and `paths` from anywhere, the store importing none of them; the
domain's vocabulary, `fleetctl.domain`, from anywhere, the store included), and
the controller and server import no torch. Lazy imports inside functions count as imports."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# highest first: a module may import its own layer and any layer after it
LAYERS = (
    "fleetctl.console",
    "fleetctl.engine.server",
    "fleetctl.engine.fleet",
    "fleetctl.engine.planner",
    "fleetctl.engine.worker",
    "fleetctl.engine.checkpoint",
    "fleetctl.engine.core",
    "fleetctl.engine.metrics",
    "fleetctl.engine.model",
    "fleetctl.kernels",
)
ANYONE_MAY_USE = ("fleetctl.store", "fleetctl.engine.paths", "fleetctl.themes")
SELF_CONTAINED = ("fleetctl.store", "fleetctl.kernels", "fleetctl.engine.paths", "fleetctl.themes", "fleetctl.domain")
VOCABULARY = "fleetctl.domain"  # the words every layer shares (roles, states, phases): imports nothing itself


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(("fleetctl", *parts)).removesuffix(".__init__")


def imported_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return {name for name in found if name.startswith("fleetctl.")}


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def layer_of(module: str) -> int | None:
    return next((i for i, layer in enumerate(LAYERS) if within(module, layer)), None)


def violations(source: str, targets: set[str]) -> list[str]:
    """Why `source` may not import each of `targets` (empty when all are allowed)."""
    bad = []
    for target in sorted(targets):
        if within(target, "fleetctl.engine") and not any(within(target, p) for p in (*LAYERS, *ANYONE_MAY_USE)):
            continue  # `from fleetctl.engine import x`: x is checked as fleetctl.engine.x
        home = next((p for p in SELF_CONTAINED if within(source, p)), None)
        if within(target, VOCABULARY) and home != VOCABULARY:
            continue
        if home is not None:
            if not within(target, home):
                bad.append(f"{source} imports {target}: {home} imports nothing else of fleetctl")
            continue
        if any(within(target, p) for p in ANYONE_MAY_USE):
            continue
        mine, theirs = layer_of(source), layer_of(target)
        if mine is not None and theirs is not None and theirs < mine:
            bad.append(f"{source} imports {target}: {LAYERS[mine]} may not import the layer above it, {LAYERS[theirs]}")
    return bad


def package_modules() -> list[Path]:
    return [p for p in ROOT.rglob("*.py") if p.parts[len(ROOT.parts)] in {"console", "engine", "kernels", "store",
                                                                           "themes", "domain.py"}]


def test_imports_flow_one_way() -> None:
    problems = [v for path in package_modules() for v in violations(module_name(path), imported_modules(path))]
    assert not problems, "\n".join(problems)


def test_engine_has_no_loose_modules() -> None:
    loose = sorted(p.name for p in (ROOT / "engine").glob("*.py") if p.name not in ("__init__.py", "paths.py"))
    assert not loose, f"engine/ modules outside a subpackage: {loose}"


@pytest.mark.parametrize(("source", "target", "allowed"), [
    ("fleetctl.engine.core.scheduler", "fleetctl.engine.fleet.router", False),
    ("fleetctl.engine.fleet.router", "fleetctl.engine.core.block_allocator", True),
    ("fleetctl.store.writer", "fleetctl.engine.core.sequence", False),
    ("fleetctl.engine.model.llama", "fleetctl.store.records", True),
    ("fleetctl.store.records", "fleetctl.domain", True),
    ("fleetctl.kernels.ops", "fleetctl.domain", True),
    ("fleetctl.domain", "fleetctl.store.records", False),
])
def test_the_checker_tells_up_from_down(source: str, target: str, allowed: bool) -> None:
    assert (violations(source, {target}) == []) is allowed


def test_controller_server_and_planner_import_no_torch() -> None:
    code = ("import sys, fleetctl.engine.fleet.controller, fleetctl.engine.server.app, fleetctl.engine.planner.plan; "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))[:5])")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", result.stdout


def _loaded(code: str, prefixes: tuple[str, ...]) -> list[str]:
    probe = f"import sys; {code}; print(sorted(m for m in sys.modules if m.split('.')[0] in {prefixes!r})[:5])"
    return ast.literal_eval(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                                           check=True).stdout)


def test_the_single_node_path_imports_no_ray_and_the_ray_launcher_no_torch() -> None:
    single_node = ("import fleetctl.engine.fleet.controller, fleetctl.engine.server.app, fleetctl.console.cli.app, "
                   "fleetctl.engine.worker.loop")
    assert _loaded(single_node, ("ray",)) == []
    assert _loaded("import fleetctl.engine.worker.ray_launcher", ("torch",)) == []
