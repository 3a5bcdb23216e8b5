"""One module per corpus: ``download_<corpus>``, ``prepare_<corpus>`` and pipeline builders.

A recipe module (``speechpipe/recipes/<corpus>.py``) is a fixed set of names (STYLE rule 13)::

    PARTS = ("dev-clean", ...)                  # the corpus's official parts
    download_<corpus>(target_dir, parts=..., force=False, *, base_url=..., checksums=None,
                      progress=True) -> Path    # the corpus folder that prepare reads
    prepare_<corpus>(corpus_dir, output_dir=None, parts="auto", num_jobs=1, *,
                     on_mismatch="error", force=False, progress=True,
                     **checks) -> dict[part, manifest]  # checks: sample_rate, verify,
                                                         # on_error, empty_text,
                                                         # executor, step
    <corpus>_train(manifests, ...) / <corpus>_valid(...) / <corpus>_test(...)   # pipelines

and is listed in :data:`RECIPES`, which the ``speechpipe download`` and ``speechpipe prepare``
commands (:mod:`speechpipe.cli.download`, :mod:`speechpipe.cli.prepare`) forward to. The
building blocks, so that a recipe holds only what is particular to its corpus (the layout, the
transcript format, the defaults of its usual practice), are exported here:

- **download** (``_download``): :func:`download_and_extract` (resumable, checksum-verified,
  safe extraction, idempotent), :class:`Archive` and :func:`download_parts`;
- **prepare** (``_prepare``): the ``samples`` manifests (:func:`manifest_path`, one JSON line
  per utterance), :func:`resolve_parts`, :func:`check_pairs`, :func:`measure_audio`,
  :func:`prepare_parts` (with its checks, ``_checks``: :func:`verify_audio`, the one
  empty-transcript policy :data:`EMPTY_TEXT`, the record that makes reruns idempotent, and
  the :class:`PartReport` of each part; the verification as a job array, ``_jobs``: a plan,
  tasks, a merge), :func:`resolve_manifests`;
- **pipelines** (``_pipelines``): :func:`train_pipeline` (by default its batches planned over
  virtual streams on the manifests' rows, ``_planned``: the same for any ranks and workers),
  :func:`eval_pipeline`,
  :func:`semi_supervised_pipeline` over manifests, their :class:`FrontEnd` (speed
  perturbation, reverberation and noise, features, tokenization), :func:`augment_source`
  (a noise or response manifest as the source ``add_noise`` / ``reverberate`` read), and
  :func:`pipeline_report`.

**Adding a corpus** -- write ``speechpipe/recipes/<corpus>.py`` with the names above (see
``librispeech.py``: :class:`Archive` entries per part, a ``_part_samples`` function that
validates the layout and returns samples, thin pipeline builders over these), add it to
:data:`RECIPES`, and test it on a tiny fixture in the corpus's real layout under
``tests/fixtures/<corpus>/``.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from ._download import Archive, download_and_extract, download_parts, parse_checksum, safe_extract
from ._pipelines import (
    FrontEnd,
    augment_source,
    eval_pipeline,
    manifest_samples,
    pipeline_report,
    semi_supervised_pipeline,
    train_pipeline,
)
from ._checks import EMPTY_TEXT, PartReport, verify_audio
from ._prepare import (
    AUDIO_PATH,
    FEATS_PATH,
    MANIFEST_KIND,
    OFFSET,
    ON_MISMATCH,
    PreparedParts,
    check_pairs,
    manifest_path,
    measure_audio,
    prepare_parts,
    resolve_manifests,
    resolve_parts,
)

__all__ = [
    "AUDIO_PATH",
    "Archive",
    "EMPTY_TEXT",
    "FEATS_PATH",
    "FrontEnd",
    "MANIFEST_KIND",
    "OFFSET",
    "ON_MISMATCH",
    "PartReport",
    "PreparedParts",
    "RECIPES",
    "augment_source",
    "check_pairs",
    "download_and_extract",
    "download_parts",
    "eval_pipeline",
    "get_recipe",
    "manifest_path",
    "manifest_samples",
    "measure_audio",
    "parse_checksum",
    "pipeline_report",
    "prepare_parts",
    "resolve_manifests",
    "resolve_parts",
    "safe_extract",
    "semi_supervised_pipeline",
    "train_pipeline",
    "verify_audio",
]

#: Corpus name -> recipe module. The CLI's ``download``/``prepare`` choices; each module has
#: ``PARTS``, ``prepare_<name>`` and (unless the corpus is made locally) ``download_<name>``.
RECIPES: dict[str, str] = {
    "aishell": "speechpipe.recipes.aishell",
    "commonvoice": "speechpipe.recipes.commonvoice",
    "kaldi_dir": "speechpipe.recipes.kaldi_dir",
    "librispeech": "speechpipe.recipes.librispeech",
    "ljspeech": "speechpipe.recipes.ljspeech",
    "musan": "speechpipe.recipes.musan",
    "rirs_noises": "speechpipe.recipes.rirs_noises",
    "wenetspeech": "speechpipe.recipes.wenetspeech",
}


def get_recipe(corpus: str) -> ModuleType:
    """The recipe module of ``corpus`` (a key of :data:`RECIPES`).

    >>> get_recipe("librispeech").PARTS[:2]
    ('dev-clean', 'dev-other')
    """
    if corpus not in RECIPES:
        raise ValueError(f"unknown corpus {corpus!r}; known: {', '.join(sorted(RECIPES))}")
    return importlib.import_module(RECIPES[corpus])
