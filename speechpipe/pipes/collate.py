"""Collation: turn a list of samples into one batch dict, field by field.

Collation is not a pipe of its own: torch's ``collate`` stage calls a function on each list
that ``batch`` made, and speechpipe supplies that function::

    pipe.batch(16).collate(collate_fn=PadCollate(pad_values={"tokens": -1}))

A collate function ``List[Sample] -> Batch`` is composed of one function per field (Parakeet's
design): since a batch has the same fields as its samples, each field is collated on its own by
one of three field functions,

- :func:`pad_field` for variable-length arrays (time first): pads along axis 0 to the longest
  and returns the lengths, so ``audio`` ``(samples,)`` becomes ``(B, T)``, ``feats``
  ``(frames, dim)`` becomes ``(B, T, dim)`` and ``feats_len`` holds each sample's frames;
- :func:`stack_field` for numbers and fixed-size arrays: ``duration`` becomes ``(B,)``;
- :func:`list_field` for strings and other objects: ``key`` and ``text`` stay lists.

:class:`PadCollate` picks the function for each field from its type (or from the names given to
it) and returns a dict batch; :func:`pad_collate` is the one-call form. Output tensors are on the
CPU and keep the inputs' dtype (``float32`` stays ``float32``, ``int64`` stays ``int64``)
unless a dtype is asked for. Padding allocates each output once (``torch.full``) and copies
every array into its slice: no per-item ``np.pad`` and no Python loop over time steps.
"""

from __future__ import annotations

import math

from functools import lru_cache
from typing import Any, Callable, Iterable, Mapping, Sequence, Union

import numpy as np
import torch

from ..errors import ChannelMismatchError, DataError, SampleRateError
from ..sample import AUDIO, FEATS, KEY, SAMPLE_RATE, TOKENS, len_key
from ..memory import take
from ..memory import copied_out
from .decode import DeferredAudio, check_decode_options, decode_sample

__all__ = [
    "DEFAULT_PAD_VALUES",
    "DecodeCollate",
    "PadCollate",
    "list_field",
    "pad_collate",
    "pad_field",
    "stack_field",
]

#: Pad values :class:`PadCollate` uses unless told otherwise (``-1`` is never a token id).
DEFAULT_PAD_VALUES: Mapping[str, float] = {TOKENS: -1}

Number = Union[int, float, bool]
_PY_SCALARS = (bool, int, float)
_MAX_LISTED = 8  # keys listed in an error message before "... (+n more)"


# --------------------------------------------------------------------------------------------
# where things are, for error messages


def _label(keys: Sequence[Any] | None, i: int) -> str:
    key = keys[i] if keys is not None else None
    return repr(key) if isinstance(key, str) else f"#{i}"


def _labels(keys: Sequence[Any] | None, indices: Sequence[int]) -> str:
    shown = ", ".join(_label(keys, i) for i in indices[:_MAX_LISTED])
    more = len(indices) - _MAX_LISTED
    return f"[{shown}{f', ... (+{more} more)' if more > 0 else ''}]"


def _error(message: str, keys: Sequence[Any] | None, i: int,
           kind: type[DataError] = DataError) -> DataError:
    """A DataError located at the ``i``-th sample of the batch (its key, else its position)."""
    key = keys[i] if keys is not None else None
    if isinstance(key, str):
        return kind(message, key=key)
    return kind(message, source=f"batch item {i}")


class _SampleKeys(Sequence):
    """The samples' keys, read only when an error message needs them."""

    def __init__(self, samples: Sequence[Mapping[str, Any]]) -> None:
        self._samples = samples

    def __len__(self) -> int:
        return len(self._samples)

    def __getitem__(self, i):  # type: ignore[override]
        return self._samples[i].get(KEY)


# --------------------------------------------------------------------------------------------
# values to arrays


@lru_cache(maxsize=64)
def _torch_dtype_of(np_dtype: np.dtype) -> torch.dtype:
    """The torch dtype of a numpy dtype (``TypeError`` for dtypes torch does not have)."""
    return torch.from_numpy(np.empty(0, dtype=np_dtype.newbyteorder("="))).dtype


def _as_array(value: Any, name: str, keys: Sequence[Any] | None, i: int):
    """``value`` as a numpy array or a tensor, and its torch dtype (``None``: no opinion).

    An empty list has no dtype of its own, so it does not take part in choosing the batch's.
    """
    if isinstance(value, torch.Tensor):
        return value, value.dtype
    if isinstance(value, DeferredAudio):  # decoded by _copy_rows into its row (DecodeCollate)
        return value, torch.float32
    if isinstance(value, np.ndarray):
        array = value
    elif isinstance(value, (list, tuple, np.generic) + _PY_SCALARS):
        try:
            array = np.asarray(value)
        except ValueError as exc:  # ragged nested lists
            raise _error(f"field {name!r} is a ragged nested list: {exc}", keys, i) from exc
        if isinstance(value, (list, tuple)) and array.size == 0:
            return array, None
    else:
        raise _error(
            f"field {name!r} is a {type(value).__name__}, not an array or a number", keys, i
        )
    if array.dtype.kind not in "biufc":
        raise _error(f"field {name!r} has non-numeric dtype {array.dtype}", keys, i)
    try:
        return array, _torch_dtype_of(array.dtype)
    except TypeError as exc:
        raise _error(f"field {name!r} has dtype {array.dtype}, which torch lacks", keys, i) from exc


def _result_dtype(
    dtypes: Sequence[torch.dtype | None],
    dtype: torch.dtype | None,
    float_dtype: torch.dtype | None,
) -> torch.dtype:
    if dtype is not None:
        return dtype
    result = None
    for d in dtypes:
        if d is not None and d is not result:
            result = d if result is None else torch.promote_types(result, d)
    if result is None:  # only empty lists
        result = torch.float64
    if float_dtype is not None and result.is_floating_point:
        return float_dtype
    return result


def _shape_mismatch(
    what: str, name: str, shapes: Sequence[tuple], keys: Sequence[Any] | None
) -> DataError:
    groups: dict[tuple, list[int]] = {}
    for i, shape in enumerate(shapes):
        groups.setdefault(shape, []).append(i)
    listed = "; ".join(f"{shape} in {_labels(keys, idx)}" for shape, idx in groups.items())
    first_odd = list(groups.values())[1][0]
    message = f"field {name!r}: {what} differ across the batch: {listed}"
    # audio (samples, channels) and feats (frames, channels, dim): a different channel axis
    if name == AUDIO or (name == FEATS and len({len(shape) for shape in shapes}) > 1):
        return _error(f"{message}: mono and multi-channel samples (or different channel "
                      "counts) in one batch; select_channel(i) or downmix() before batching",
                      keys, first_odd, ChannelMismatchError)
    return _error(message, keys, first_odd)


def _empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialized tensor; in a DataLoader worker, in shared memory from the start (as
    torch's ``default_collate`` does), so that sending the batch to the main process passes
    a handle instead of copying the batch into shared memory first."""
    if torch.utils.data.get_worker_info() is None:
        return torch.empty(shape, dtype=dtype)
    pooled = take(shape, dtype)  # a reused slot, with build_loader's reuse_shared_memory
    if pooled is not None:
        return pooled
    proto = torch.empty(0, dtype=dtype)
    storage = proto._typed_storage()._new_shared(math.prod(shape), device=proto.device)
    return proto.new(storage).resize_(shape)


def _copy_rows(out: torch.Tensor, arrays: Sequence[Any], lengths: Sequence[int] | None) -> None:
    """Copy ``arrays[i]`` into ``out[i, :lengths[i]]`` (whole rows when ``lengths`` is None).

    Writable native-order numpy arrays go through ``torch.from_numpy`` (no copy) and
    ``Tensor.copy_``; read-only ones (from ``np.frombuffer``) and other byte orders are assigned
    through numpy's view of the same output memory, which neither warns nor copies twice.
    Read-only arrays are most often views of mapped shards: their bytes are reported to
    :func:`~speechpipe.memory._mmap.copied_out`, which keeps the pages read back out of RSS.
    """
    out_np = None
    read_only = 0
    for i, array in enumerate(arrays):
        n = None if lengths is None else lengths[i]
        if isinstance(array, DeferredAudio):
            if out_np is None:
                out_np = _numpy_view(out)
            if out_np is not False:
                array.read_into(out_np[i] if n is None else out_np[i, :n])
                continue
            decoded = np.empty(array.shape, np.float32)
            array.read_into(decoded)
            array = decoded
        if n == 0:
            continue
        if isinstance(array, np.ndarray):
            if not (array.flags.writeable and array.dtype.isnative):
                read_only += array.nbytes
                if out_np is None:
                    out_np = _numpy_view(out)
                if out_np is not False:
                    out_np[i if n is None else (i, slice(0, n))] = array
                    continue
                array = array.astype(array.dtype.newbyteorder("="), copy=True)
            array = torch.from_numpy(array)
        (out[i] if n is None else out[i, :n]).copy_(array)
    if read_only:  # views of mapped shards among them: their pages may leave RSS again
        copied_out(read_only)


def _numpy_view(out: torch.Tensor) -> np.ndarray | bool:
    """numpy's view of ``out``'s memory, or ``False`` for a dtype numpy lacks (bfloat16)."""
    try:
        return out.numpy()
    except (TypeError, RuntimeError):
        return False


def _check_pad_value(pad_value: Any, dtype: torch.dtype, name: str) -> None:
    if not isinstance(pad_value, (int, float, bool, np.number, np.bool_)):
        raise TypeError(f"pad value for field {name!r} must be a number, got {pad_value!r}")
    integral = not (dtype.is_floating_point or dtype.is_complex)
    if integral and not float(pad_value).is_integer():
        raise ValueError(
            f"pad value {pad_value!r} for field {name!r} does not fit its dtype {dtype}"
        )


# --------------------------------------------------------------------------------------------
# field collate functions


def _pad(
    values: Sequence[Any],
    pad_value: Number,
    dtype: torch.dtype | None,
    float_dtype: torch.dtype | None,
    name: str,
    keys: Sequence[Any] | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    if len(values) == 0:
        raise ValueError(f"cannot pad field {name!r}: no values")
    arrays, dtypes = [], []
    for i, value in enumerate(values):
        array, d = _as_array(value, name, keys, i)
        if array.ndim == 0:
            raise _error(
                f"field {name!r} is a scalar, which has no time axis to pad (stack it instead)",
                keys,
                i,
            )
        arrays.append(array)
        dtypes.append(d)
    trailing = tuple(arrays[0].shape[1:])
    shapes = [tuple(a.shape[1:]) for a in arrays]
    if any(s != trailing for s in shapes):
        raise _shape_mismatch("trailing dims (after time)", name, shapes, keys)
    lengths = [int(a.shape[0]) for a in arrays]
    out_dtype = _result_dtype(dtypes, dtype, float_dtype)
    _check_pad_value(pad_value, out_dtype, name)
    longest = max(lengths)
    out = _empty((len(arrays), longest, *trailing), out_dtype)
    _copy_rows(out, arrays, lengths)
    for i, n in enumerate(lengths):  # only the padding is filled, not the whole tensor
        if n < longest:
            out[i, n:] = pad_value
    return out, torch.tensor(lengths, dtype=torch.int64)


def pad_field(
    values: Sequence[Any],
    pad_value: Number = 0,
    dtype: torch.dtype | None = None,
    *,
    name: str = "values",
    keys: Sequence[str | None] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad variable-length arrays along axis 0 into one ``(B, T, ...)`` tensor plus lengths.

    Args:
        values: numpy arrays, torch tensors or lists of numbers, time first; the dims after
            the first (``trailing dims``) must be the same for all.
        pad_value: value of the padding positions (``-1`` for token ids, ``0`` for audio).
        dtype: dtype of the output; by default the inputs' (promoted if they differ; lists
            follow numpy: ints become ``int64``, floats ``float64``).
        name: field name, for error messages.
        keys: the samples' keys, for error messages (else their positions are named).

    Returns:
        ``(padded, lengths)``: ``padded`` of shape ``(B, T, ...)`` with ``T`` the longest
        length, and ``lengths`` an ``int64`` tensor ``(B,)`` of each input's length.

    Raises:
        DataError: a value is not numeric, is a scalar, or its trailing dims differ from the
            others' (the message names the field and the keys of each shape).

    >>> padded, lengths = pad_field([np.array([1, 2, 3]), np.array([4])], pad_value=-1)
    >>> padded
    tensor([[ 1,  2,  3],
            [ 4, -1, -1]])
    >>> lengths
    tensor([3, 1])
    """
    return _pad(values, pad_value, dtype, None, name, keys)


def _stack(
    values: Sequence[Any],
    dtype: torch.dtype | None,
    float_dtype: torch.dtype | None,
    name: str,
    keys: Sequence[Any] | None,
) -> torch.Tensor:
    if len(values) == 0:
        raise ValueError(f"cannot stack field {name!r}: no values")
    if all(type(v) in _PY_SCALARS for v in values):  # the common case: one numpy call
        array = np.asarray(values)
        if array.dtype.kind in "biuf":  # else (an int beyond int64) the general path explains
            out = torch.from_numpy(array)
            out_dtype = _result_dtype([out.dtype], dtype, float_dtype)
            return out if out.dtype == out_dtype else out.to(out_dtype)
    arrays, dtypes = [], []
    for i, value in enumerate(values):
        array, d = _as_array(value, name, keys, i)
        arrays.append(array)
        dtypes.append(d)
    shapes = [tuple(a.shape) for a in arrays]
    if any(s != shapes[0] for s in shapes):
        raise _shape_mismatch("shapes", name, shapes, keys)
    out = _empty((len(arrays), *shapes[0]), _result_dtype(dtypes, dtype, float_dtype))
    _copy_rows(out, arrays, None)
    return out


def stack_field(
    values: Sequence[Any],
    dtype: torch.dtype | None = None,
    *,
    name: str = "values",
    keys: Sequence[str | None] | None = None,
) -> torch.Tensor:
    """Stack numbers or same-shape arrays into one ``(B, ...)`` tensor.

    Args:
        values: Python or numpy numbers, numpy arrays or tensors, all of the same shape.
        dtype: dtype of the output; by default the inputs' (Python numbers follow numpy:
            ``int`` becomes ``int64``, ``float`` ``float64``, ``bool`` ``bool``).
        name: field name, for error messages.
        keys: the samples' keys, for error messages.

    Raises:
        DataError: a value is not numeric, or the shapes differ (the message names the field
            and the keys of each shape).

    >>> stack_field([1.5, 2.0, 0.25])
    tensor([1.5000, 2.0000, 0.2500], dtype=torch.float64)
    >>> stack_field([np.zeros(2, np.float32), np.ones(2, np.float32)]).shape
    torch.Size([2, 2])
    """
    return _stack(values, dtype, None, name, keys)


def list_field(values: Iterable[Any]) -> list:
    """Keep values as a list: the collation of strings, ``None`` and other objects.

    >>> list_field(("utt1", "utt2"))
    ['utt1', 'utt2']
    """
    return list(values)


# --------------------------------------------------------------------------------------------
# the composed collate function


def _names_arg(arg_name: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise TypeError(f"{arg_name} must be a list or tuple of field names, got {value!r}")
    names = tuple(value)
    for n in names:
        if not isinstance(n, str):
            raise TypeError(f"{arg_name} must hold field names (str), got {n!r}")
    return names


class PadCollate:
    """Collate a list of samples into a dict batch, choosing a field function per field.

    Give it to torch's ``collate`` stage, ``pipe.batch(n).collate(collate_fn=PadCollate())``,
    or to a ``DataLoader`` as ``collate_fn``. It is a plain picklable object (no lambdas), so
    DataLoader workers can receive it.

    Each field of the samples is collated by type, unless named in an argument:

    - a numpy array or tensor with ``ndim >= 1``: padded along axis 0 by :func:`pad_field`,
      plus an ``int64`` ``<name>_len`` tensor of the lengths right after it in the batch;
    - a Python or numpy number (``int``, ``float``, ``bool``): a 1-D tensor by
      :func:`stack_field`;
    - anything else (``str``, ``None``, lists, dicts): a list by :func:`list_field`.

    The type is read from the first sample whose value is not ``None``; a later value that does
    not fit raises :class:`~speechpipe.errors.DataError` naming the field and the key.

    Args:
        pad_values: pad value per field (default ``0``); merged over
            :data:`DEFAULT_PAD_VALUES`, so ``tokens`` are padded with ``-1`` unless set. A field
            named here is always padded, even when it holds lists of numbers.
        fields: collate only these fields, in this order (every sample must have them);
            by default all fields, in the first sample's order.
        stack: fields to stack (fixed-size arrays: no ``_len`` is added).
        as_list: fields kept as lists whatever their type.
        drop: fields left out of the batch.
        dtype: a floating dtype for floating-point fields (e.g. ``torch.float32`` for
            ``float64`` features or durations); integer and bool fields keep theirs. By default
            every field keeps its source dtype.
        collate_fns: your own function per field, ``values (list, one per sample) -> the
            batch's value`` (e.g. a vocabulary's own padding, or a ragged structure), as
            Parakeet composes a batch from per-field collate functions; the other fields are
            collated as above. Module-level functions, so that DataLoader workers receive them.

    Every sample must have the same fields (after ``drop`` and ``fields``): a sample missing a
    field that another has raises :class:`~speechpipe.errors.DataError` naming the field and
    the keys lacking it. A batch whose ``sample_rate`` (or ``<name>_sample_rate``) values differ
    raises :class:`~speechpipe.errors.SampleRateError` naming the keys at each rate: padded
    rows at different rates mean different durations (resample before batching, or drop the
    field if the rows are features that no longer depend on it). An empty batch raises
    ``ValueError``.

    >>> collate = PadCollate(drop=("sample_rate",))
    >>> batch = collate([
    ...     {"key": "a", "audio": np.ones(3, np.float32), "tokens": np.array([5, 6]),
    ...      "sample_rate": 16000},
    ...     {"key": "b", "audio": np.ones(2, np.float32), "tokens": np.array([7]),
    ...      "sample_rate": 16000},
    ... ])
    >>> list(batch)
    ['key', 'audio', 'audio_len', 'tokens', 'tokens_len']
    >>> batch["audio"]
    tensor([[1., 1., 1.],
            [1., 1., 0.]])
    >>> batch["tokens"], batch["tokens_len"]
    (tensor([[ 5,  6],
            [ 7, -1]]), tensor([2, 1]))
    >>> PadCollate(collate_fns={"key": "+".join})([{"key": "a"}, {"key": "b"}])
    {'key': 'a+b'}
    """

    def __init__(
        self,
        pad_values: Mapping[str, Number] | None = None,
        fields: Sequence[str] | None = None,
        stack: Sequence[str] = (),
        as_list: Sequence[str] = (),
        drop: Sequence[str] = (),
        dtype: torch.dtype | None = None,
        collate_fns: Mapping[str, Callable[[list], Any]] | None = None,
    ) -> None:
        collate_fns = {} if collate_fns is None else collate_fns
        if not isinstance(collate_fns, Mapping) or not all(
                isinstance(k, str) and callable(f) for k, f in collate_fns.items()):
            raise TypeError(f"collate_fns must map field names to functions, got "
                            f"{collate_fns!r}")
        if pad_values is None:
            pad_values = {}
        if not isinstance(pad_values, Mapping):
            raise TypeError(f"pad_values must be a mapping of field -> number, got {pad_values!r}")
        for field, value in pad_values.items():
            if not isinstance(field, str):
                raise TypeError(f"pad_values keys must be field names (str), got {field!r}")
            if isinstance(value, str) or not isinstance(value, (int, float, np.number)):
                raise TypeError(f"pad_values[{field!r}] must be a number, got {value!r}")
        self.fields = None if fields is None else _names_arg("fields", fields)
        self.stack = _names_arg("stack", stack)
        self.as_list = _names_arg("as_list", as_list)
        self.drop = _names_arg("drop", drop)
        for a, b in (("stack", "as_list"), ("stack", "drop"), ("as_list", "drop")):
            both = set(getattr(self, a)) & set(getattr(self, b))
            if both:
                raise ValueError(f"fields {sorted(both)} are in both {a} and {b}")
        if self.fields is not None:
            both = set(self.fields) & set(self.drop)
            if both:
                raise ValueError(f"fields {sorted(both)} are in both fields and drop")
            if len(set(self.fields)) != len(self.fields):
                raise ValueError(f"fields has duplicates: {list(self.fields)}")
        both = set(pad_values) & (set(self.stack) | set(self.as_list))
        if both:
            raise ValueError(f"fields {sorted(both)} have a pad value but are in stack or as_list")
        both = set(collate_fns) & (set(pad_values) | set(self.stack) | set(self.as_list)
                                   | set(self.drop))
        if both:
            raise ValueError(f"fields {sorted(both)} have a collate function and are also in "
                             "pad_values, stack, as_list or drop")
        self.collate_fns = dict(collate_fns)
        if dtype is not None:
            if not isinstance(dtype, torch.dtype):
                raise TypeError(f"dtype must be a torch.dtype, got {dtype!r}")
            if not dtype.is_floating_point:
                raise ValueError(
                    f"dtype applies to floating-point fields and must be floating, got {dtype}"
                )
        self.forced_pad = tuple(pad_values)
        self.pad_values = {**DEFAULT_PAD_VALUES, **pad_values}
        self.dtype = dtype

    def __repr__(self) -> str:
        return (
            f"PadCollate(pad_values={self.pad_values!r}, fields={self.fields!r}, "
            f"stack={self.stack!r}, as_list={self.as_list!r}, drop={self.drop!r}, "
            f"dtype={self.dtype!r}"
            + (f", collate_fns={self.collate_fns!r})" if self.collate_fns else ")")
        )

    def _field_names(self, samples: Sequence[Mapping[str, Any]]) -> list[str]:
        """The fields to collate, checking that every sample has each of them."""
        drop = set(self.drop)
        first = samples[0]
        if self.fields is not None:
            names = list(self.fields)
            wanted = set(names)
            consistent = all(wanted <= s.keys() for s in samples)
        else:
            names = [n for n in first if n not in drop]
            wanted = set(names)
            if drop:
                consistent = all(s.keys() - drop == wanted for s in samples)
            else:
                consistent = all(s.keys() == wanted for s in samples)
        if consistent:
            return names
        keys = _SampleKeys(samples)
        candidates: dict[str, None] = dict.fromkeys(names)
        if self.fields is None:
            for s in samples:
                candidates.update(dict.fromkeys(n for n in s if n not in drop))
        for field in candidates:
            lacking = [i for i, s in enumerate(samples) if field not in s]
            if lacking:
                having = [i for i, s in enumerate(samples) if field in s]
                where = f"present in {_labels(keys, having)}" if having else "requested in fields"
                raise _error(
                    f"field {field!r} is missing from {len(lacking)} of {len(samples)} samples: "
                    f"{_labels(keys, lacking)} ({where})",
                    keys,
                    lacking[0],
                )
        raise AssertionError("unreachable: inconsistent fields without a missing one")

    def _kind(self, name: str, values: Sequence[Any]) -> str:
        if name in self.as_list:
            return "list"
        if name in self.stack:
            return "stack"
        if name in self.forced_pad:
            return "pad"
        value = next((v for v in values if v is not None), None)
        if isinstance(value, (np.ndarray, torch.Tensor, DeferredAudio)):
            return "pad" if value.ndim >= 1 else "stack"
        if isinstance(value, _PY_SCALARS + (np.number, np.bool_)):
            return "stack"
        return "list"

    def __call__(self, samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        if not isinstance(samples, Sequence):
            samples = list(samples)
        if len(samples) == 0:
            raise ValueError("cannot collate an empty batch")
        for i, s in enumerate(samples):
            if not isinstance(s, Mapping):
                raise TypeError(f"PadCollate expects sample dicts, got {type(s).__name__} at {i}")
        names = self._field_names(samples)
        keys = _SampleKeys(samples)
        batch: dict[str, Any] = {}
        for name in names:
            values = [s[name] for s in samples]
            if name.endswith(SAMPLE_RATE):
                _check_one_rate(name, values, keys)
            own = self.collate_fns.get(name)
            if own is not None:
                batch[name] = own(values)
                continue
            kind = self._kind(name, values)
            if kind == "pad":
                length_name = len_key(name)
                if length_name in names:
                    raise _error(
                        f"field {length_name!r} would be overwritten by the lengths of {name!r}; "
                        "drop it or rename it",
                        keys,
                        0,
                    )
                pad_value = self.pad_values.get(name, 0.0)
                batch[name], batch[length_name] = _pad(
                    values, pad_value, None, self.dtype, name, keys
                )
            elif kind == "stack":
                batch[name] = _stack(values, None, self.dtype, name, keys)
            else:
                batch[name] = values
        return batch


class _ResampledAudio(DeferredAudio):
    """A :class:`DeferredAudio` resampled to ``sample_rate`` as it is decoded into its row:
    decoded into a scratch array at its own rate, then resampled
    (:func:`~speechpipe.pipes.audio.resample_audio`, torchaudio's numbers) into the row. Its
    ``shape`` is the resampled one, ``ceil(frames * rate / own rate)``."""

    __slots__ = ("_source",)

    def __init__(self, source: DeferredAudio, rate: int) -> None:  # no file of its own
        self._source = source
        self.sample_rate = rate
        frames = -(-source.shape[0] * rate // source.sample_rate)
        self.shape = (frames,) + tuple(source.shape[1:])

    def read_into(self, out: np.ndarray) -> None:
        from .audio import resample_audio

        source = self._source
        own = np.empty(source.shape, np.float32)
        source.read_into(own)
        out[...] = resample_audio(own, source.sample_rate, self.sample_rate)

    def close(self) -> None:
        self._source.close()

    def __repr__(self) -> str:
        return (f"DeferredAudio(shape={self.shape}, sample_rate={self.sample_rate}, "
                f"resampled from {self._source.sample_rate})")


def _resample_fields(sample: dict, rate: int) -> dict:
    """``sample`` with every audio field at ``rate``: deferred audio wrapped to be resampled
    as it is decoded, decoded audio resampled; the rate fields set to ``rate``."""
    for name, value in list(sample.items()):
        rate_name = SAMPLE_RATE if name == AUDIO else f"{name}_{SAMPLE_RATE}"
        own = sample.get(rate_name)
        if own is None or own == rate:
            continue
        if isinstance(value, DeferredAudio):
            sample[name] = _ResampledAudio(value, rate)
        elif isinstance(value, np.ndarray):
            from .audio import resample_audio

            sample[name] = resample_audio(value, int(own), rate)
        else:
            continue
        sample[rate_name] = rate
    return sample


class DecodeCollate(PadCollate):
    """Decode raw samples and collate them in one step, each audio payload decoded straight
    into its row of the padded batch.

    ``pipe.block_batch(...).collate(collate_fn=DecodeCollate())`` over raw samples (as
    ``read_shards`` or ``sharded_shuffle`` yield them, before ``decode``) gives the batch that
    ``.map(decode_sample)`` then :class:`PadCollate` gives -- the same fields, names, sample
    rates, errors -- but soundfile writes each utterance's samples once, into the batch (in a
    DataLoader worker under :func:`~speechpipe.loader.build_loader`, the worker's reused
    shared memory), instead of into an array of its own that collation copies: 1.03-1.07 x the
    decode's own CPU against 1.15-1.30 x for decode + copy (``bench_decode`` part 4;
    benchmarks/README.md, "Session 9"). It is the worker side of features on the device: workers decode, the batched
    fbank runs where the batch goes (``compute_features(batched=True, device=...)``).
    Batch on lengths known without decoding (a shard index's, or a manifest's).

    **Mixed sample rates.** A batch's rows share one rate: without ``sample_rate`` a batch
    mixing rates is a :class:`~speechpipe.errors.SampleRateError`. With ``sample_rate=16000``
    every audio field at another rate is resampled as it is decoded into its row
    (:func:`~speechpipe.pipes.audio.resample_audio`, the numbers of
    :func:`torchaudio.functional.resample` and of the ``resample`` stage; the row holds
    ``ceil(frames * 16000 / rate)`` samples) and the batch's ``sample_rate`` is 16000: Common
    Voice's 32/48 kHz MP3s, or telephone 8 kHz with wideband, batch undecoded and come out at
    one rate. Audio already at the rate is decoded straight into its row as before; a
    resampled one goes through a scratch array of its own rate. Batch on durations
    (``PaddedArea(budget=seconds, length="duration")``), which the rate does not change.

    Args:
        unknown, rename, channels: as ``decode`` (:func:`~speechpipe.pipes.decode.decode_sample`).
        sample_rate: the rate (Hz) of every audio field of the batch, resampling the others;
            None (default): keep each file's rate (a batch mixing rates is an error).
        **kwargs: :class:`PadCollate`'s (``pad_values``, ``fields``, ``stack``, ``as_list``,
            ``drop``, ``dtype``).

    >>> import io, soundfile
    >>> def flac(n):
    ...     buffer = io.BytesIO()
    ...     soundfile.write(buffer, np.full(n, 0.5, np.float32), 16000, format="FLAC")
    ...     return buffer.getvalue()
    >>> batch = DecodeCollate()([{"key": "a", "flac": flac(3), "txt": b"hi"},
    ...                          {"key": "b", "flac": flac(2), "txt": b"yo"}])
    >>> batch["audio"], batch["audio_len"], batch["sample_rate"], batch["text"]
    (tensor([[0.5000, 0.5000, 0.5000],
            [0.5000, 0.5000, 0.0000]]), tensor([3, 2]), tensor([16000, 16000]), ['hi', 'yo'])
    >>> def wav8k(n):
    ...     buffer = io.BytesIO()
    ...     soundfile.write(buffer, np.full(n, 0.5, np.float32), 8000, format="WAV")
    ...     return buffer.getvalue()
    >>> mixed = DecodeCollate(sample_rate=16000)([{"key": "a", "flac": flac(3200)},
    ...                                           {"key": "b", "wav": wav8k(800)}])
    >>> mixed["audio_len"], mixed["sample_rate"]  # 0.2 s and 0.1 s, both at 16 kHz
    (tensor([3200, 1600]), tensor([16000, 16000]))
    """

    def __init__(self, *, unknown: str = "error", rename: Mapping[str, str] | None = None,
                 channels: str | int = "keep", sample_rate: int | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.unknown, self.rename, self.channels = check_decode_options(unknown, rename,
                                                                        channels)
        if sample_rate is not None and (isinstance(sample_rate, bool)
                                        or not isinstance(sample_rate, int) or sample_rate < 1):
            raise ValueError(f"sample_rate must be an int >= 1 (Hz) or None, got {sample_rate!r}")
        self.sample_rate = sample_rate

    def __repr__(self) -> str:
        rate = "" if self.sample_rate is None else f"sample_rate={self.sample_rate!r}, "
        return (f"DecodeCollate(unknown={self.unknown!r}, rename={self.rename!r}, "
                f"channels={self.channels!r}, {rate}{super().__repr__()[len('PadCollate('):]}")

    def __call__(self, samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        decoded: list[dict] = []
        try:
            for sample in samples:
                if not isinstance(sample, Mapping):
                    raise TypeError(f"DecodeCollate expects sample dicts, got "
                                    f"{type(sample).__name__}")
                decoded.append(decode_sample(sample, unknown=self.unknown, rename=self.rename,
                                             channels=self.channels, defer_audio=True))
                if self.sample_rate is not None:
                    _resample_fields(decoded[-1], self.sample_rate)
            return super().__call__(decoded)
        finally:  # files not decoded (an error, a dropped field) are closed
            for sample in decoded:
                for value in sample.values():
                    if isinstance(value, DeferredAudio):
                        value.close()


def _rate_order(item: tuple[Any, list[int]]) -> tuple[int, Any]:
    rate = item[0]
    return (0, float(rate)) if isinstance(rate, _PY_SCALARS + (np.number,)) else (1, str(rate))


def _check_one_rate(name: str, values: Sequence[Any], keys: Sequence[Any]) -> None:
    """Raise :class:`SampleRateError` if a batch's ``name`` values are not all equal."""
    first = values[0]
    if all(v == first for v in values):
        return
    by_rate: dict[Any, list[int]] = {}
    for i, v in enumerate(values):
        by_rate.setdefault(v, []).append(i)
    shown = "; ".join(f"{rate} Hz: {len(ids)} {_labels(keys, ids)}"
                      for rate, ids in sorted(by_rate.items(), key=_rate_order))
    minority = min(by_rate.values(), key=len)
    key = keys[minority[0]]
    raise SampleRateError(
        f"the batch mixes sample rates in {name!r} ({shown}); resample before batching "
        "(pipe.resample(rate)) or, for undecoded samples, as they are decoded into the batch "
        "(DecodeCollate(sample_rate=rate)); or drop the field if its rows no longer depend on it",
        **({"key": key} if isinstance(key, str) else {"source": f"batch item {minority[0]}"}))


def pad_collate(samples: Sequence[Mapping[str, Any]], **kwargs: Any) -> dict[str, Any]:
    """Collate ``samples`` in one call: ``PadCollate(**kwargs)(samples)``.

    For a pipeline, build the :class:`PadCollate` once and pass it as ``collate_fn``.

    >>> batch = pad_collate([{"key": "a", "duration": 1.5}, {"key": "b", "duration": 2.0}])
    >>> batch
    {'key': ['a', 'b'], 'duration': tensor([1.5000, 2.0000], dtype=torch.float64)}
    """
    return PadCollate(**kwargs)(samples)
