"""The import graph: layers import downwards only (server → fleet → planner → worker → checkpoint → core → metrics →
model → kernels; `store` and `paths` from anywhere, the store importing none of them; the domain's vocabulary,
`fleetctl.domain`, the error root, `fleetctl.errors`, and the option declarations, `fleetctl.options`, from
anywhere, the store included); the wire contract, `engine.api`, from any layer of the engine and the console, itself
importing only the vocabulary and `paths`; inside the console too (cli → demo / loadgen / tui → client, the demo
drawing on the load generator; cli and tui sharing `console_settings`), and outside its composition root
(`console/cli/`) the console reaches the engine only through `engine.api`; no module imports itself through others;
and the controller and server import no torch. Lazy imports inside functions count as imports."""

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
API = "fleetctl.engine.api"  # the wire contract: any engine layer and the console may use it
API_IMPORTS = ("fleetctl.engine.api", "fleetctl.engine.paths")  # besides the vocabulary
CONSOLE_ENGINE = (API, "fleetctl.engine.paths")  # what the console outside cli/ may import of the engine
COMPOSITION_ROOT = ("fleetctl.console.cli", "fleetctl.console.__main__")  # may import whatever it runs
SELF_CONTAINED = ("fleetctl.store", "fleetctl.kernels", "fleetctl.engine.paths", "fleetctl.themes", "fleetctl.domain",
                  "fleetctl.errors", "fleetctl.options")
# the words every layer shares (roles, states, phases), the one root of its expected failures and the way each
# layer declares its options: import nothing
VOCABULARY = ("fleetctl.domain", "fleetctl.errors", "fleetctl.options")
# what each of the console's rooms may import of the console besides itself: cli → demo / loadgen / tui → client
CONSOLE_ROOMS = {
    "fleetctl.console.__main__": ("fleetctl.console.cli",),
    "fleetctl.console.cli": ("fleetctl.console.demo", "fleetctl.console.loadgen", "fleetctl.console.tui",
                             "fleetctl.console.client", "fleetctl.console.console_settings"),
    "fleetctl.console.demo": ("fleetctl.console.loadgen", "fleetctl.console.client"),  # it sends loadgen's requests
    "fleetctl.console.loadgen": ("fleetctl.console.client",),
    "fleetctl.console.tui": ("fleetctl.console.client", "fleetctl.console.console_settings"),
    "fleetctl.console.client": (),
    "fleetctl.console.console_settings": (),  # what the console runs with: the command line declares its options
}
# every other console module is in a room
CONSOLE_TOP_LEVEL = ("__init__.py", "__main__.py", "client.py", "console_settings.py")


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
        if within(target, "fleetctl.engine") and not any(within(target, p) for p in (*LAYERS, *ANYONE_MAY_USE, API)):
            continue  # `from fleetctl.engine import x`: x is checked as fleetctl.engine.x
        home = next((p for p in SELF_CONTAINED if within(source, p)), None)
        if any(within(target, word) for word in VOCABULARY) and home not in VOCABULARY:
            continue
        if within(source, API):
            if not any(within(target, allowed) for allowed in API_IMPORTS):
                bad.append(f"{source} imports {target}: the API imports only the vocabulary and paths")
            continue
        if within(target, API) and home is None:
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


def console_violations(source: str, targets: set[str]) -> list[str]:
    """Why `source`, a console module, may not import each of `targets` (empty when all are allowed)."""
    room = next((r for r in CONSOLE_ROOMS if within(source, r)), None)
    if room is None:
        return []
    allowed = (room, *CONSOLE_ROOMS[room])
    return [f"{source} imports {target}: {room} may import only {', '.join(CONSOLE_ROOMS[room]) or 'itself'}"
            for target in sorted(targets) if within(target, "fleetctl.console") and
            not any(within(target, a) for a in allowed)]


def engine_reach(source: str, targets: set[str]) -> list[str]:
    """Why `source`, a console module outside the composition root, may not import each of `targets`."""
    if not within(source, "fleetctl.console") or any(within(source, root) for root in COMPOSITION_ROOT):
        return []
    return [f"{source} imports {target}: outside console/cli/ the console reaches the engine only through engine.api"
            for target in sorted(targets) if within(target, "fleetctl.engine") and
            not any(within(target, allowed) for allowed in CONSOLE_ENGINE)]


def import_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One circle of imports in `graph` (module -> the modules it imports), first module repeated at the end;
    empty when there is none."""
    done: set[str] = set()
    path: list[str] = []

    def visit(module: str) -> list[str]:
        if module in path:
            return [*path[path.index(module):], module]
        if module in done:
            return []
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if cycle := visit(target):
                return cycle
        path.pop()
        done.add(module)
        return []

    return next((cycle for module in sorted(graph) if (cycle := visit(module))), [])


def package_modules() -> list[Path]:
    return [p for p in ROOT.rglob("*.py") if p.parts[len(ROOT.parts)] in {"console", "engine", "kernels", "store",
                                                                           "themes", "domain.py", "errors.py",
                                                                           "options.py"}]


def test_imports_flow_one_way() -> None:
    problems = [v for path in package_modules() for v in violations(module_name(path), imported_modules(path))]
    assert not problems, "\n".join(problems)


def test_console_rooms_import_downwards() -> None:
    problems = [v for path in package_modules() if within(module_name(path), "fleetctl.console")
                for v in console_violations(module_name(path), imported_modules(path))]
    assert not problems, "\n".join(problems)


def test_the_console_reaches_the_engine_only_through_its_api() -> None:
    problems = [v for path in package_modules() for v in engine_reach(module_name(path), imported_modules(path))]
    assert not problems, "\n".join(problems)


def test_no_module_imports_itself_through_others() -> None:
    modules = {module_name(path): path for path in package_modules()}
    graph = {name: {m for m in imported_modules(path) if m in modules and m != name} for name, path in modules.items()}
    cycle = import_cycle(graph)
    assert not cycle, " -> ".join(cycle)


def test_the_cycle_finder_finds_a_circle() -> None:
    assert import_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert import_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def test_console_has_no_loose_modules() -> None:
    loose = sorted(p.name for p in (ROOT / "console").glob("*.py") if p.name not in CONSOLE_TOP_LEVEL)
    assert not loose, f"console/ modules outside a room (cli/, demo/, loadgen/, tui/): {loose}"


def test_engine_has_no_loose_modules() -> None:
    loose = sorted(p.name for p in (ROOT / "engine").glob("*.py") if p.name not in ("__init__.py", "paths.py"))
    assert not loose, f"engine/ modules outside a subpackage: {loose}"


@pytest.mark.parametrize(("source", "target", "allowed"), [
    ("fleetctl.engine.core.scheduler", "fleetctl.engine.fleet.router", False),
    ("fleetctl.engine.fleet.router", "fleetctl.engine.core.block_allocator", True),
    ("fleetctl.store.writer", "fleetctl.engine.core.sequence", False),
    ("fleetctl.engine.model.decoder", "fleetctl.store.records", True),
    ("fleetctl.store.records", "fleetctl.domain", True),
    ("fleetctl.kernels.ops", "fleetctl.domain", True),
    ("fleetctl.domain", "fleetctl.store.records", False),
    ("fleetctl.store.errors", "fleetctl.errors", True),
    ("fleetctl.kernels.quantized_linear", "fleetctl.errors", True),
    ("fleetctl.errors", "fleetctl.domain", False),
    ("fleetctl.engine.core.engine_settings", "fleetctl.options", True),
    ("fleetctl.console.tui.settings", "fleetctl.options", True),
    ("fleetctl.options", "fleetctl.errors", False),
    ("fleetctl.engine.core.scheduler", "fleetctl.engine.api.status", True),
    ("fleetctl.engine.api.status", "fleetctl.engine.fleet.request", False),
    ("fleetctl.engine.api.status", "fleetctl.store.records", False),
    ("fleetctl.store.records", "fleetctl.engine.api.status", False),
    ("fleetctl.kernels.ops", "fleetctl.engine.api.status", False),
])
def test_the_checker_tells_up_from_down(source: str, target: str, allowed: bool) -> None:
    assert (violations(source, {target}) == []) is allowed


@pytest.mark.parametrize(("source", "target", "allowed"), [
    ("fleetctl.console.cli.bench", "fleetctl.console.loadgen.runner", True),
    ("fleetctl.console.demo.traffic", "fleetctl.console.loadgen.requests", True),
    ("fleetctl.console.tui.source", "fleetctl.console.client", True),
    ("fleetctl.console.loadgen.runner", "fleetctl.console.cli.common", False),
    ("fleetctl.console.tui.app", "fleetctl.console.loadgen.local_fleet", False),
    ("fleetctl.console.loadgen.traces", "fleetctl.console.demo.schedule", False),
    ("fleetctl.console.client", "fleetctl.console.tui.source", False),
    ("fleetctl.console.tui.app", "fleetctl.console.console_settings", True),
    ("fleetctl.console.console_settings", "fleetctl.console.tui.actions", False),
])
def test_the_console_checker_tells_up_from_down(source: str, target: str, allowed: bool) -> None:
    assert (console_violations(source, {target}) == []) is allowed


@pytest.mark.parametrize(("source", "target", "allowed"), [
    ("fleetctl.console.tui.source", "fleetctl.engine.api.status", True),
    ("fleetctl.console.tui.source", "fleetctl.engine.server.schemas", False),
    ("fleetctl.console.loadgen.runner", "fleetctl.engine.planner.plan", False),
    ("fleetctl.console.client", "fleetctl.engine.fleet.config", False),
    ("fleetctl.console.cli.serve", "fleetctl.engine.fleet.controller", True),
])
def test_the_engine_reach_checker_tells_the_api_from_the_insides(source: str, target: str, allowed: bool) -> None:
    assert (engine_reach(source, {target}) == []) is allowed


def test_controller_server_and_planner_import_no_torch() -> None:
    code = ("import sys, fleetctl.engine.fleet.controller, fleetctl.engine.server.app, fleetctl.engine.planner.plan; "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))[:5])")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", result.stdout


def test_the_command_line_imports_no_torch() -> None:
    """`fleetctl --help` stays fast: the settings models its options are declared on load no torch."""
    assert _loaded("import fleetctl.console.cli.app", ("torch",)) == []


def _loaded(code: str, prefixes: tuple[str, ...]) -> list[str]:
    probe = f"import sys; {code}; print(sorted(m for m in sys.modules if m.split('.')[0] in {prefixes!r})[:5])"
    return ast.literal_eval(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                                           check=True).stdout)


def test_the_single_node_path_imports_no_ray_and_the_ray_launcher_no_torch() -> None:
    single_node = ("import fleetctl.engine.fleet.controller, fleetctl.engine.server.app, fleetctl.console.cli.app, "
                   "fleetctl.engine.worker.loop")
    assert _loaded(single_node, ("ray",)) == []
    assert _loaded("import fleetctl.engine.worker.ray_launcher", ("torch",)) == []
