"""mkdocs hooks for the docs site (loaded by ``hooks:`` in mkdocs.yml).

The functional names (``pipe.block_batch(...)``) are the larger half of speechpipe's API, and
their classes are reached through torch's registry, not through a fixed module path. The
reference page (docs/reference.md) holds a placeholder line, ``<!-- functional names -->``;
:func:`on_page_markdown` replaces it with one mkdocstrings entry per name speechpipe registers,
read from the registry of the speechpipe being documented, so the page follows the code when
a pipe class moves to another module and lists a new verb without an edit.
"""

from __future__ import annotations

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
                     "    options:\n      show_root_heading: false\n      members: false\n")
    return "\n".join(parts)


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    if PLACEHOLDER in markdown:
        markdown = markdown.replace(PLACEHOLDER, verb_reference())
    return markdown
