"""The sample schema: what flows between pipes, and the one rule for a sample's length.

A **sample** is a plain ``dict``. These keys have a fixed meaning everywhere in speechpipe:

==================  ==========================================================================
key                 value
==================  ==========================================================================
``key``             utterance id, ``str`` (Kaldi key, tar key, manifest id)
``audio``           waveform, ``numpy.float32`` array, **time first**: ``(samples,)`` for mono
                    or ``(samples, channels)``, values in [-1, 1] (soundfile's layout)
``sample_rate``     ``int``, Hz, of ``audio``
``feats``           features, ``numpy.float32`` array ``(frames, dim)`` (Kaldi's layout);
                    ``(frames, channels, dim)`` when computed from audio of several channels
``text``            transcript, ``str``
``tokens``          token ids, ``numpy.int64`` array ``(length,)``
``speaker``         speaker id, ``str``
``duration``        seconds, ``float`` (from a manifest, before any audio is read)
``num_frames``      ``int``: a length known before the data is read (index, data_len file)
``source``          where the sample came from (file, shard; ``file:line`` for a line of a
                    manifest or Kaldi table), ``str``, for error messages
==================  ==========================================================================

Every array is **time first** (axis 0), so padding always happens along axis 0 and a batch
of any field has shape ``(batch, time, ...)``. Channels are the axis after time, so a sample's
length and duration do not depend on how many it has; mono audio stays ``(samples,)`` (what
every reader has always given), and a batch cannot mix mono with several channels
(:class:`~speechpipe.errors.ChannelMismatchError`: ``select_channel`` or ``downmix`` first).

A **batch** (what :mod:`speechpipe.pipes.collate` makes) is a dict of padded tensors plus one
``<name>_len`` int64 tensor per padded field, and lists for strings.

**Length rule** (used by every batching stage): :func:`sample_length` is the size along axis 0
of the first present field among ``feats``, ``audio``, ``tokens`` -- frames if the sample has
features, samples if it has only audio -- unless a field is named explicitly; before any data
is read, ``num_frames`` stands in for it.
"""

from __future__ import annotations

import numbers

from typing import Any, Mapping, Sequence

__all__ = [
    "AUDIO",
    "AUDIO_EXTENSIONS",
    "DURATION",
    "FEATS",
    "INT_EXTENSIONS",
    "JSON_EXTENSIONS",
    "KEY",
    "LENGTH_FIELDS",
    "NPY_EXTENSIONS",
    "NUM_FRAMES",
    "SAMPLE_RATE",
    "SOURCE",
    "SPEAKER",
    "Sample",
    "TEXT",
    "TEXT_EXTENSIONS",
    "TOKENS",
    "UNSAFE_EXTENSIONS",
    "estimate_boundaries",
    "key_member_problem",
    "len_key",
    "sample_duration",
    "sample_length",
]

KEY = "key"
AUDIO = "audio"
SAMPLE_RATE = "sample_rate"
FEATS = "feats"
TEXT = "text"
TOKENS = "tokens"
SPEAKER = "speaker"
DURATION = "duration"
NUM_FRAMES = "num_frames"
SOURCE = "source"

#: Fields searched, in order, by :func:`sample_length` when no field is named.
LENGTH_FIELDS = (FEATS, AUDIO, TOKENS)

Sample = dict  # a dict[str, Any] with the keys above

# The file-extension vocabularies: what a member, field or file suffix means, shared by the
# shard reader and writer and the decoders.
#: Audio and arrays: decoded by ``decode``, mapped as views by the shard reader.
AUDIO_EXTENSIONS = ("flac", "mp3", "ogg", "opus", "wav")
NPY_EXTENSIONS = ("npy",)
TEXT_EXTENSIONS = ("text", "transcript", "txt")
JSON_EXTENSIONS = ("json",)
INT_EXTENSIONS = ("cls", "id", "index")
#: Extensions whose only decoder would be ``pickle``: always refused.
UNSAFE_EXTENSIONS = ("pickle", "pkl", "pt", "pth", "pyd")


def key_member_problem(key: str) -> str | None:
    """Why ``key`` cannot name tar members (``<key>.<field>``), or ``None`` if it can.

    A key is a relative path whose parts are non-empty and not ``.`` or ``..`` (a member
    ``../../evil.flac`` attacks whoever unpacks the shard with ``tar``), without backslashes or
    NUL, and whose last part has no dot (a reader splits ``<key>.<field>`` at the first dot).

    >>> key_member_problem("spk1/utt1") is None
    True
    >>> key_member_problem("../../evil")
    "its parts must not be '.', '..' or empty"
    """
    if key.startswith("/"):
        return "it must be a relative path (not start with '/')"
    if "\\" in key or "\0" in key:
        return "it must not hold a backslash or NUL"
    parts = key.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return "its parts must not be '.', '..' or empty"
    if "." in parts[-1]:
        return ("the part after the last '/' must be without dots (a reader splits "
                "'<key>.<field>' at the first dot)")
    return None


def len_key(name: str) -> str:
    """Name of the length tensor that collation adds for a padded field.

    >>> len_key("feats")
    'feats_len'
    """
    return f"{name}_len"


def sample_length(sample: Mapping[str, Any], field: str | None = None) -> int | float:
    """Length of a sample along time: frames for ``feats``, samples for ``audio``.

    Args:
        sample: a sample dict.
        field: measure this field (an array's first axis, or a number as it is: ``duration``,
            ``num_frames``); by default the first of ``feats``, ``audio``, ``tokens`` present,
            else ``num_frames``.

    >>> import numpy as np
    >>> sample_length({"audio": np.zeros(16000), "feats": np.zeros((98, 80))})
    98
    >>> sample_length({"audio": np.zeros(16000)})
    16000
    >>> sample_length({"num_frames": 412}), sample_length({"duration": 4.12}, "duration")
    (412, 4.12)
    """
    if field is not None:
        if field not in sample:
            raise KeyError(f"sample {sample.get(KEY)!r} has no field {field!r} to measure")
        value = sample[field]
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            return value
        return _axis0(value)
    for name in LENGTH_FIELDS:
        if name in sample:
            return _axis0(sample[name])
    if NUM_FRAMES in sample:
        return int(sample[NUM_FRAMES])
    raise KeyError(
        f"sample {sample.get(KEY)!r} has none of {LENGTH_FIELDS + (NUM_FRAMES,)} to measure"
    )


def sample_duration(sample: Mapping[str, Any]) -> float:
    """Seconds of audio in a sample: ``duration`` if given, else samples / sample_rate.

    >>> import numpy as np
    >>> sample_duration({"audio": np.zeros(8000), "sample_rate": 16000})
    0.5
    """
    if DURATION in sample:
        return float(sample[DURATION])
    if AUDIO in sample and SAMPLE_RATE in sample:
        return _axis0(sample[AUDIO]) / float(sample[SAMPLE_RATE])
    raise KeyError(f"sample {sample.get(KEY)!r} has neither 'duration' nor audio with a rate")


def _axis0(value: Any) -> int:
    shape = getattr(value, "shape", None)
    if shape is not None:
        if len(shape) == 0:
            raise ValueError("a scalar has no time axis")
        return int(shape[0])
    return len(value)


def estimate_boundaries(lengths: Sequence[float], num_buckets: int) -> list[float]:
    """Bucket boundaries at equal-count quantiles of ``lengths`` (``num_buckets - 1`` cuts).

    >>> estimate_boundaries(list(range(100)), 4)
    [25, 50, 75]
    """
    if num_buckets < 1:
        raise ValueError(f"num_buckets must be >= 1, got {num_buckets}")
    ordered = sorted(lengths)
    if not ordered or num_buckets == 1:
        return []
    cuts = [ordered[min(len(ordered) - 1, (i * len(ordered)) // num_buckets)]
            for i in range(1, num_buckets)]
    return sorted(set(cuts))
