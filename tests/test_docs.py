"""The docs run as written, page by page, and the site builds with warnings as errors.

Every page under ``docs/`` (and README.md) is run on its own: its ```python blocks (fences at
the start of a line), in order, concatenated with no text rewritten, as one script in a fresh
interpreter (``sys.executable``) whose working directory is a new empty temporary folder --
as a reader runs a page after ``make demo`` -- so that no page depends on another, and a
failing page fails alone. Blocks fenced ```py, ```sh or ```text are shown, not run.

The tests below then check that what each block promises is what came out: they read the
files the blocks wrote and the lines they printed. ``test_site_builds_strict`` builds the site
with ``mkdocs build --strict`` (warnings are errors) into a temporary folder, and checks that
the API reference holds every public name.
"""

from __future__ import annotations

import ast
import dataclasses
import gzip
import json
import os
import pathlib
import re
import subprocess
import sys
import time

import kaldiio
import numpy as np
import pytest
import torch

import speechpipe as sp

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"
CORPUS = pathlib.Path(sp.DEMO_CORPUS)
TIMEOUT = 300  # seconds per page; each takes well under a minute on an idle 2-core machine

PAGES = sorted(p.relative_to(ROOT).as_posix() for p in DOCS.rglob("*.md")) + ["README.md"]


def python_blocks(page: str) -> list[str]:
    """The page's ```python blocks (fences at the start of a line), in order."""
    text = (ROOT / page).read_text(encoding="utf-8")
    return re.findall(r"^```python\n(.*?)^```$", text, re.S | re.M)


@dataclasses.dataclass
class PageRun:
    page: str
    folder: pathlib.Path  # the working directory the blocks ran in
    lines: list[str]  # what they printed
    seconds: float

    def line(self, pattern: str) -> re.Match:
        """The first printed line matching ``pattern`` (a regex, matched at the start)."""
        for line in self.lines:
            found = re.match(pattern, line)
            if found:
                return found
        raise AssertionError(f"{self.page}: no printed line matches {pattern!r}; printed:\n"
                             + "\n".join(self.lines))


_RUNS: dict[str, PageRun] = {}


@pytest.fixture(scope="module")
def run_page(tmp_path_factory):
    """``run_page(page)``: run the page's python blocks as one script (once per module)."""

    def run(page: str) -> PageRun:
        if page not in _RUNS:
            folder = tmp_path_factory.mktemp(re.sub(r"\W", "_", page))
            script = "".join(python_blocks(page))
            env = dict(os.environ)  # the venv's console scripts (speechpipe) on the PATH
            env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
            started = time.monotonic()
            result = subprocess.run([sys.executable, "-c", script], cwd=folder, env=env,
                                    capture_output=True, text=True, timeout=TIMEOUT)
            seconds = time.monotonic() - started
            assert result.returncode == 0, (
                f"{page}: its python blocks failed (exit {result.returncode}):\n"
                f"{result.stdout[-3000:]}\n{result.stderr}")
            assert "Warning" not in result.stderr, f"{page}: {result.stderr}"  # a reader sees it
            _RUNS[page] = PageRun(page, folder, result.stdout.splitlines(), seconds)
        return _RUNS[page]

    return run


def demo_transcripts() -> dict[str, str]:
    out = {}
    for path in sorted(CORPUS.rglob("*.trans.txt")):
        for line in path.read_text(encoding="utf-8").splitlines():
            key, text = line.split(" ", 1)
            out[key] = text
    return out


# --------------------------------------------------------------------------- every page


@pytest.mark.parametrize("page", PAGES)
def test_page_runs_as_written(page, run_page):
    """Each page's blocks run on their own, in a new empty folder, without a warning."""
    if not python_blocks(page):
        pytest.skip(f"{page} has no python block")
    ran = run_page(page)
    print(f"{page}: {ran.seconds:.1f} s")  # shown with pytest -s


@pytest.mark.parametrize("page", PAGES)
def test_page_uses_the_public_face_only(page):
    """Blocks import speechpipe as sp (and nothing of it by module path), and every sp.<name>
    they use is public: in speechpipe.__all__ (or sp.recipes.<corpus>.<public name>)."""
    code = "".join(python_blocks(page))
    imports = re.findall(r"^[ \t]*(?:import|from)[ \t]+speechpipe\S*.*$", code, re.M)
    assert set(imports) <= {"import speechpipe as sp"}, imports
    assert "speechpipe." not in code, page
    for name in set(re.findall(r"\bsp\.(\w+)", code)):
        assert name in sp.__all__, f"{page}: sp.{name}"
    for corpus, name in set(re.findall(r"\bsp\.recipes\.(\w+)\.(\w+)", code)):
        assert corpus in sp.recipes.RECIPES, f"{page}: sp.recipes.{corpus}"
        assert name in sp.get_recipe(corpus).__all__, f"{page}: sp.recipes.{corpus}.{name}"


def test_every_page_is_in_the_nav_or_waits_for_its_author():
    """A page the nav does not name is a page nobody finds: every docs page is in mkdocs.yml
    (the pages other branches write are listed there commented out until they merge)."""
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in PAGES:
        if page.startswith("docs/"):
            assert page[len("docs/"):] in nav, page


# --------------------------------------------------------------------------- the site


@pytest.mark.slow
def test_site_builds_strict(tmp_path):
    """``mkdocs build --strict`` (offline, warnings are errors) and a reference that holds
    every public name, every registered functional name and every recipe."""
    site = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 0, result.stderr
    reference = (site / "reference" / "index.html").read_text(encoding="utf-8")
    anchors = set(re.findall(r'id="([\w.]+)"', reference))
    documented = {a.rsplit(".", 1)[-1] for a in anchors if a.startswith("speechpipe.")}
    in_prose = {"DEMO_CORPUS", "IterableWrapper", "SequenceWrapper", "recipes"}
    assert set(sp.__all__) - in_prose <= documented, set(sp.__all__) - in_prose - documented
    for name in in_prose:
        assert f"sp.{name}" in reference, name
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import mkdocs_hooks
    finally:
        sys.path.remove(str(ROOT / "tools"))
    names = mkdocs_hooks.functional_names()
    assert len(names) > 40
    for _, name, cls in names:
        assert f"{cls.__module__}.{cls.__qualname__}" in anchors, name
        assert f'id="{name}"' in reference, name
    for corpus in sp.recipes.RECIPES:
        assert f"speechpipe.recipes.{corpus}" in anchors, corpus


def test_doctest_fences_leave_fenced_blocks_and_prose_alone():
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from griffe_doctest_blocks import fence_doctests
    finally:
        sys.path.remove(str(ROOT / "tools"))
    text = "Summary.\n\n    >>> x = [1][0]\n    >>> x\n    1\n\n```python\n>>> kept\n```\nEnd."
    assert fence_doctests(text) == (
        "Summary.\n\n    ```pycon\n    >>> x = [1][0]\n    >>> x\n    1\n    ```\n\n"
        "```python\n>>> kept\n```\nEnd.")
    assert fence_doctests(">>> 1") == "```pycon\n>>> 1\n```"
