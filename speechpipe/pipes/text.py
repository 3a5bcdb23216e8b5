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

The command ``speechpipe tokenizer build`` (:func:`add_tokenizer_command`) builds a tokenizer
from Kaldi ``text`` files or manifests and prints its coverage of the training text.
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import re
import sys
import unicodedata
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterable, Iterator, Mapping, Sequence

import numpy as np

from ..diagnostics import Diagnostics, check_on_error
from ..errors import DataError, MissingDataError
from ..sample import KEY, SOURCE, TEXT, TOKENS, Sample
from ._base import IterDataPipe, functional_datapipe

__all__ = [
    "BLANK",
    "BaseTokenizer",
    "CASES",
    "CharTokenizer",
    "REMOVE_SPACES",
    "SOS_EOS",
    "SentencePieceTokenizer",
    "TextNormalizer",
    "TokenStats",
    "Tokenizer",
    "TokenizerIterDataPipe",
    "TranscriptNormalizer",
    "TranscriptNormalizerIterDataPipe",
    "UNK",
    "UnknownTokenWarning",
    "WordTokenizer",
    "add_tokenizer_command",
    "build_tokenizer",
    "is_cjk",
    "load_tokenizer",
    "read_transcripts",
]

#: Values of ``TextNormalizer(case=...)``.
CASES = ("keep", "upper", "lower")
#: Values of ``TextNormalizer(remove_spaces=...)``.
REMOVE_SPACES = ("none", "all", "cjk")
#: Unicode normalization forms accepted by ``TextNormalizer(unicode_form=...)`` (or None).
UNICODE_FORMS = ("NFKC", "NFC", "NFKD", "NFD")

#: Special symbols of built tokenizers: id 0, id 1, and the last id.
BLANK = "<blank>"
UNK = "<unk>"
SOS_EOS = "<sos/eos>"
_SPECIALS = (BLANK, UNK, SOS_EOS)

_FORMAT_VERSION = 1
_APOSTROPHES = frozenset("'\u2019")  # ' and ’

# CJK characters for remove_spaces="cjk": Han ideographs, kana, bopomofo, Kangxi radicals and
# CJK punctuation. Not Hangul: Korean separates words with spaces.
_CJK_RANGES = (
    (0x2E80, 0x2FDF),  # CJK radicals supplement, Kangxi radicals
    (0x3001, 0x303F),  # CJK symbols and punctuation (not U+3000, the ideographic space)
    (0x3040, 0x30FF),  # Hiragana, Katakana
    (0x3100, 0x312F),  # Bopomofo
    (0x31A0, 0x31BF),  # Bopomofo extended
    (0x31F0, 0x31FF),  # Katakana phonetic extensions
    (0x3400, 0x4DBF),  # CJK unified ideographs extension A
    (0x4E00, 0x9FFF),  # CJK unified ideographs
    (0xF900, 0xFAFF),  # CJK compatibility ideographs
    (0xFF66, 0xFF9F),  # halfwidth Katakana
    (0x20000, 0x323AF),  # CJK unified ideographs extensions B-H, compatibility supplement
)
_CJK_CLASS = "".join(f"{chr(a)}-{chr(b)}" for a, b in _CJK_RANGES)
_CJK_SPACES = re.compile(rf"(?<=[{_CJK_CLASS}])\s+|\s+(?=[{_CJK_CLASS}])")
_SPACES = re.compile(r"\s+")


def is_cjk(char: str) -> bool:
    """True for a character that ``remove_spaces="cjk"`` treats as CJK (a Han ideograph, kana,
    bopomofo or CJK punctuation; not Hangul).

    >>> [is_cjk(c) for c in "我かA한"]
    [True, True, False, False]
    """
    code = ord(char)
    return any(a <= code <= b for a, b in _CJK_RANGES)


# --------------------------------------------------------------------------- normalization


@dataclass(frozen=True)
class TextNormalizer:
    """Rules that normalize a transcript; call it on a ``str``. Frozen and picklable.

    The steps run in this order: Unicode normalization, ``replace``, case, then (repeated while
    a tag is left) dropped tags, punctuation, spaces, and Unicode normalization again, so the
    result is stable: ``n(n(x)) == n(x)`` whenever ``replace`` is empty.

    Args:
        case: ``"keep"``, ``"upper"`` (``str.upper``) or ``"lower"`` (``str.lower``).
        unicode_form: ``"NFKC"`` (the default: full-width letters and digits become ASCII,
            the ideographic space a space, ligatures letters), another form name, or None to
            leave the text as it is.
        remove_punctuation: replace each punctuation character (Unicode category ``P*``:
            ``,.!?;:'"-()[]``, ``，。？``, ...) by a space. Symbols (``S*``: ``<>+$``) stay.
        keep_apostrophes: with ``remove_punctuation``, keep an apostrophe (``'`` or ``’``)
            that has a letter or digit on both sides (``don't``).
        collapse_spaces: turn each run of whitespace into one space and strip both ends.
        remove_spaces: ``"none"``; ``"all"``: remove every whitespace character; ``"cjk"``:
            remove a run of whitespace when the character on at least one side of it is CJK
            (:func:`is_cjk`), so English words in mixed text stay separated:
            ``"我 爱 NLP 和 speech"`` becomes ``"我爱NLP和speech"``.
        drop_tags: exact strings to remove (replaced by a space), such as GigaSpeech's
            ``("<SIL>", "<MUSIC>", "<NOISE>", "<OTHER>")``. Compared after the case mapping
            (a tag is case-mapped too), before punctuation removal (so ``[noise]`` works).
        replace: ``{old: new}`` (or pairs) applied in order with ``str.replace`` to the
            Unicode-normalized text before the case mapping, e.g. ``{"<COMMA>": ","}``.

    >>> TextNormalizer(case="upper", remove_punctuation=True)("Don't  stop, ｍｅ!")
    "DON'T STOP ME"
    >>> TextNormalizer(remove_spaces="cjk")("我 爱 NLP 和 speech")
    '我爱NLP和speech'
    """

    case: str = "keep"
    unicode_form: str | None = "NFKC"
    remove_punctuation: bool = False
    keep_apostrophes: bool = True
    collapse_spaces: bool = True
    remove_spaces: str = "none"
    drop_tags: tuple[str, ...] = ()
    replace: tuple[tuple[str, str], ...] = ()
    _tags: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.case not in CASES:
            raise ValueError(f"case must be one of {CASES}, got {self.case!r}")
        if self.unicode_form is not None and self.unicode_form not in UNICODE_FORMS:
            raise ValueError(
                f"unicode_form must be one of {UNICODE_FORMS} or None, got {self.unicode_form!r}"
            )
        if self.remove_spaces not in REMOVE_SPACES:
            raise ValueError(
                f"remove_spaces must be one of {REMOVE_SPACES}, got {self.remove_spaces!r}"
            )
        for name in ("remove_punctuation", "keep_apostrophes", "collapse_spaces"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        tags = self.drop_tags
        if isinstance(tags, str) or not isinstance(tags, Iterable):
            raise TypeError(f"drop_tags must be a sequence of str, got {tags!r}")
        tags = tuple(tags)
        for tag in tags:
            if not isinstance(tag, str) or not tag or any(c.isspace() for c in tag):
                raise ValueError(f"drop_tags must be non-empty str without spaces, got {tag!r}")
        pairs = self.replace
        if isinstance(pairs, Mapping):
            pairs = tuple(pairs.items())
        elif isinstance(pairs, str) or not isinstance(pairs, Iterable):
            raise TypeError(f"replace must be a mapping or (old, new) pairs, got {pairs!r}")
        pairs = tuple(tuple(p) if isinstance(p, (tuple, list)) else p for p in pairs)
        for pair in pairs:
            if not (isinstance(pair, tuple) and len(pair) == 2
                    and all(isinstance(s, str) for s in pair) and pair[0]):
                raise ValueError(f"replace entries must be (old, new) str with old non-empty, "
                                 f"got {pair!r}")
        object.__setattr__(self, "drop_tags", tags)
        object.__setattr__(self, "replace", pairs)
        # Tags are matched in the text's final form: normalized and case-mapped like it.
        object.__setattr__(
            self, "_tags", tuple(dict.fromkeys(self._unicode(self._case(self._unicode(t)))
                                               for t in tags))
        )

    def _unicode(self, text: str) -> str:
        return text if self.unicode_form is None else unicodedata.normalize(self.unicode_form,
                                                                            text)

    def _case(self, text: str) -> str:
        if self.case == "upper":
            return text.upper()
        if self.case == "lower":
            return text.lower()
        return text

    def _punctuation(self, text: str) -> str:
        out = []
        last = len(text) - 1
        for i, char in enumerate(text):
            if unicodedata.category(char)[0] != "P":
                out.append(char)
            elif (self.keep_apostrophes and char in _APOSTROPHES and 0 < i < last
                  and text[i - 1].isalnum() and text[i + 1].isalnum()):
                out.append(char)
            else:
                out.append(" ")
        return "".join(out)

    def _spaces(self, text: str) -> str:
        if self.remove_spaces == "all":
            return _SPACES.sub("", text)
        if self.collapse_spaces:
            text = _SPACES.sub(" ", text).strip()
        if self.remove_spaces == "cjk":
            text = _CJK_SPACES.sub("", text)
        return text

    def __call__(self, text: str) -> str:
        """Normalize one transcript."""
        if not isinstance(text, str):
            raise TypeError(f"TextNormalizer expects a str, got {type(text).__name__}")
        text = self._unicode(text)
        for old, new in self.replace:
            text = text.replace(old, new)
        text = self._unicode(self._case(text))
        while True:
            # Removing punctuation or spaces can join the pieces of a tag: go round again.
            while any(tag in text for tag in self._tags):
                for tag in self._tags:
                    text = text.replace(tag, " ")
            if self.remove_punctuation:
                text = self._punctuation(text)
            text = self._unicode(self._spaces(text))
            if not any(tag in text for tag in self._tags):
                return text

    normalize = __call__


def _sample_field(sample: Any, field_name: str, stage: str) -> str:
    """The ``str`` in ``sample[field_name]``, or a DataError naming the sample."""
    if not isinstance(sample, Mapping):
        raise DataError(f"{stage} expects sample dicts, got {type(sample).__name__}")
    where = {"source": sample.get(SOURCE), "key": sample.get(KEY)}
    if field_name not in sample:
        raise DataError(f"sample has no field {field_name!r} to {stage.replace('_', ' ')}",
                        **where)
    value = sample[field_name]
    if not isinstance(value, str):
        raise DataError(f"field {field_name!r} is a {type(value).__name__}, expected str",
                        **where)
    return value


def _check_field(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise TypeError(f"{name} must be a non-empty str, got {value!r}")
    return value


def _check_normalizer(normalizer: Any) -> Callable[[str], str] | None:
    if normalizer is not None and not callable(normalizer):
        raise TypeError(f"normalizer must be a TextNormalizer (or a callable str -> str), got "
                        f"{normalizer!r}")
    return normalizer


@functional_datapipe("normalize_text")
class TranscriptNormalizerIterDataPipe(IterDataPipe[Sample]):
    """Normalize a text field of each sample (functional name: ``normalize_text``).

    Consumes sample dicts and yields, for each, a shallow copy whose ``field`` (``"text"``)
    is replaced by its normalized form; the other fields are untouched. To normalize only what
    is encoded and keep the original transcript, pass the normalizer to ``tokenize`` instead.

    Args:
        source_datapipe: pipe of sample dicts.
        normalizer: a :class:`TextNormalizer` (or any picklable ``str -> str`` callable); by
            default one is made from ``options``.
        field: the sample field to normalize.
        on_error: ``"raise"`` a :class:`~speechpipe.errors.DataError` naming the sample's key
            when the field is absent or not a ``str``, or ``"skip"`` the sample and count it in
            ``self.diagnostics`` (reset each pass, warned about at its end).
        **options: :class:`TextNormalizer` arguments (``case="upper"``,
            ``remove_spaces="cjk"``, ...), when no ``normalizer`` is given.

    >>> from speechpipe.pipes._base import IterableWrapper
    >>> samples = IterableWrapper([{"key": "u1", "text": "我 爱 NLP ，和 speech"}])
    >>> [s["text"] for s in samples.normalize_text(remove_spaces="cjk", remove_punctuation=True)]
    ['我爱NLP和speech']
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe,
        normalizer: Callable[[str], str] | None = None,
        *,
        field: str = TEXT,
        on_error: str = "raise",
        **options: Any,
    ) -> None:
        if normalizer is not None and options:
            raise ValueError(f"pass either a normalizer or TextNormalizer options, not both "
                             f"(got options {sorted(options)})")
        self.source_datapipe = source_datapipe
        self.normalizer = (_check_normalizer(normalizer) if normalizer is not None
                           else TextNormalizer(**options))
        self.field = _check_field(field, "field")
        self.on_error = check_on_error(on_error)
        self.diagnostics = Diagnostics("normalize_text")

    def __iter__(self) -> Iterator[Sample]:
        self.diagnostics.reset()
        for sample in self.source_datapipe:
            try:
                text = _sample_field(sample, self.field, "normalize_text")
            except DataError as err:
                self.diagnostics.handle(self.on_error, err, "no text")
                continue
            out = dict(sample)
            out[self.field] = self.normalizer(text)
            yield out
        self.diagnostics.warn_if_skipped()

    def __len__(self) -> int:
        if self.on_error == "skip":
            raise TypeError("normalize_text with on_error='skip' has no length: samples may be "
                            "skipped")
        return len(self.source_datapipe)


TranscriptNormalizer = TranscriptNormalizerIterDataPipe


# --------------------------------------------------------------------------- tokenizers


def _nonspace_len(text: str) -> int:
    return len("".join(text.split()))


class BaseTokenizer:
    """What every tokenizer offers; see :class:`CharTokenizer`, :class:`WordTokenizer`,
    :class:`SentencePieceTokenizer`.

    ``encode(text) -> list[int]`` maps symbols it does not know to :attr:`unk_id`;
    ``decode(ids) -> str`` skips ``<blank>`` and ``<sos/eos>``; :meth:`unknown_symbols` lists
    what became ``<unk>`` (for reports). Tokenizers compare equal when their vocabularies (or
    models) are equal, and pickle.
    """

    kind: ClassVar[str] = ""

    @property
    def vocab_size(self) -> int:
        raise NotImplementedError

    @property
    def blank_id(self) -> int | None:
        raise NotImplementedError

    @property
    def unk_id(self) -> int:
        raise NotImplementedError

    @property
    def sos_eos_id(self) -> int | None:
        raise NotImplementedError

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: Iterable[int]) -> str:
        raise NotImplementedError

    def unknown_symbols(self, text: str) -> list[str]:
        """The pieces of ``text`` that ``encode`` maps to ``<unk>``, in order (a space as
        ``" "``)."""
        raise NotImplementedError

    def save(self, path: str | os.PathLike) -> None:
        raise NotImplementedError

    @classmethod
    def load(cls, path: str | os.PathLike) -> BaseTokenizer:
        """Load a tokenizer saved by :meth:`save`; it must be of this class."""
        tokenizer = load_tokenizer(path)
        if not isinstance(tokenizer, cls):
            raise DataError(f"holds a {tokenizer.kind} tokenizer, not a {cls.kind} one",
                            source=os.fspath(path))
        return tokenizer

    def _check_text(self, text: Any) -> str:
        if not isinstance(text, str):
            raise TypeError(f"{type(self).__name__}.encode expects a str, got "
                            f"{type(text).__name__}")
        return text


class _VocabTokenizer(BaseTokenizer):
    """A tokenizer defined by a vocabulary list: ``[<blank>, <unk>, symbols..., <sos/eos>]``."""

    def __init__(self, vocab: Sequence[str]) -> None:
        vocab = tuple(vocab)
        problem = self._vocab_problem(vocab)
        if problem is not None:
            raise ValueError(problem)
        self.vocab = vocab
        self._index = {symbol: i for i, symbol in enumerate(vocab)}

    def _vocab_problem(self, vocab: tuple) -> str | None:
        if len(vocab) < 3 or vocab[0] != BLANK or vocab[1] != UNK or vocab[-1] != SOS_EOS:
            return (f"vocab must start with {BLANK!r}, {UNK!r} and end with {SOS_EOS!r}, got "
                    f"{list(vocab[:2])}...{list(vocab[-1:])}")
        for i, symbol in enumerate(vocab[2:-1], start=2):
            if not isinstance(symbol, str):
                return f"vocab entry {i} is not a str: {symbol!r}"
            if symbol in _SPECIALS:
                return f"vocab entry {i} repeats the special symbol {symbol!r}"
            problem = self._symbol_problem(symbol)
            if problem is not None:
                return f"vocab entry {i} {symbol!r} {problem}"
        if len(set(vocab)) != len(vocab):
            duplicate = next(s for s, n in Counter(vocab).items() if n > 1)
            return f"vocab entry {duplicate!r} appears more than once"
        return None

    def _symbol_problem(self, symbol: str) -> str | None:
        raise NotImplementedError

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    @property
    def blank_id(self) -> int:
        return 0

    @property
    def unk_id(self) -> int:
        return 1

    @property
    def sos_eos_id(self) -> int:
        return len(self.vocab) - 1

    def _symbols(self, ids: Iterable[int]) -> Iterator[str]:
        size = len(self.vocab)
        for i in ids:
            try:
                index = int(i)
            except (TypeError, ValueError):
                raise TypeError(f"token ids must be ints, got {i!r}") from None
            if not 0 <= index < size or index != i:
                raise ValueError(f"token id {i!r} is outside the vocabulary [0, {size})")
            if index != 0 and index != size - 1:
                yield self.vocab[index]

    def _json(self) -> dict[str, Any]:
        return {"type": self.kind, "format_version": _FORMAT_VERSION, "vocab": list(self.vocab)}

    def save(self, path: str | os.PathLike) -> None:
        """Write the tokenizer as one JSON file (``{"type": ..., "vocab": [...], ...}``)."""
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self._json(), f, ensure_ascii=False, indent=1, sort_keys=True)
            f.write("\n")

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self._json() == other._json()

    __hash__ = None  # type: ignore[assignment]

    def __getstate__(self) -> dict[str, Any]:
        return self._json()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**{k: v for k, v in state.items() if k not in ("type", "format_version")})

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size})"


def _count_ranked(counts: Counter, min_count: int, max_size: int | None) -> list[str]:
    """Symbols with ``count >= min_count``, the ``max_size`` most frequent (ties by code
    point), sorted by code point."""
    kept = sorted((s for s, n in counts.items() if n >= min_count),
                  key=lambda s: (-counts[s], s))
    if max_size is not None:
        kept = kept[:max_size]
    return sorted(kept)


def _check_build_args(min_count: Any, max_size: Any) -> None:
    if not isinstance(min_count, int) or isinstance(min_count, bool) or min_count < 1:
        raise ValueError(f"min_count must be an int >= 1, got {min_count!r}")
    if max_size is not None and (not isinstance(max_size, int) or isinstance(max_size, bool)
                                 or max_size < 1):
        raise ValueError(f"max_size must be None or an int >= 1, got {max_size!r}")


def _texts(texts: Iterable[str]) -> Iterator[str]:
    if isinstance(texts, str):
        raise TypeError("texts must be an iterable of str, not one str")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"texts[{i}] is a {type(text).__name__}, expected str")
        yield text


class CharTokenizer(_VocabTokenizer):
    """One token per character (the usual unit for Chinese, and for small English models).

    Vocabulary: ``<blank>`` 0, ``<unk>`` 1, the characters sorted by code point, ``<sos/eos>``
    last -- WeNet's ``units.txt`` layout. Every whitespace character is a *space*: encoded as
    ``space_symbol`` (``"▁"``; decoded back to ``" "``), or dropped when ``space_symbol`` is
    None. A literal ``space_symbol`` in a text is read as a space. A space is in the vocabulary
    only if the training texts had spaces: otherwise it encodes to ``<unk>`` (the CJK-space
    problem, see the module docs). ``decode`` renders ``<unk>`` as ``"<unk>"``.

    Args:
        vocab: the full list ``[<blank>, <unk>, chars..., <sos/eos>]``; use :meth:`build`.
        space_symbol: one non-space character standing for a space, or None to drop spaces.

    >>> tok = CharTokenizer.build(["ab c", "ca"])
    >>> tok.vocab
    ('<blank>', '<unk>', 'a', 'b', 'c', '▁', '<sos/eos>')
    >>> tok.encode("ca b"), tok.decode(tok.encode("ca b")), tok.encode("x")
    ([4, 2, 5, 3], 'ca b', [1])
    """

    kind = "char"

    def __init__(self, vocab: Sequence[str], space_symbol: str | None = "▁") -> None:
        if space_symbol is not None and (not isinstance(space_symbol, str)
                                         or len(space_symbol) != 1 or space_symbol.isspace()):
            raise ValueError(f"space_symbol must be one non-space character or None, got "
                             f"{space_symbol!r}")
        self.space_symbol = space_symbol
        super().__init__(vocab)

    def _symbol_problem(self, symbol: str) -> str | None:
        if len(symbol) != 1:
            return "is not one character"
        if symbol.isspace():
            return "is a space (spaces are written as space_symbol)"
        return None

    @classmethod
    def build(
        cls,
        texts: Iterable[str],
        *,
        space_symbol: str | None = "▁",
        min_count: int = 1,
        max_size: int | None = None,
    ) -> CharTokenizer:
        """Collect the characters of ``texts``.

        Args:
            texts: transcripts, normalized as they will be when tokenized.
            space_symbol: as in the constructor.
            min_count: characters seen fewer times become ``<unk>``.
            max_size: keep at most this many characters (the most frequent; specials not
                counted).
        """
        _check_build_args(min_count, max_size)
        counts: Counter[str] = Counter()
        for text in _texts(texts):
            counts.update(text)
        spaces = sum(n for c, n in counts.items() if c.isspace())
        counts = Counter({c: n for c, n in counts.items() if not c.isspace()})
        if space_symbol is not None and spaces:
            counts[space_symbol] += spaces
        symbols = _count_ranked(counts, min_count, max_size)
        return cls([BLANK, UNK, *symbols, SOS_EOS], space_symbol=space_symbol)

    def _pieces(self, text: str) -> Iterator[str]:
        space = self.space_symbol
        for char in text:
            if char.isspace() or char == space:
                if space is not None:
                    yield space
            else:
                yield char

    def encode(self, text: str) -> list[int]:
        get = self._index.get
        return [get(c, 1) for c in self._pieces(self._check_text(text))]

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(" " if s == self.space_symbol else s for s in self._symbols(ids))

    def unknown_symbols(self, text: str) -> list[str]:
        index = self._index
        return [" " if c == self.space_symbol else c
                for c in self._pieces(self._check_text(text)) if c not in index]

    def _json(self) -> dict[str, Any]:
        return {**super()._json(), "space_symbol": self.space_symbol}


class WordTokenizer(_VocabTokenizer):
    """One token per whitespace-separated word.

    Vocabulary: ``<blank>`` 0, ``<unk>`` 1, the kept words sorted by code point, ``<sos/eos>``
    last. A word equal to a special symbol encodes to ``<unk>``. ``decode`` joins words with
    one space and renders ``<unk>`` as ``"<unk>"``.

    Args:
        vocab: the full list ``[<blank>, <unk>, words..., <sos/eos>]``; use :meth:`build`.

    >>> tok = WordTokenizer.build(["the cat", "the dog", "a cat"], min_count=2)
    >>> tok.vocab
    ('<blank>', '<unk>', 'cat', 'the', '<sos/eos>')
    >>> tok.encode("the  cat sat"), tok.decode([3, 2])
    ([3, 2, 1], 'the cat')
    """

    kind = "word"

    def _symbol_problem(self, symbol: str) -> str | None:
        if not symbol or any(c.isspace() for c in symbol):
            return "is not a word (empty or containing a space)"
        return None

    @classmethod
    def build(
        cls, texts: Iterable[str], *, min_count: int = 1, max_size: int | None = None
    ) -> WordTokenizer:
        """Collect the words of ``texts``.

        Args:
            texts: transcripts, normalized as they will be when tokenized.
            min_count: words seen fewer times become ``<unk>``.
            max_size: keep at most this many words (the most frequent, ties by code point;
                specials not counted).
        """
        _check_build_args(min_count, max_size)
        counts: Counter[str] = Counter()
        for text in _texts(texts):
            counts.update(text.split())
        for special in _SPECIALS:
            counts.pop(special, None)
        return cls([BLANK, UNK, *_count_ranked(counts, min_count, max_size), SOS_EOS])

    def _word_id(self, word: str) -> int:
        index = self._index.get(word, 1)
        return 1 if index == 0 or index == len(self.vocab) - 1 else index

    def encode(self, text: str) -> list[int]:
        return [self._word_id(w) for w in self._check_text(text).split()]

    def decode(self, ids: Iterable[int]) -> str:
        return " ".join(self._symbols(ids))

    def unknown_symbols(self, text: str) -> list[str]:
        return [w for w in self._check_text(text).split() if self._word_id(w) == 1]


# Trainer options that SentencePieceTokenizer.build sets itself.
_SP_RESERVED = frozenset("""
input model_prefix sentence_iterator model_writer vocab_size model_type character_coverage
pad_id pad_piece unk_id unk_piece bos_id bos_piece eos_id eos_piece hard_vocab_limit
""".split())
_SP_MODEL_TYPES = ("unigram", "bpe", "char")


class SentencePieceTokenizer(BaseTokenizer):
    """A sentencepiece model, kept as its serialized bytes so that it pickles.

    The processor is created lazily from ``model_proto`` (after unpickling, in each DataLoader
    worker). Ids are the model's own; models made by :meth:`build` follow the ESPnet/WeNet
    convention (``<blank>`` 0, ``<unk>`` 1, ``<sos/eos>`` last); a model trained elsewhere
    keeps its ids, and :attr:`blank_id` / :attr:`sos_eos_id` are None when it has no such
    piece. ``decode`` is sentencepiece's (``<unk>`` as ``" ⁇ "``).

    Args:
        model_proto: the bytes of a ``.model`` file.

    Raises:
        ValueError: the bytes are not a sentencepiece model.

    >>> tok = SentencePieceTokenizer.build(["我爱北京", "北京很好"], model_type="char",
    ...                                    add_dummy_prefix=False)
    >>> tok.vocab_size, tok.encode("我爱"), tok.decode(tok.encode("北京"))
    (9, [6, 7], '北京')
    >>> tok.encode("我 爱"), tok.unknown_symbols("我 爱")
    ([6, 1, 7], [' '])
    """

    kind = "sentencepiece"

    def __init__(self, model_proto: bytes) -> None:
        if not isinstance(model_proto, (bytes, bytearray)):
            raise TypeError(f"model_proto must be bytes, got {type(model_proto).__name__}")
        self.model_proto = bytes(model_proto)
        self._sp = _sp_processor(self.model_proto)

    @property
    def _processor(self) -> Any:
        if self._sp is None:
            self._sp = _sp_processor(self.model_proto)
        return self._sp

    def __getstate__(self) -> dict[str, Any]:
        return {"model_proto": self.model_proto}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.model_proto = state["model_proto"]
        self._sp = None  # loaded on first use, in the process that uses it

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.model_proto == other.model_proto

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"SentencePieceTokenizer(vocab_size={self.vocab_size})"

    @classmethod
    def build(
        cls,
        texts: Iterable[str],
        vocab_size: int | None = None,
        *,
        model_type: str = "unigram",
        character_coverage: float = 0.9995,
        **options: Any,
    ) -> SentencePieceTokenizer:
        """Train a model in memory (no file written) on ``texts``.

        Training is deterministic: the same texts and options give the same model bytes.

        Args:
            texts: transcripts, normalized as they will be when tokenized. For Chinese,
                remove the spaces (``remove_spaces="cjk"``) here and when tokenizing.
            vocab_size: number of pieces including ``<blank>``, ``<unk>``, ``<sos/eos>``;
                required for ``"unigram"`` and ``"bpe"``. For ``"char"``, None keeps every
                character (within ``character_coverage``).
            model_type: ``"unigram"``, ``"bpe"`` or ``"char"``.
            character_coverage: fraction of characters covered; rarer ones become ``<unk>``.
                sentencepiece's default, 0.9995, suits Chinese and Japanese; use 1.0 for
                small alphabets.
            **options: other ``sentencepiece.SentencePieceTrainer`` options, e.g.
                ``add_dummy_prefix=False`` (no ``"▁"`` before each text: what CJK character
                models want), ``user_defined_symbols=[...]``, ``num_threads``.
                ``minloglevel`` defaults to 2 (quiet). Note that sentencepiece ignores
                training sentences longer than ``max_sentence_length`` bytes (4192).

        Raises:
            ValueError: a bad argument, or training failed (vocab_size too large or too small
                for the texts, no non-empty text), with sentencepiece's reason.
        """
        import sentencepiece

        if model_type not in _SP_MODEL_TYPES:
            raise ValueError(f"model_type must be one of {_SP_MODEL_TYPES}, got {model_type!r}")
        if vocab_size is None and model_type != "char":
            raise ValueError(f"vocab_size is required for model_type={model_type!r}")
        if vocab_size is not None and (not isinstance(vocab_size, int)
                                       or isinstance(vocab_size, bool) or vocab_size < 4):
            raise ValueError(f"vocab_size must be an int >= 4, got {vocab_size!r}")
        if not isinstance(character_coverage, (int, float)) or not (
                0 < character_coverage <= 1):
            raise ValueError(f"character_coverage must be in (0, 1], got {character_coverage!r}")
        reserved = sorted(_SP_RESERVED & set(options))
        if reserved:
            raise ValueError(f"options {reserved} are set by SentencePieceTokenizer.build")
        texts = list(_texts(texts))
        base = {"model_type": model_type, "character_coverage": float(character_coverage),
                "pad_id": 0, "pad_piece": BLANK, "unk_id": 1, "unk_piece": UNK, "bos_id": -1,
                "minloglevel": 2, **options}

        def train(**spec: Any) -> bytes:
            buffer = io.BytesIO()
            sentencepiece.SentencePieceTrainer.train(
                sentence_iterator=iter(texts), model_writer=buffer, **base, **spec
            )
            return buffer.getvalue()

        try:
            if vocab_size is None:
                # Count the pieces of a char model, then train it with <sos/eos> last.
                probe = train(vocab_size=1 << 20, hard_vocab_limit=False, eos_id=-1)
                vocab_size = _sp_processor(probe).get_piece_size() + 1
            return cls(train(vocab_size=vocab_size, eos_id=vocab_size - 1,
                             eos_piece=SOS_EOS))
        except RuntimeError as exc:
            raise ValueError(_sp_training_problem(exc, train, vocab_size)) from exc

    def save(self, path: str | os.PathLike) -> None:
        """Write the ``.model`` file (the same bytes sentencepiece writes)."""
        with open(path, "wb") as f:
            f.write(self.model_proto)

    @property
    def vocab_size(self) -> int:
        return self._processor.get_piece_size()

    def _id_or_none(self, value: int) -> int | None:
        return None if value < 0 else value

    @property
    def blank_id(self) -> int | None:
        return self._id_or_none(self._processor.pad_id())

    @property
    def unk_id(self) -> int:
        return self._processor.unk_id()

    @property
    def sos_eos_id(self) -> int | None:
        return self._id_or_none(self._processor.eos_id())

    def id_to_piece(self, index: int) -> str:
        """The piece of an id (``"▁the"``, ``"<unk>"``)."""
        return self._processor.id_to_piece(int(index))

    def encode(self, text: str) -> list[int]:
        return self._processor.encode(self._check_text(text))

    def decode(self, ids: Iterable[int]) -> str:
        ids = [int(i) for i in ids]
        size = self.vocab_size
        for i in ids:
            if not 0 <= i < size:
                raise ValueError(f"token id {i} is outside the vocabulary [0, {size})")
        return self._processor.decode(ids)

    def unknown_symbols(self, text: str) -> list[str]:
        sp = self._processor
        ids = sp.encode(self._check_text(text))
        unk = sp.unk_id()
        if unk not in ids:
            return []
        # For an unknown piece, sentencepiece returns its surface instead of "<unk>".
        pieces = sp.encode(text, out_type=str)
        return [p.replace("\u2581", " ") for p, i in zip(pieces, ids) if i == unk]


def _sp_processor(model_proto: bytes) -> Any:
    import sentencepiece

    if not model_proto:
        raise ValueError("not a sentencepiece model (no bytes)")
    try:
        processor = sentencepiece.SentencePieceProcessor(model_proto=model_proto)
    except RuntimeError as exc:
        raise ValueError(f"not a sentencepiece model ({str(exc).strip()})") from None
    if processor.get_piece_size() <= 0:
        raise ValueError("not a sentencepiece model (no pieces)")
    return processor


def _sp_training_problem(exc: RuntimeError, train: Callable[..., bytes],
                         vocab_size: int | None) -> str:
    """sentencepiece's reason for a failed training, said plainly."""
    message = str(exc).strip()
    if "pieces_size() - 1) == (it->first)" in message:
        # <sos/eos> at vocab_size - 1 but fewer pieces than that: ask again without it to get
        # sentencepiece's own "Vocabulary size too high" message.
        try:
            train(vocab_size=vocab_size - 1, eos_id=-1)
        except RuntimeError as again:
            message = str(again).strip()
        found = re.search(r"value <= (\d+)", message)
        if found:
            return (f"vocab_size {vocab_size} is too large for these texts: at most "
                    f"{int(found.group(1)) + 1} pieces can be made")
        return f"vocab_size {vocab_size} is too large for these texts ({message})"
    if "!sentences_.empty()" in message:
        return "no non-empty text to train sentencepiece on"
    reason = message.split("] ", 1)[-1] if "] " in message else message
    return f"sentencepiece training failed: {reason}"


def load_tokenizer(path: str | os.PathLike) -> BaseTokenizer:
    """Load a tokenizer file of any kind: JSON (char, word) or a sentencepiece ``.model``.

    Raises:
        MissingDataError: the file does not exist.
        DataError: the file is not a tokenizer (not JSON and not a sentencepiece model, or
            JSON of an unknown type or with a bad vocabulary); the message names the file.

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "chars.json")
    >>> CharTokenizer.build(["ab"]).save(path)
    >>> load_tokenizer(path)
    CharTokenizer(vocab_size=5)
    """
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError as exc:
        raise MissingDataError("tokenizer file not found", source=path) from exc
    except OSError as exc:
        raise DataError(f"cannot read tokenizer file: {exc.strerror or exc}", source=path) \
            from exc
    if not data.strip():
        raise DataError("empty tokenizer file", source=path)
    if data.lstrip(b"\xef\xbb\xbf \t\r\n")[:1] in (b"{", b"["):
        return _tokenizer_from_json(data, path)
    try:
        return SentencePieceTokenizer(data)
    except ValueError as exc:
        raise DataError(f"not a tokenizer file: neither JSON (char, word) nor a sentencepiece "
                        f"model: {exc}", source=path) from None


def _tokenizer_from_json(data: bytes, path: str) -> BaseTokenizer:
    try:
        obj = json.loads(data.decode("utf-8-sig"))
    except UnicodeDecodeError as exc:
        raise DataError(f"tokenizer file is not valid UTF-8 ({exc.reason} at byte "
                        f"{exc.start})", source=path) from None
    except json.JSONDecodeError as exc:
        raise DataError(f"invalid JSON: {exc.msg} (column {exc.colno})", source=path,
                        line=exc.lineno) from None
    if not isinstance(obj, dict):
        raise DataError("expected a JSON object", source=path)
    kinds = {"char": CharTokenizer, "word": WordTokenizer}
    kind = obj.get("type")
    if kind not in kinds:
        raise DataError(f"unknown tokenizer type {kind!r} (expected one of {sorted(kinds)})",
                        source=path)
    version = obj.get("format_version", _FORMAT_VERSION)
    if version != _FORMAT_VERSION:
        raise DataError(f"format_version {version!r} is not supported (this speechpipe reads "
                        f"{_FORMAT_VERSION})", source=path)
    vocab = obj.get("vocab")
    if not isinstance(vocab, list):
        raise DataError(f"'vocab' must be a list, got {type(vocab).__name__}", source=path)
    allowed = {"type", "format_version", "vocab"} | ({"space_symbol"} if kind == "char" else set())
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise DataError(f"unknown fields {unknown} for a {kind} tokenizer", source=path)
    arguments = {k: v for k, v in obj.items() if k in ("vocab", "space_symbol")}
    try:
        return kinds[kind](**arguments)
    except (TypeError, ValueError) as exc:
        raise DataError(str(exc), source=path) from None


def build_tokenizer(kind: str, texts: Iterable[str], **options: Any) -> BaseTokenizer:
    """Build a tokenizer of ``kind`` (``"char"``, ``"word"``, ``"sentencepiece"``) from texts;
    ``options`` go to that class's ``build``.

    >>> build_tokenizer("word", ["a b", "b"]).vocab
    ('<blank>', '<unk>', 'a', 'b', '<sos/eos>')
    """
    kinds = {"char": CharTokenizer, "word": WordTokenizer,
             "sentencepiece": SentencePieceTokenizer}
    if kind not in kinds:
        raise ValueError(f"kind must be one of {sorted(kinds)}, got {kind!r}")
    return kinds[kind].build(texts, **options)


# --------------------------------------------------------------------------- tokenize


class UnknownTokenWarning(UserWarning):
    """Warned at the end of a ``tokenize`` pass whose share of ``<unk>`` tokens was too high."""


class TokenStats:
    """Counts of tokens and ``<unk>`` tokens, with the unknown symbols, for a report.

    ``tokenize`` keeps one per pass (per process: each DataLoader worker counts its own share);
    ``speechpipe tokenizer build`` uses one for its coverage summary.

    >>> stats = TokenStats("tokenize")
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
        self.chars += _nonspace_len(text)
        unk = tokenizer.unk_id
        n_unk = sum(1 for i in ids if i == unk)
        if n_unk:
            self.unk_tokens += n_unk
            self.samples_with_unk += 1
            if len(self.examples) < self.max_examples:
                self.examples.append(str(key))
            symbols = tokenizer.unknown_symbols(text)
            self.unknown.update(symbols)
            self.unknown_chars += sum(_nonspace_len(s) for s in symbols)

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
            :class:`SentencePieceTokenizer` (see :func:`load_tokenizer`).
        field: the field to encode.
        out: the field to write the ids to.
        normalizer: a :class:`TextNormalizer` applied to the text before encoding (only to
            what is encoded; use ``normalize_text`` to change the stored text).
        max_unk_rate: at the end of a pass whose ``<unk>`` share of tokens is above this,
            warn (:class:`UnknownTokenWarning`) with the report; None never warns.
        on_error: ``"raise"`` a :class:`~speechpipe.errors.DataError` naming the sample's
            key when ``field`` is absent or not a ``str``, or ``"skip"`` the sample and
            count it in ``self.diagnostics``.

    >>> from speechpipe.pipes._base import IterableWrapper
    >>> tok = CharTokenizer.build(["我爱北京"])
    >>> pipe = IterableWrapper([{"key": "u1", "text": "我 爱"}]).tokenize(
    ...     tok, normalizer=TextNormalizer(remove_spaces="cjk"))
    >>> [s["tokens"].tolist() for s in pipe], pipe.stats.unk_tokens
    ([[4, 5]], 0)
    """

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
        if not all(hasattr(tokenizer, a) for a in ("encode", "unk_id", "unknown_symbols")):
            raise TypeError(f"tokenizer must be a speechpipe tokenizer (load one with "
                            f"load_tokenizer(path)), got {tokenizer!r}")
        if max_unk_rate is not None and (isinstance(max_unk_rate, bool) or not isinstance(
                max_unk_rate, (int, float)) or not 0 <= max_unk_rate <= 1):
            raise ValueError(f"max_unk_rate must be None or in [0, 1], got {max_unk_rate!r}")
        self.source_datapipe = source_datapipe
        self.tokenizer = tokenizer
        self.field = _check_field(field, "field")
        self.out = _check_field(out, "out")
        self.normalizer = _check_normalizer(normalizer)
        self.max_unk_rate = max_unk_rate
        self.on_error = check_on_error(on_error)
        self.diagnostics = Diagnostics("tokenize")
        self.stats = TokenStats("tokenize")

    def __iter__(self) -> Iterator[Sample]:
        self.diagnostics.reset()
        self.stats.reset()
        tokenizer, normalizer, stats = self.tokenizer, self.normalizer, self.stats
        for sample in self.source_datapipe:
            try:
                text = _sample_field(sample, self.field, "tokenize")
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


# --------------------------------------------------------------------------- CLI

_MANIFEST_EXTENSIONS = (".jsonl", ".json", ".ndjson", ".tsv")


def read_transcripts(
    paths: str | os.PathLike | Iterable[str | os.PathLike], *, field: str = TEXT
) -> Iterator[tuple[str, str]]:
    """``(key, transcript)`` pairs from Kaldi ``text`` files and manifests, in file order.

    A path ending in ``.jsonl``, ``.json``, ``.ndjson`` or ``.tsv`` (optionally ``.gz``) is
    read as a manifest (:func:`~speechpipe.pipes.manifests.read_manifest`) and its ``field``
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
    from .kaldi_tables import parse_scp_lines
    from .manifests import read_manifest

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


def add_tokenizer_command(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``tokenizer build`` to the ``speechpipe`` command's subparsers; returns the
    ``tokenizer`` parser. The handler returns the exit code (0, or 2 on bad input)."""
    tokenizer = subparsers.add_parser(
        "tokenizer",
        help="build a tokenizer (char, word, sentencepiece) from transcripts",
        description="Tokenizers for speechpipe's tokenize stage.",
    )
    actions = tokenizer.add_subparsers(dest="tokenizer_command", required=True,
                                       metavar="ACTION")
    build = actions.add_parser(
        "build",
        help="build a tokenizer from Kaldi text files or manifests",
        description="Build a tokenizer from transcripts -- Kaldi 'text' files ('<key> "
        "<transcript>' lines) or manifests (.jsonl/.tsv, optionally .gz) -- normalized as "
        "given, save it to --out (JSON for char/word, a .model for sentencepiece) and print "
        "its vocabulary size, its coverage of the characters and its <unk> rate on the "
        "training text. Use the same normalization when tokenizing. For Chinese, pass "
        "--remove-spaces cjk: a space in a label otherwise becomes <unk>.",
    )
    build.add_argument("--type", dest="kind", required=True,
                       choices=("char", "word", "sentencepiece"), help="tokenizer type")
    build.add_argument("--text", action="append", required=True, metavar="FILE",
                       help="Kaldi text file or manifest; repeat for several")
    build.add_argument("--field", default=TEXT,
                       help="manifest field holding the transcript (default: text)")
    build.add_argument("--out", required=True, metavar="PATH", help="file to write")
    build.add_argument("--vocab-size", type=int, default=None, metavar="N",
                       help="sentencepiece: number of pieces (required unless --model-type "
                       "char); char/word: keep at most the N-3 most frequent symbols")
    build.add_argument("--model-type", default="unigram", choices=_SP_MODEL_TYPES,
                       help="sentencepiece model type (default: unigram)")
    build.add_argument("--character-coverage", type=float, default=0.9995, metavar="F",
                       help="sentencepiece: share of characters covered (default 0.9995)")
    build.add_argument("--no-dummy-prefix", action="store_true",
                       help="sentencepiece: no '▁' before each text (CJK character models)")
    build.add_argument("--min-count", type=int, default=1, metavar="N",
                       help="char/word: symbols seen fewer times become <unk> (default 1)")
    build.add_argument("--space-symbol", default="▁",
                       help="char: symbol for a space; 'none' drops spaces (default: ▁)")
    build.add_argument("--case", default="keep", choices=CASES, help="case mapping")
    build.add_argument("--remove-spaces", default="none", choices=REMOVE_SPACES,
                       help="remove spaces: none, all, or next to CJK characters")
    build.add_argument("--remove-punctuation", action="store_true",
                       help="replace punctuation by spaces (apostrophes in words kept)")
    build.add_argument("--unicode-form", default="NFKC", choices=(*UNICODE_FORMS, "none"),
                       help="Unicode normalization (default NFKC)")
    build.set_defaults(func=_tokenizer_build)
    return tokenizer


def _tokenizer_build(args: argparse.Namespace) -> int:
    try:
        normalizer = TextNormalizer(
            case=args.case,
            unicode_form=None if args.unicode_form == "none" else args.unicode_form,
            remove_punctuation=args.remove_punctuation,
            remove_spaces=args.remove_spaces,
        )
        pairs = [(key, normalizer(text)) for key, text in read_transcripts(args.text,
                                                                           field=args.field)]
        texts = [text for _, text in pairs]
        size = args.vocab_size
        if args.kind == "sentencepiece":
            options: dict[str, Any] = {"model_type": args.model_type,
                                       "character_coverage": args.character_coverage}
            if args.no_dummy_prefix:
                options["add_dummy_prefix"] = False
            tokenizer = SentencePieceTokenizer.build(texts, size, **options)
        else:
            if size is not None and size < 4:
                raise ValueError(f"--vocab-size must be >= 4, got {size}")
            options = {"min_count": args.min_count,
                       "max_size": None if size is None else size - 3}
            if args.kind == "char":
                options["space_symbol"] = (None if args.space_symbol.lower() == "none"
                                           else args.space_symbol)
                tokenizer = CharTokenizer.build(texts, **options)
            else:
                tokenizer = WordTokenizer.build(texts, **options)
        tokenizer.save(args.out)
    except (ValueError, OSError) as exc:  # DataError and MissingDataError included
        print(f"speechpipe tokenizer build: error: {exc}", file=sys.stderr)
        return 2
    stats = TokenStats("training text")
    for key, text in pairs:
        stats.add(key, text, tokenizer.encode(text), tokenizer)
    print(f"built a {args.kind} tokenizer from {len(texts)} transcript(s) in "
          f"{len(args.text)} file(s): {args.out}")
    print(f"vocab size: {tokenizer.vocab_size} (<blank>={tokenizer.blank_id}, "
          f"<unk>={tokenizer.unk_id}, <sos/eos>={tokenizer.sos_eos_id})")
    print(f"coverage: {100 * stats.coverage:.2f}% of characters known; <unk> rate: "
          f"{100 * stats.unk_rate:.2f}% of {stats.tokens} token(s) on the training text")
    if stats.unk_tokens:
        print(stats.report())
    print(f"normalizer: {normalizer!r} -- tokenize with the same "
          f"(tokenize(tokenizer, normalizer=...))")
    return 0
