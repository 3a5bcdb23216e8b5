"""The house (issue 19): speechpipe imports in one direction, and no room is too big.

Invariant: every module sits on a floor -- base -> sources -> parse/decode -> transform ->
order/batch -> collate -> loader/distributed -> recipes -> tools -> CLI -- and imports only
from its own floor or lower ones, at module level or inside a function; the import graph has
no cycle. No module is over ~800 lines and no function over ~80 lines, unless the line above
its ``def`` says why (``# long: <reason>``).
"""

from __future__ import annotations

import ast
import pathlib

import pytest

import speechpipe

ROOT = pathlib.Path(speechpipe.__file__).parent

FLOORS = [
    ("base", ["errors", "sample", "seeding", "diagnostics", "remote", "index", "compact",
              "progress",
              "transfer", "testing", "pipes._base", "pipes._state", "pipes._graph",
              "pipes._restore"]),
    ("sources", ["pipes.sources", "pipes._tar", "pipes._mmap", "pipes._readahead",
                 "pipes.shards", "pipes.manifests"]),
    ("parse/decode", ["pipes.codecs", "pipes.audio_io", "pipes.decode", "pipes.lhotse_io", "pipes.hf_datasets",
                      "pipes.shard_writer", "pipes.kaldi_tables", "pipes.kaldi_ark",
                      "pipes.kaldi_values", "pipes.kaldi"]),
    ("transform", ["pipes._audio_common", "pipes.audio", "pipes.kaldi_fbank", "pipes.features",
                   "pipes.augment", "pipes.noise", "pipes.cmvn", "pipes.text_normalization",
                   "pipes.tokenizers",
                   "pipes.text"]),
    ("order/batch", ["pipes.constraints", "pipes.lengths", "pipes.batching",
                     "pipes.sample_lists", "pipes.assignment", "pipes.plans", "pipes.sharding", "pipes.order",
                     "pipes.mixing", "pipes.views", "pipes.threads", "pipes.device",
                     "pipes.concurrency"]),
    ("collate", ["pipes.collate"]),
    ("loader/distributed", ["pipes.steps", "pipes.distributed", "epochs", "loader", "nodes"]),
    ("recipes", ["recipes"]),
    ("tools", ["pack", "stats", "demo"]),
    ("CLI", ["cli"]),
]
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


def _imports(module: str, path: pathlib.Path, known: set[str]) -> set[str]:
    """The speechpipe modules ``module`` imports, anywhere in its file."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1] if node.level > 1 else package
                target = ".".join(["speechpipe"] + base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [target] + [f"{target}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            if not name.startswith("speechpipe."):
                continue
            name = name[len("speechpipe."):]
            while name not in known and "." in name:
                name = name.rsplit(".", 1)[0]
            if name in known and name != module and name not in ("pipes", "recipes"):
                out.add(name)
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules) - {""}
    return {m: _imports(m, p, known) for m, p in modules.items() if m}


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
