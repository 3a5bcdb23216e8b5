"""Transcripts: normalization and tokenizers, applied to samples on the fly.

Labels are stored as text (in shards, Kaldi ``text`` files, manifests) and encoded when the data
is loaded, so that changing the tokenizer never means repacking the data. This module holds the
two verbs of that step and the objects they apply:

- ``normalize_text`` (:class:`TranscriptNormalizerIterDataPipe`) applies a
  :class:`TextNormalizer` -- a frozen, picklable set of rules: Unicode form, replacements, case,
  dropped tags (GigaSpeech ``<SIL>``), punctuation, spaces (all of them, or only those next to
  CJK characters) -- to one field of each sample.
- ``tokenize`` (:class:`TokenizerIterDataPipe`) encodes a field with a tokenizer into
  ``sample["tokens"]``, an ``int64`` array, and counts unknown tokens in a :class:`TokenStats`
  that it reports (and warns about above ``max_unk_rate``).

Tokenizers share one small interface (:class:`BaseTokenizer`: ``encode``, ``decode``,
``vocab_size``, ``save``, ``load``, ``build``) and pickle, so DataLoader workers get a copy:

- :class:`CharTokenizer`: one token per character, spaces as ``"▁"`` or dropped;
- :class:`WordTokenizer`: one token per whitespace-separated word;
- :class:`SentencePieceTokenizer`: a sentencepiece model (unigram, BPE, char), trained in
  memory and kept as its serialized bytes.

Built tokenizers follow the ESPnet/WeNet id convention: ``<blank>`` is 0 (the CTC blank),
``<unk>`` is 1, ``<sos/eos>`` is the last id, ``vocab_size - 1``. Char and word tokenizers are
saved as one JSON file, sentencepiece ones as their ``.model`` file; :func:`load_tokenizer`
tells them apart by content.

**Spaces and CJK text.** A tokenizer trained on text without spaces (a Chinese character
model) knows no space symbol, so a space left in a label becomes ``<unk>`` -- silently, and
damaging for training. Normalize Chinese labels with ``remove_spaces="cjk"`` before building the
tokenizer and when tokenizing; ``tokenize``'s report names spaces among the unknown symbols
when this happens. Tokenizers that split on spaces (word) are not affected.

The command ``speechpipe tokenizer build`` (:mod:`speechpipe.cli.tokenizer`) builds a
tokenizer from Kaldi ``text`` files or manifests (:func:`read_transcripts`) and prints its
coverage of the training text.

This module holds the ``tokenize`` stage and transcript reading; normalisation lives in
:mod:`speechpipe.pipes.text._normalize` and the tokenizers in
:mod:`speechpipe.pipes.text._tokenizers`, both re-exported here.
"""

from __future__ import annotations

import gzip
import os
import warnings
from collections import Counter
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from ...diagnostics import Diagnostics, Ledger, check_on_error
from ...errors import DataError, MissingDataError
from ...sample import KEY, SOURCE, TEXT, TOKENS, Sample
from .._core import functional_datapipe, IterDataPipe
from ._normalize import check_field, check_normalizer, sample_field
from ._tokenizers import BaseTokenizer, load_tokenizer, nonspace_len

__all__ = [
    "TokenStats",
    "Tokenizer",
    "TokenizerIterDataPipe",
    "UnknownTokenWarning",
    "read_transcripts",
]


# --------------------------------------------------------------------------- tokenize


class UnknownTokenWarning(UserWarning):
    """Warned at the end of a ``tokenize`` pass whose share of ``<unk>`` tokens was too high."""


class TokenStats(Ledger):
    """Counts of tokens and ``<unk>`` tokens, with the unknown symbols, for a report.

    ``tokenize`` keeps one per pass (per process: each DataLoader worker counts its own share);
    ``speechpipe tokenizer build`` uses one for its coverage summary.

    >>> stats = TokenStats("tokenize")
    >>> from speechpipe import CharTokenizer
    >>> tok = CharTokenizer.build(["我爱"])
    >>> stats.add("u1", "我 爱", tok.encode("我 爱"), tok)
    >>> print(stats.report())  # doctest: +NORMALIZE_WHITESPACE
    tokenize: 1 sample(s), 3 token(s); 1 <unk> token(s) (33.33%) in 1 sample(s), e.g. 'u1'
      unknown symbols: ' ' (U+0020) x1
      hint: spaces became <unk>: the tokenizer was built without spaces (CJK text?);
      normalize the text with TextNormalizer(remove_spaces='cjk') when building and tokenizing
    """

    def __init__(self, stage: str = "tokenize", max_examples: int = 3) -> None:
        self.stage = stage
        self.max_examples = max_examples
        self.reset()

    def reset(self) -> None:
        self.samples = 0
        self.tokens = 0
        self.unk_tokens = 0
        self.samples_with_unk = 0
        self.chars = 0
        self.unknown_chars = 0
        self.unknown: Counter[str] = Counter()
        self.examples: list[str] = []

    def add(self, key: Any, text: str, ids: Sequence[int], tokenizer: BaseTokenizer) -> None:
        """Count one encoded text (``unknown_symbols`` is asked only when ``<unk>`` occurs)."""
        self.samples += 1
        self.tokens += len(ids)
        self.chars += nonspace_len(text)
        unk = tokenizer.unk_id
        n_unk = sum(1 for i in ids if i == unk)
        if n_unk:
            self.unk_tokens += n_unk
            self.samples_with_unk += 1
            if len(self.examples) < self.max_examples:
                self.examples.append(str(key))
            symbols = tokenizer.unknown_symbols(text)
            self.unknown.update(symbols)
            self.unknown_chars += sum(nonspace_len(s) for s in symbols)

    def to_dict(self) -> dict:
        """The counts as plain data (what a DataLoader worker of ``build_loader`` reports)."""
        return {"samples": self.samples, "tokens": self.tokens, "unk_tokens": self.unk_tokens,
                "samples_with_unk": self.samples_with_unk, "chars": self.chars,
                "unknown_chars": self.unknown_chars, "unknown": dict(self.unknown),
                "examples": list(self.examples)}

    def merge(self, data: dict) -> None:
        """Add the counts of :meth:`to_dict` output (another worker's pass).

        >>> a, b = TokenStats(), TokenStats()
        >>> from speechpipe import CharTokenizer
        >>> tok = CharTokenizer.build(["ab"])
        >>> a.add("u1", "ab", tok.encode("ab"), tok); b.add("u2", "ac", tok.encode("ac"), tok)
        >>> a.merge(b.to_dict()); a.samples, a.tokens, a.unk_tokens, a.examples
        (2, 4, 1, ['u2'])
        """
        for name in ("samples", "tokens", "unk_tokens", "samples_with_unk", "chars",
                     "unknown_chars"):
            setattr(self, name, getattr(self, name) + int(data[name]))
        self.unknown.update(data["unknown"])
        self.examples.extend(data["examples"][:self.max_examples - len(self.examples)])

    @property
    def unk_rate(self) -> float:
        """``<unk>`` tokens / tokens (0 when there were no tokens)."""
        return self.unk_tokens / self.tokens if self.tokens else 0.0

    @property
    def coverage(self) -> float:
        """Share of non-space characters outside unknown symbols (1 when there were none)."""
        return 1.0 - self.unknown_chars / self.chars if self.chars else 1.0

    def report(self) -> str:
        head = f"{self.stage}: {self.samples} sample(s), {self.tokens} token(s); "
        if not self.unk_tokens:
            return head + "no <unk> token"
        lines = [head + f"{self.unk_tokens} <unk> token(s) ({100 * self.unk_rate:.2f}%) in "
                 f"{self.samples_with_unk} sample(s), e.g. "
                 + ", ".join(repr(k) for k in self.examples)]
        if self.unknown:
            shown = ", ".join(f"{s!r}{_code_points(s)} x{n}"
                              for s, n in self.unknown.most_common(5))
            more = len(self.unknown) - 5
            lines.append(f"  unknown symbols: {shown}" + (f" (+{more} more)" if more > 0 else ""))
        if any(s.isspace() for s in self.unknown):
            lines.append("  hint: spaces became <unk>: the tokenizer was built without spaces "
                         "(CJK text?); normalize the text with "
                         "TextNormalizer(remove_spaces='cjk') when building and tokenizing")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"TokenStats({self.stage!r}, samples={self.samples}, tokens={self.tokens}, "
                f"unk_tokens={self.unk_tokens})")


def _code_points(symbol: str) -> str:
    if (len(symbol) == 1 and not symbol.isprintable()) or symbol.isspace():
        return " (" + " ".join(f"U+{ord(c):04X}" for c in symbol) + ")"
    return ""


@functional_datapipe("tokenize")
class TokenizerIterDataPipe(IterDataPipe[Sample]):
    """Encode a text field of each sample into token ids (functional name: ``tokenize``).

    Consumes sample dicts with a ``str`` in ``field`` and yields a shallow copy of each with
    ``out`` (``"tokens"``) set to a ``numpy.int64`` array ``(length,)``; ``field`` itself is
    unchanged. ``<unk>`` tokens are counted in ``self.stats`` (:class:`TokenStats`, reset at
    the start of each pass, per process); print ``self.stats.report()`` to see them.

    Args:
        source_datapipe: pipe of sample dicts.
        tokenizer: a :class:`CharTokenizer`, :class:`WordTokenizer` or
            :class:`SentencePieceTokenizer`, or the path of a tokenizer file
            (:func:`load_tokenizer`: JSON, ``.model``, WeNet ``units.txt``, ESPnet
            ``token_list``), loaded when the pipe is first iterated in each process.
        field: the field to encode.
        out: the field to write the ids to.
        normalizer: a :class:`TextNormalizer` applied to the text before encoding (only to
            what is encoded; use ``normalize_text`` to change the stored text).
        max_unk_rate: at the end of a pass whose ``<unk>`` share of tokens is above this,
            warn (:class:`UnknownTokenWarning`) with the report; None never warns.
        on_error: ``"raise"`` a :class:`~speechpipe.errors.DataError` naming the sample's
            key when ``field`` is absent or not a ``str``, or ``"skip"`` the sample and
            count it in ``self.diagnostics``.

    >>> from speechpipe import IterableWrapper
    >>> from speechpipe import CharTokenizer, TextNormalizer
    >>> tok = CharTokenizer.build(["我爱北京"])
    >>> pipe = IterableWrapper([{"key": "u1", "text": "我 爱"}]).tokenize(
    ...     tok, normalizer=TextNormalizer(remove_spaces="cjk"))
    >>> [s["tokens"].tolist() for s in pipe], pipe.stats.unk_tokens
    ([[4, 5]], 0)
    """

    holds_nothing = True  # item by item: nothing kept between two yields

    def __init__(
        self,
        source_datapipe: IterDataPipe,
        tokenizer: BaseTokenizer,
        *,
        field: str = TEXT,
        out: str = TOKENS,
        normalizer: Callable[[str], str] | None = None,
        max_unk_rate: float | None = 0.01,
        on_error: str = "raise",
    ) -> None:
        if not isinstance(tokenizer, (str, os.PathLike)) and not all(
                hasattr(tokenizer, a) for a in ("encode", "unk_id", "unknown_symbols")):
            raise TypeError(f"tokenizer must be a speechpipe tokenizer (load one with "
                            f"load_tokenizer(path)), got {tokenizer!r}")
        if max_unk_rate is not None and (isinstance(max_unk_rate, bool) or not isinstance(
                max_unk_rate, (int, float)) or not 0 <= max_unk_rate <= 1):
            raise ValueError(f"max_unk_rate must be None or in [0, 1], got {max_unk_rate!r}")
        self.source_datapipe = source_datapipe
        self.tokenizer = tokenizer
        self.field = check_field(field, "field")
        self.out = check_field(out, "out")
        self.normalizer = check_normalizer(normalizer)
        self.max_unk_rate = max_unk_rate
        self.on_error = check_on_error(on_error)
        self.diagnostics = Diagnostics("tokenize")
        self.stats = TokenStats("tokenize")

    def __iter__(self) -> Iterator[Sample]:
        self.diagnostics.reset()
        self.stats.reset()
        tokenizer, normalizer, stats = self.tokenizer, self.normalizer, self.stats
        if isinstance(tokenizer, (str, os.PathLike)):  # a path: read here, not when built
            tokenizer = load_tokenizer(tokenizer)
        for sample in self.source_datapipe:
            try:
                text = sample_field(sample, self.field, "tokenize")
            except DataError as err:
                self.diagnostics.handle(self.on_error, err, "no text")
                continue
            if normalizer is not None:
                text = normalizer(text)
            ids = tokenizer.encode(text)
            stats.add(sample.get(KEY), text, ids, tokenizer)
            out = dict(sample)
            out[self.out] = np.asarray(ids, dtype=np.int64)
            yield out
        self.diagnostics.warn_if_skipped()
        if self.max_unk_rate is not None and stats.unk_rate > self.max_unk_rate:
            warnings.warn(stats.report(), UnknownTokenWarning, stacklevel=2)

    def __len__(self) -> int:
        if self.on_error == "skip":
            raise TypeError("tokenize with on_error='skip' has no length: samples may be "
                            "skipped")
        return len(self.source_datapipe)


Tokenizer = TokenizerIterDataPipe


# --------------------------------------------------------------------------- transcripts

_MANIFEST_EXTENSIONS = (".jsonl", ".json", ".ndjson", ".tsv")


def read_transcripts(
    paths: str | os.PathLike | Iterable[str | os.PathLike], *, field: str = TEXT
) -> Iterator[tuple[str, str]]:
    """``(key, transcript)`` pairs from Kaldi ``text`` files and manifests, in file order.

    A path ending in ``.jsonl``, ``.json``, ``.ndjson`` or ``.tsv`` (optionally ``.gz``) is
    read as a manifest (:func:`~speechpipe.pipes.sources._manifests.read_manifest`) and its ``field``
    taken; any other as a Kaldi ``text`` table, ``<key> <transcript>`` per line (empty
    transcripts allowed; ``.gz`` read compressed).

    Raises:
        MissingDataError: a file does not exist.
        DataError: a malformed line, or a manifest line without a ``str`` ``field``; the
            message names the file and line.

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "text")
    >>> with open(path, "w", encoding="utf-8") as f:
    ...     _ = f.write("u1 HELLO WORLD\\nu2\\n")
    >>> list(read_transcripts(path))
    [('u1', 'HELLO WORLD'), ('u2', '')]
    """
    from ..kaldi import parse_scp_lines
    from ..sources import read_manifest

    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    for path in map(os.fspath, paths):
        stem = path[:-3] if path.endswith(".gz") else path
        if stem.endswith(_MANIFEST_EXTENSIONS):
            for sample in read_manifest(path):
                text = sample.get(field)
                if not isinstance(text, str):
                    problem = ("has no field" if field not in sample else
                               f"has a {type(text).__name__} in field")
                    raise DataError(f"manifest line {problem} {field!r}",
                                    source=sample.get(SOURCE, path), key=sample[KEY])
                yield sample[KEY], text
            continue
        try:
            stream = gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")
        except FileNotFoundError as exc:
            raise MissingDataError("text file not found", source=path) from exc
        except OSError as exc:
            raise DataError(f"cannot open text file: {exc.strerror or exc}", source=path) \
                from exc
        with stream:
            for entry in parse_scp_lines(stream, source=path, allow_empty=True):
                yield entry.key, entry.value
