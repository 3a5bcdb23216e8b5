"""Tokenizers: :class:`CharTokenizer`, :class:`WordTokenizer` and
:class:`SentencePieceTokenizer` behind one small interface (:class:`BaseTokenizer`), built
from text (:func:`build_tokenizer`), saved and read back (:func:`load_tokenizer`).

Built tokenizers follow the ESPnet/WeNet id convention: ``<blank>`` is 0 (the CTC blank),
``<unk>`` is 1, ``<sos/eos>`` is the last id, ``vocab_size - 1``. Char and word tokenizers are
saved as one JSON file, sentencepiece ones as their ``.model`` file; :func:`load_tokenizer`
tells them apart by content. The ``tokenize`` stage that applies them is in
:mod:`speechpipe.pipes.text._tokenize`.
"""

from __future__ import annotations

import io
import json
import os
import re
from collections import Counter
from typing import Any, Callable, ClassVar, Iterable, Iterator, Sequence

from ...errors import DataError, MissingDataError

__all__ = [
    "BLANK",
    "BaseTokenizer",
    "CharTokenizer",
    "SOS_EOS",
    "SentencePieceTokenizer",
    "UNK",
    "WordTokenizer",
    "build_tokenizer",
    "load_tokenizer",
]

#: Special symbols of built tokenizers: id 0, id 1, and the last id.
BLANK = "<blank>"
UNK = "<unk>"
SOS_EOS = "<sos/eos>"
_SPECIALS = (BLANK, UNK, SOS_EOS)

_FORMAT_VERSION = 1


def nonspace_len(text: str) -> int:
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
SP_MODEL_TYPES = ("unigram", "bpe", "char")


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

        if model_type not in SP_MODEL_TYPES:
            raise ValueError(f"model_type must be one of {SP_MODEL_TYPES}, got {model_type!r}")
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
    """Load a tokenizer file of any kind: JSON (char, word), a sentencepiece ``.model``, or a
    vocabulary in text, one token per line from ``<blank>`` to ``<sos/eos>`` -- WeNet's
    ``units.txt`` (``token id`` per line, ids 0, 1, 2... in order) or ESPnet's
    ``token_list`` (``tokens.txt``; ``<space>`` is the space). Single characters load as a
    :class:`CharTokenizer`, words as a :class:`WordTokenizer`, with the file's ids; BPE pieces
    (``▁THE``) need their sentencepiece model (WeNet's ``bpe.model``), which is named.

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
    if data.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(BLANK.encode()):
        return _tokenizer_from_vocab(data, path)
    try:
        return SentencePieceTokenizer(data)
    except ValueError as exc:
        raise DataError(f"not a tokenizer file: neither JSON (char, word) nor a sentencepiece "
                        f"model: {exc}", source=path) from None


#: How ESPnet's character token lists write the space.
_ESPNET_SPACE = "<space>"


def _tokenizer_from_vocab(data: bytes, path: str) -> BaseTokenizer:
    """A WeNet ``units.txt`` (``token id``) or ESPnet ``token_list`` (``token``) as a char or
    word tokenizer with the file's ids."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataError(f"vocabulary file is not valid UTF-8 ({exc.reason} at byte "
                        f"{exc.start})", source=path) from None
    vocab: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) > 2 or (len(fields) == 2 and fields[1] != str(len(vocab))):
            raise DataError(f"expected 'token' or 'token id' with ids 0, 1, 2... in order "
                            f"(id {len(vocab)} here), got {line!r}", source=path, line=number)
        vocab.append(fields[0])
    pieces = vocab[2:-1]
    space = "▁"
    if _ESPNET_SPACE in pieces and space not in pieces:  # ESPnet's char lists
        vocab = [space if s == _ESPNET_SPACE else s for s in vocab]
        pieces = vocab[2:-1]
    chars = all(len(s) == 1 for s in pieces)
    if not chars and any(len(s) > 1 and s.startswith(space) for s in pieces):
        raise DataError("this vocabulary holds BPE pieces (such as "
                        f"{next(s for s in pieces if len(s) > 1 and s.startswith(space))!r}): "
                        "load the sentencepiece model they come from (WeNet: bpe.model, "
                        "ESPnet: bpe.model in the token_list's folder) instead", source=path)
    try:
        return CharTokenizer(vocab, space_symbol=space) if chars else WordTokenizer(vocab)
    except ValueError as exc:
        raise DataError(f"not a vocabulary speechpipe can use: {exc}", source=path) from None


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

