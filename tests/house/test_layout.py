"""The house (issues 19 and 31): one package per stage of the flow, imports in one direction.

Invariants, each a test below:
- every module sits on a floor -- base -> sources -> shards -> decode -> kaldi/interop ->
  audio/text -> order -> batching -> collate -> concurrency -> distributed -> loader ->
  recipes -> tools -> CLI -- and imports only from its own floor or lower ones, at module
  level or inside a function; the import graph has no cycle;
- a stage package (``speechpipe/pipes/<stage>/``, ``speechpipe/memory/``) holds only private
  ``_modules`` and its face, ``__init__``; code outside a package imports from its face, never
  from one of its ``_modules``, and no name starting with ``_`` is imported from another
  module (privacy by module: what a sibling module needs is a plain name);
- one import path per public name: a module's ``__all__`` lists only what it defines (faces,
  the package ``__init__``s, excepted), and the faces list only what their modules define;
- no room is too big: no module over ~800 lines, no function over ~80 lines unless the line
  above its ``def`` says why (``# long: <reason>``).
"""

from __future__ import annotations

import ast
import pathlib

import pytest

import speechpipe

ROOT = pathlib.Path(speechpipe.__file__).parent

FLOORS = [
    ("base", ["errors", "sample", "seeding", "diagnostics", "remote", "index", "compact",
              "node_cache", "progress",
              "memory", "testing", "executors", "pipes._core"]),
    ("sources", ["pipes.sources"]),
    ("shards", ["pipes.shards"]),
    ("decode", ["pipes.decode"]),
    ("kaldi/interop", ["pipes.kaldi", "pipes.interop"]),
    ("audio/text", ["pipes.audio", "pipes.text"]),
    ("order", ["pipes.order"]),
    ("batching", ["pipes.batching"]),
    ("collate", ["pipes.collate"]),
    ("concurrency", ["pipes.concurrency"]),
    ("distributed", ["pipes.distributed"]),
    ("loader", ["epochs", "loader", "nodes", "telemetry", "topology", "worker_reports"]),
    ("recipes", ["recipes"]),
    ("tools", ["pack", "stats", "demo"]),
    ("CLI", ["cli"]),
]
# packages whose modules are all private (``_x.py``) behind a face
STAGE_PACKAGES = ["memory"] + [f"pipes.{name}" for name in (
    "_core", "sources", "shards", "decode", "kaldi", "interop", "audio", "text", "order",
    "batching", "concurrency", "distributed")]
MAX_MODULE_LINES = 820
MAX_FUNCTION_LINES = 80


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        if "demo_data" in path.parts:
            continue
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _floor(module: str) -> int | None:
    best = None
    for level, (_, names) in enumerate(FLOORS):
        for name in names:
            if module == name or module.startswith(name + "."):
                if best is None or len(name) > best[1]:
                    best = (level, len(name))
    return None if best is None else best[0]


def _import_nodes(module: str, path: pathlib.Path):
    """``(target module, [imported names], node)`` for each speechpipe import of ``module``."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("speechpipe."):
                    yield alias.name[len("speechpipe."):], [], node
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1] if node.level > 1 else package
                target = ".".join(base + ([node.module] if node.module else []))
            elif (node.module or "").startswith("speechpipe"):
                target = node.module[len("speechpipe."):] if node.module != "speechpipe" else ""
            else:
                continue
            yield target, [alias.name for alias in node.names], node


def _imports(module: str, path: pathlib.Path, known: set[str]) -> set[str]:
    """The speechpipe modules ``module`` imports, anywhere in its file."""
    out = set()
    for target, names, _ in _import_nodes(module, path):
        submodules = [f"{target}.{n}" for n in names if f"{target}.{n}" in known]
        for name in submodules or [target]:
            while name not in known and "." in name:
                name = name.rsplit(".", 1)[0]
            if name in known and name != module and name not in ("pipes", "recipes", ""):
                out.add(name)
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules) - {""}
    return {m: _imports(m, p, known) for m, p in modules.items() if m}


def _package(module: str, path: pathlib.Path) -> str:
    return module if path.name == "__init__.py" else module.rsplit(".", 1)[0] if "." in module else ""


def test_every_module_sits_on_a_floor():
    assert [m for m in _graph() if _floor(m) is None and m not in ("pipes",)] == []


def test_imports_go_down_or_along_never_up():
    upward = []
    for module, targets in _graph().items():
        here = _floor(module)
        if here is None:
            continue
        for target in targets:
            there = _floor(target)
            if there is not None and there > here:
                upward.append(f"{module} ({FLOORS[here][0]}) -> {target} ({FLOORS[there][0]})")
    assert sorted(upward) == []


def test_the_import_graph_has_no_cycle():
    graph = _graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(trail[trail.index(nxt):] + [nxt] if nxt in trail else [node, nxt])
            elif nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert cycles == []


def test_the_flow_is_a_dozen_rooms_not_a_hallway():
    # Invariant: speechpipe/pipes/ holds stage packages (and collate.py), no flat modules
    pipes = ROOT / "pipes"
    flat = sorted(p.name for p in pipes.glob("*.py") if p.name not in ("__init__.py", "collate.py"))
    assert flat == []
    rooms = sorted(p.name for p in pipes.iterdir() if (p / "__init__.py").exists())
    assert len(rooms) >= 12, rooms


@pytest.mark.parametrize("package", STAGE_PACKAGES)
def test_a_stage_package_is_private_modules_behind_a_face(package):
    folder = ROOT.joinpath(*package.split("."))
    assert (folder / "__init__.py").exists()
    public = sorted(p.name for p in folder.glob("*.py")
                    if p.name != "__init__.py" and not p.name.startswith("_"))
    assert public == [], f"{package}: modules outside the face must be private: {public}"


def test_no_module_reaches_into_another_packages_private_modules():
    modules = _modules()
    reaching = []
    for module, path in modules.items():
        here = _package(module, path)
        for target, names, node in _import_nodes(module, path):
            for full in [target] + [f"{target}.{n}" for n in names]:
                if full not in modules:
                    continue
                parts = full.split(".")
                private = [i for i, part in enumerate(parts) if part.startswith("_")]
                if not private:
                    continue
                owner = ".".join(parts[: private[-1]])  # the package holding the _module
                if full in STAGE_PACKAGES or (full == "pipes._core"):
                    continue  # a face (pipes._core is the core's face)
                if here != owner and not here.startswith(owner + "."):
                    reaching.append(f"{module}:{node.lineno} -> {full}")
    assert sorted(set(reaching)) == []


def test_no_private_name_crosses_a_module_boundary():
    # Invariant: a name another module imports is plain; a leading underscore means "this
    # module only". (Importing a private *module* of one's own package is fine.)
    modules = _modules()
    crossing = []
    for module, path in modules.items():
        for target, names, node in _import_nodes(module, path):
            for name in names:
                if name.startswith("_") and f"{target}.{name}" not in modules \
                        and not name.startswith("__"):
                    crossing.append(f"{module}:{node.lineno} imports {name} from {target}")
    assert sorted(crossing) == []


def _all_of(path: pathlib.Path) -> list[str] | None:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    return None


def _defined(path: pathlib.Path) -> set[str]:
    out = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                out.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, ast.ImportFrom) and not node.level \
                and not (node.module or "").startswith("speechpipe"):
            # a third-party name made ours (torch's IterDataPipe in the core) is ours to list
            out.update(alias.asname or alias.name for alias in node.names)
    return out


@pytest.mark.parametrize("module", sorted(m for m, p in _modules().items()
                                          if p.name != "__init__.py"))
def test_a_modules_all_lists_only_what_it_defines(module):
    path = _modules()[module]
    names = _all_of(path)
    if names is None:
        return
    assert sorted(set(names) - _defined(path)) == [], f"{module} re-exports"
    assert names == sorted(names), f"{module}: __all__ is not sorted"


def test_each_public_name_has_one_defining_module():
    # Invariant: outside the faces, exactly one module lists a public name in its __all__
    listed: dict[str, list[str]] = {}
    for module, path in _modules().items():
        if path.name == "__init__.py":
            continue
        for name in _all_of(path) or []:
            listed.setdefault(name, []).append(module)
    twice = {name: where for name, where in listed.items()
             if name in speechpipe.__all__ and len(where) > 1}
    assert twice == {}


@pytest.mark.parametrize("module", sorted(m for m in _modules() if m))
def test_no_room_is_too_big(module):
    path = _modules()[module]
    lines = path.read_text().splitlines()
    assert len(lines) <= MAX_MODULE_LINES, f"{module}: {len(lines)} lines"
    long = []
    for node in ast.walk(ast.parse("\n".join(lines))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            size = node.end_lineno - node.lineno + 1
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            reason = lines[first - 2].strip() if first >= 2 else ""
            if size > MAX_FUNCTION_LINES and not reason.startswith("# long:"):
                long.append(f"{node.name} ({size} lines)")
    assert long == []


# --------------------------------------------------------------------------- the tests' house

#: The folders of tests/: one per stage package (``_core`` is ``core``), and one per room
#: outside the pipes (the loader, packing, recipes, the tools, the house's own rules).
TEST_FOLDERS = {
    "core", "sources", "shards", "remote", "decode", "kaldi", "interop", "audio", "text",
    "order", "batching", "collate", "concurrency", "distributed", "memory", "loader", "pack",
    "recipes", "tools", "house",
}
TESTS = pathlib.Path(__file__).resolve().parents[1]


def test_tests_follow_the_packages():
    """Every test module sits in the folder of the package or room it tests; every stage
    package has its folder."""
    loose = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert loose == [], f"test modules outside a package's folder: {loose}"
    folders = {p.parent.name for p in TESTS.glob("*/test_*.py")}
    assert folders <= TEST_FOLDERS, f"unknown test folders: {sorted(folders - TEST_FOLDERS)}"
    packages = {p.name.lstrip("_") for p in (ROOT / "pipes").iterdir()
                if p.is_dir() and (p / "__init__.py").exists()}
    assert packages <= folders, f"stage packages without tests: {sorted(packages - folders)}"
