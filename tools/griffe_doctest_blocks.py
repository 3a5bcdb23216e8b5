"""A griffe extension for the API reference (docs/reference.md): doctests as code blocks.

speechpipe's docstrings carry their executed examples as bare ``>>>`` lines (pytest's
``--doctest-modules`` runs them), outside any ``Examples:`` section. Rendered as Markdown,
a ``>>>`` line is a triple block quote and ``x[a][b]`` a reference link, so mkdocs would show
the examples as quotes and ``--strict`` would fail on links that are not links. This
extension fences each run of doctest lines (a ``>>>`` line, its ``...`` continuations and the
output that follows, up to a blank line) as a ```` ```pycon ```` block before the docstring is
parsed, and writes the reStructuredText roles the docstrings use for cross-references
(``:func:`~speechpipe.loader.build_loader```) as Markdown code (`` `build_loader` ``): left
as they are, they show as raw text. Loaded by ``mkdocs.yml`` (``extensions:`` of the
mkdocstrings python handler); it changes what the site shows, never the docstrings.
"""

from __future__ import annotations

import re
from typing import Any

import griffe


def fence_doctests(text: str) -> str:
    """Wrap each run of doctest lines in ``text`` in a ```` ```pycon ```` fence, indented as
    its first line; blocks the text fences itself are left alone (tests/house/test_docs.py).
    """
    out: list[str] = []
    inside = False
    fence = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("```"):
            fence = not fence  # a block the docstring fences itself: left alone
        if not fence and not inside and stripped.startswith(">>>"):
            indent = line[: len(line) - len(line.lstrip())]
            out.append(f"{indent}```pycon")
            inside = True
        elif inside and not stripped:
            out.append(f"{indent}```")
            inside = False
        out.append(line)
    if inside:
        out.append(f"{indent}```")
    return "\n".join(out)


ROLE = re.compile(r":(?:func|class|meth|attr|mod|data|exc|obj):`(~?)([^`]+)`")


def plain_roles(text: str) -> str:
    """``:func:`~a.b.c``` as `` `c` `` (the last part, as Sphinx shows ``~``), and
    ``:class:`a.B``` as `` `a.B` ``.

    >>> plain_roles("see :func:`~speechpipe.loader.build_loader` and :class:`torch.Tensor`")
    'see `build_loader` and `torch.Tensor`'
    """
    return ROLE.sub(lambda m: f"`{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2)}`",
                    text)


class DoctestBlocks(griffe.Extension):
    """Fence the doctests and plain the roles of every docstring griffe loads."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = plain_roles(fence_doctests(obj.docstring.value))
