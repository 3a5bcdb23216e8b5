"""Text normalisation: :class:`TextNormalizer`, a frozen, picklable set of rules (Unicode
form, replacements, case, dropped tags, punctuation, spaces -- all of them, or only those next
to CJK characters, :func:`is_cjk`), and ``normalize_text``
(:class:`TranscriptNormalizerIterDataPipe`), which applies one to a field of each sample.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping

from ...diagnostics import Diagnostics, check_on_error
from ...errors import DataError
from ...sample import KEY, SOURCE, TEXT, Sample
from .._core import functional_datapipe, IterDataPipe

__all__ = [
    "CASES",
    "REMOVE_SPACES",
    "TextNormalizer",
    "TranscriptNormalizer",
    "TranscriptNormalizerIterDataPipe",
    "UNICODE_FORMS",
    "is_cjk",
]

#: Values of ``TextNormalizer(case=...)``.
CASES = ("keep", "upper", "lower")
#: Values of ``TextNormalizer(remove_spaces=...)``.
REMOVE_SPACES = ("none", "all", "cjk")
#: Unicode normalization forms accepted by ``TextNormalizer(unicode_form=...)`` (or None).
UNICODE_FORMS = ("NFKC", "NFC", "NFKD", "NFD")

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


def sample_field(sample: Any, field_name: str, stage: str) -> str:
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


def check_field(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise TypeError(f"{name} must be a non-empty str, got {value!r}")
    return value


def check_normalizer(normalizer: Any) -> Callable[[str], str] | None:
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

    >>> from speechpipe import IterableWrapper
    >>> samples = IterableWrapper([{"key": "u1", "text": "我 爱 NLP ，和 speech"}])
    >>> [s["text"] for s in samples.normalize_text(remove_spaces="cjk", remove_punctuation=True)]
    ['我爱NLP和speech']
    """

    holds_nothing = True  # item by item: nothing kept between two yields

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
        self.normalizer = (check_normalizer(normalizer) if normalizer is not None
                           else TextNormalizer(**options))
        self.field = check_field(field, "field")
        self.on_error = check_on_error(on_error)
        self.diagnostics = Diagnostics("normalize_text")

    def __iter__(self) -> Iterator[Sample]:
        self.diagnostics.reset()
        for sample in self.source_datapipe:
            try:
                text = sample_field(sample, self.field, "normalize_text")
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
