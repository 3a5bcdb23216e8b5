"""mkdocs hooks for the docs site (loaded by ``hooks:`` in mkdocs.yml).

The functional names (``pipe.block_batch(...)``) are the larger half of speechpipe's API, and
their classes are reached through torch's registry, not through a fixed module path. The
reference page (docs/reference.md) holds a placeholder line, ``<!-- functional names -->``;
:func:`on_page_markdown` replaces it with one mkdocstrings entry per name speechpipe registers,
read from the registry of the speechpipe being documented, so the page follows the code when
a pipe class moves to another module and lists a new verb without an edit.

The benchmarks page (docs/guide/benchmarks.md) is made the same way: ``<!-- benchmark list
-->`` becomes a table of ``benchmarks/bench_*.py`` with each module's summary, and
``<!-- include benchmarks/README.md -->`` the figures themselves (that file's sections,
without its title line): they live in that file only.
"""

from __future__ import annotations

import ast
import pathlib
import re
from typing import Any

PLACEHOLDER = "<!-- functional names -->"


def functional_names() -> list[tuple[str, str, type]]:
    """``(kind, name, class)`` of every functional name speechpipe registers, sorted."""
    from torch.utils.data import IterDataPipe, MapDataPipe

    import speechpipe  # noqa: F401  (registers the names)

    out = []
    for kind, base in (("IterDataPipe", IterDataPipe), ("MapDataPipe", MapDataPipe)):
        for name, function in base.functions.items():
            cls = function.args[0]  # functools.partial(_class_function, cls, ...)
            if cls.__module__.split(".")[0] == "speechpipe":
                out.append((kind, name, cls))
    return sorted(out, key=lambda entry: (entry[1], entry[0]))


def verb_reference() -> str:
    """The Markdown of the functional names: a heading and a mkdocstrings entry per name."""
    parts = []
    for kind, name, cls in functional_names():
        heading = f"### `{name}`" + (" (map-style)" if kind == "MapDataPipe" else "")
        parts.append(f"{heading}\n\n::: {cls.__module__}.{cls.__qualname__}\n"
                     "    options:\n      show_root_heading: false\n"
                     "      show_root_toc_entry: false\n      members: false\n")
    return "\n".join(parts)


def on_page_markdown(markdown: str, page: Any, config: Any, **kwargs: Any) -> str:
    root = pathlib.Path(config.config_file_path).parent
    if PLACEHOLDER in markdown:
        markdown = markdown.replace(PLACEHOLDER, verb_reference())
    if BENCHMARK_LIST in markdown:
        markdown = markdown.replace(BENCHMARK_LIST, benchmark_list(root))
    return INCLUDE.sub(lambda found: include(root, found.group(1)), markdown)


# --------------------------------------------------------------------------- benchmarks page

BENCHMARK_LIST = "<!-- benchmark list -->"
INCLUDE = re.compile(r"^<!-- include (\S+) -->$", re.M)


def _plain(text: str) -> str:
    """A docstring's reStructuredText roles and double backticks as Markdown code."""
    text = re.sub(r":\w+:`~?(?:[\w.]*\.)?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def benchmark_list(root: pathlib.Path) -> str:
    """A table of the benchmark modules and the first paragraph of each one's docstring
    (read with ``ast``, nothing imported)."""
    rows = ["| benchmark | what it measures |", "|---|---|"]
    for path in sorted((root / "benchmarks").glob("bench_*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        summary = " ".join(doc.split("\n\n")[0].split())
        rows.append(f"| `python -m benchmarks {path.stem}` | {_plain(summary)} |")
    return "\n".join(rows)


def include(root: pathlib.Path, name: str) -> str:
    """The Markdown file ``name`` (relative to the repository root) without its title line,
    so that its sections sit under the including page's title."""
    text = (root / name).read_text(encoding="utf-8")
    return re.sub(r"\A# .*\n", "", text)
