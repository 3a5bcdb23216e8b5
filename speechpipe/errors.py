"""Errors raised by speechpipe.

Every error about bad input says *where*: the file or URL, and the line number, the tar
member or the utterance key, so that a user can open the file and look. The message reads
like a compiler's: ``data/wav.scp:17: expected '<key> <value>', got 'utt1'``.

- :class:`DataError` (a ``ValueError``): the input exists but is malformed or inconsistent
  (a bad scp line, a corrupt or truncated shard, keys that do not match, an undecodable file).
- :class:`MissingDataError` (a ``FileNotFoundError``): a file, URL or pattern match is absent.
- :class:`UnsafeInputError` (a ``DataError``): the input asks for something speechpipe never
  does unasked (unpickling shard contents, running a shell command without opt-in).
- :class:`AudioFormatError` (a ``DataError``): bytes soundfile cannot decode (an AAC/M4A file,
  a corrupt or foreign payload); the message names the file or key and the format found.
- :class:`ChannelMismatchError` (a ``DataError``): samples with different channel counts in
  one batch (mono beside stereo) without a ``downmix`` or ``select_channel`` stage before.
- :class:`UnsupportedCodecError` (a ``ValueError``): an encoding soundfile cannot write, such as
  Opus at a rate other than 8, 12, 16, 24 or 48 kHz.
- :class:`OutputError` (an ``OSError``): speechpipe could not write its output (a full or
  read-only disk); the message names the file being written and the system's reason.
- :class:`SampleRateError` (a ``DataError``): audio at a sample rate a stage was not told
  about (features set up for 16 kHz given 8 kHz audio, a batch mixing rates); resample first.
- :class:`ResumeError` (a ``ValueError``): a loader state that does not belong to the loader
  asked to resume it (another pipeline, budget, seed, shard list, number of workers or world
  size), or that could not have been saved (a position past its shard's end); the message
  lists each difference, saved -> current.
- :class:`FolderLockedError` (a ``RuntimeError``): a pack folder (or one task of it) is being
  written by another run; the message names the lock file and its holder (pid, host).
"""

from __future__ import annotations

import json
import numbers
import re
from typing import Any

__all__ = ["AudioFormatError", "ChannelMismatchError", "DataError", "FolderLockedError",
           "MissingDataError", "OutputError", "ResumeError", "SampleRateError", "SpeechpipeError",
           "UnsafeInputError", "UnsupportedCodecError", "check_int", "locate", "mark_location",
           "redact"]


def check_int(name: str, value: Any, minimum: int | None = None, *,
              optional: bool = False) -> int | None:
    """``value`` as an int, checked: the one validator of integer arguments.

    A ``TypeError`` names ``name`` and the value if it is not an int (a bool is not one); a
    ``ValueError`` if it is below ``minimum``; ``None`` passes when ``optional``.

    >>> check_int("num_workers", 2, 0)
    2
    >>> check_int("buffer_size", 0, 1)
    Traceback (most recent call last):
    ValueError: buffer_size must be an int >= 1, got 0
    """
    if value is None and optional:
        return None
    extra = " or None" if optional else ""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int{extra}, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}{extra}, got {value!r}")
    return int(value)

# Query parameters of signed URLs (S3/GCS presigned, CloudFront, Azure SAS, tokens): their
# values are credentials, or change each time a URL is signed again.
_SIGNED_PARAMS = (
    "x-amz-credential", "x-amz-signature", "x-amz-security-token", "x-amz-date",
    "x-amz-expires", "x-goog-credential", "x-goog-signature", "x-goog-date", "x-goog-expires",
    "awsaccesskeyid", "signature", "sig", "se", "st", "skoid", "sktid", "token",
    "access_token", "auth", "expires", "policy", "key-pair-id", "password", "secret",
)
_USERINFO = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://)([^/?#\s@'\"]+)@")
_PARAM = re.compile(r"([?&;])(" + "|".join(re.escape(p) for p in _SIGNED_PARAMS)
                    + r")=([^&;#\s'\"]*)", re.IGNORECASE)


def redact(text: str) -> str:
    """``text`` with the credentials of every URL in it hidden: a password in the userinfo
    (``user:***@``; a userinfo without ``:``, often a token, as ``***@``) and the values of
    signing parameters (``X-Amz-Credential``, ``X-Amz-Signature``, ``X-Amz-Security-Token``,
    ``X-Amz-Date``, ``Signature``, ``sig``, ``token``, ``Expires``...). Two signings of one
    object's URL redact to the same text, which is how a checkpoint names it.

    >>> redact("https://alice:hunter2@host/a.tar")
    'https://alice:***@host/a.tar'
    >>> redact("cannot read s3://b/a.tar?X-Amz-Signature=abc&versionId=3&X-Amz-Date=2026")
    'cannot read s3://b/a.tar?X-Amz-Signature=***&versionId=3&X-Amz-Date=***'
    """
    if "://" not in text and "=" not in text:
        return text

    def userinfo(match: re.Match) -> str:
        user, colon, _ = match.group(2).partition(":")
        return f"{match.group(1)}{user}:***@" if colon else f"{match.group(1)}***@"

    return _PARAM.sub(r"\1\2=***", _USERINFO.sub(userinfo, text))


def locate(
    source: str | None = None,
    *,
    line: int | None = None,
    member: str | None = None,
    key: str | None = None,
) -> str:
    """Format a location: ``file:line``, ``shard [member m]``, ``key 'k'`` or a mix.

    >>> locate("data/text", line=3)
    'data/text:3'
    >>> locate("a.tar", member="u1.flac", key="u1")
    "a.tar [member u1.flac] (key 'u1')"
    """
    parts = []
    if source is not None:
        parts.append(f"{source}:{line}" if line is not None else str(source))
    elif line is not None:
        parts.append(f"line {line}")
    if member is not None:
        parts.append(f"[member {member}]")
    if key is not None:
        parts.append(f"(key {key!r})")
    return " ".join(parts) if parts else "<unknown input>"


class SpeechpipeError(Exception):
    """Base class of the errors speechpipe raises on purpose."""


#: The line :func:`mark_location` adds to an error's message in a DataLoader worker.
_MARK = "speechpipe-location: "
_MARK_LINE = re.compile(r"^" + re.escape(_MARK) + r"(\{.*\})$", re.MULTILINE)


def mark_location(error: BaseException) -> None:
    """Append the location of a speechpipe error to its message as one JSON line.

    A DataLoader worker sends an error to the main process as its type and its formatted
    traceback, and the main process raises ``type(text)``: the ``source``/``line``/
    ``member``/``key`` attributes would be lost (only the text would name them). Marked in the
    worker (``speechpipe.loader`` does it), the error rebuilt in the main process reads the
    line back: its attributes are the worker's, its message starts with the location.

    >>> error = DataError("bad line", source="text", line=3)
    >>> mark_location(error)
    >>> again = DataError("Caught DataError in DataLoader worker process 0. ..." + str(error))
    >>> again.source, again.line, again.reason
    ('text', 3, 'bad line')
    """
    if not isinstance(error, _Located) or not error.args or _MARK in str(error.args[0]):
        return
    where = {"reason": error.reason, "source": error.source, "line": error.line,
             "member": error.member, "key": error.key}
    try:
        line = _MARK + json.dumps(where, ensure_ascii=True)
    except (TypeError, ValueError):  # a location that is not JSON (an odd key type): as is
        return
    error.args = (f"{error.args[0]}\n{line}",) + tuple(error.args[1:])


def _read_mark(text: str) -> dict | None:
    """The location :func:`mark_location` wrote into ``text`` (its last mark), or None."""
    found = list(_MARK_LINE.finditer(text))
    try:
        where = json.loads(found[-1].group(1)) if found else None
    except ValueError:
        return None
    return where if isinstance(where, dict) else None


class _Located:
    """Mixin storing where the problem is and prefixing it to the message."""

    def _init_location(self, message, source, line, member, key):
        rest = None  # below the location: torch's account of an error from a worker
        if (source is None and line is None and member is None and key is None
                and isinstance(message, str) and _MARK in message):
            where = _read_mark(message)
            if where is not None:  # the error torch rebuilt from a worker's marked traceback
                rest = _MARK_LINE.sub("", message).rstrip()
                message, source, line = where.get("reason"), where.get("source"), where.get("line")
                member, key = where.get("member"), where.get("key")
        if isinstance(message, str):
            message = redact(message)
        self.reason = message
        self.source = None if source is None else redact(str(source))
        self.line = line
        self.member = member
        self.key = key
        if self.source is None and line is None and member is None and key is None:
            located = str(message)  # no "<unknown input>: " before a message without a place
        else:
            located = f"{locate(self.source, line=line, member=member, key=key)}: {message}"
        return located if rest is None else f"{located}\n{rest}"

    def __reduce__(self):
        # Keep the location when the error crosses a DataLoader worker boundary.
        return (
            _rebuild,
            (type(self), self.reason, self.source, self.line, self.member, self.key),
        )


def _rebuild(cls, reason, source, line, member, key):
    return cls(reason, source=source, line=line, member=member, key=key)


class DataError(_Located, SpeechpipeError, ValueError):
    """Malformed or inconsistent input; the message starts with where it is.

    >>> str(DataError("expected '<key> <value>'", source="wav.scp", line=2))
    "wav.scp:2: expected '<key> <value>'"
    """

    def __init__(self, message: str, *, source=None, line=None, member=None, key=None):
        super().__init__(self._init_location(message, source, line, member, key))


class OutputError(_Located, SpeechpipeError, OSError):
    """An output that could not be written (no space left, a read-only or vanished folder);
    the message starts with the file being written.

    >>> str(OutputError("cannot write: No space left on device", source="out/data-00003.tar"))
    'out/data-00003.tar: cannot write: No space left on device'
    """

    def __init__(self, message: str, *, source=None, line=None, member=None, key=None):
        super().__init__(self._init_location(message, source, line, member, key))

    @classmethod
    def wrap(cls, exc: OSError, path: str) -> "OutputError":
        """The error for ``exc``, raised while writing ``path``."""
        reason = exc.strerror or str(exc) or type(exc).__name__
        return cls(f"cannot write: {reason}" + (f" (errno {exc.errno})" if exc.errno else ""),
                   source=path)


class UnsafeInputError(DataError):
    """Input that would make speechpipe unpickle data or run a command it was not allowed to."""


class AudioFormatError(DataError):
    """Audio bytes soundfile (libsndfile) cannot decode; the message names the format found.

    >>> str(AudioFormatError("cannot decode MP4/M4A (AAC) audio", source="a.m4a", key="u1"))
    "a.m4a (key 'u1'): cannot decode MP4/M4A (AAC) audio"
    """


class ChannelMismatchError(DataError):
    """Samples with different channel counts in one batch (e.g. mono beside stereo)."""


class UnsupportedCodecError(SpeechpipeError, ValueError):
    """An audio encoding soundfile cannot write (format, subtype and sample rate)."""


class SampleRateError(DataError):
    """Audio at a sample rate the stage was not told about: computing on it would give numbers
    at the wrong scale (features), or a batch whose rows mean different durations (collate).

    >>> str(SampleRateError("8000 Hz audio, expected 16000 Hz", key="u1"))
    "(key 'u1'): 8000 Hz audio, expected 16000 Hz"
    """


class ResumeError(SpeechpipeError, ValueError):
    """A loader state that cannot resume this loader exactly; ``differences`` lists why.

    Each difference is ``(stage, field, saved, current)``: the stage (``"loader"`` for the
    topology, else the pipe's place and class in the graph), the field that decides the
    batches, and its value in the saved state and in this loader.

    >>> error = ResumeError("the state belongs to another loader",
    ...                     [("loader", "num_workers", 2, 0)])
    >>> error.differences
    [('loader', 'num_workers', 2, 0)]
    """

    def __init__(self, message: str, differences=()) -> None:
        super().__init__(message)
        self.differences = [tuple(d) for d in differences]

    def __reduce__(self):
        # Keep the differences when the error crosses a DataLoader worker boundary.
        return (type(self), (self.args[0], self.differences))


class MissingDataError(_Located, SpeechpipeError, FileNotFoundError):
    """A file, URL or pattern that matched nothing.

    >>> str(MissingDataError("no file matches", source="data/{a,b}/*.tar"))
    'data/{a,b}/*.tar: no file matches'
    """

    def __init__(self, message: str, *, source=None, line=None, member=None, key=None):
        # FileNotFoundError's own (errno, strerror) form is not used: str() is the message.
        super().__init__(self._init_location(message, source, line, member, key))

    def __str__(self) -> str:
        return self.args[0]


class FolderLockedError(_Located, SpeechpipeError, RuntimeError):
    """A pack folder (or one task of a pack) that another run is writing: the message names the
    lock file and its holder.

    >>> str(FolderLockedError("in use by pid 12 on host 'n1'", source="out/.speechpipe-pack.lock"))
    "out/.speechpipe-pack.lock: in use by pid 12 on host 'n1'"
    """

    def __init__(self, message: str, *, source=None, line=None, member=None, key=None):
        super().__init__(self._init_location(message, source, line, member, key))
