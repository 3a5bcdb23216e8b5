"""The move to the device: numpy arrays to torch tensors, pinned, on a device.

The last room of the flow (``... -> batch -> collate -> device``), after MDNC's ``MTSequence``
converter:

- ``move_to_device`` (:class:`DeviceMoverIterDataPipe`): MTSequence's converter -- numpy
  arrays (in dicts, lists, tuples) become torch tensors, optionally pinned, and move to a
  device with ``non_blocking``. Runs on the CPU as it does on CUDA (:func:`to_device`).

The thread stages (``prefetch_in_thread``, ``map_in_threads``) are in
:mod:`speechpipe.pipes.concurrency._threads`.
"""

from __future__ import annotations

import warnings
from typing import Any, Iterable, Iterator, Mapping

import numpy as np
import torch

from .._core import functional_datapipe, IterDataPipe

__all__ = [
    "DeviceMover",
    "DeviceMoverIterDataPipe",
    "to_device",
]


def _pin(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.pin_memory() if tensor.device.type == "cpu" else tensor


def _to_tensor(array: np.ndarray) -> torch.Tensor | np.ndarray:
    dtype = array.dtype
    if dtype.kind not in "biufc":
        return array  # strings, objects: left as they are
    flags = array.flags  # a new object at each access
    if not (flags.writeable and flags.c_contiguous and dtype.isnative):
        # torch shares memory only with writable, native-order arrays; views of shard bytes are
        # read-only, so they are copied once here.
        array = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("="))
        if not array.flags.writeable:
            array = array.copy()
    return torch.from_numpy(array)


def to_device(
    obj: Any,
    device: str | torch.device | None = None,
    *,
    pin_memory: bool = False,
    non_blocking: bool = False,
) -> Any:
    """Numpy arrays in ``obj`` to torch tensors, pinned if asked, moved to ``device``.

    Walks dicts, lists and tuples (returning the same container types); numeric numpy arrays
    and numpy scalars become tensors (sharing memory when the array is writable and
    contiguous, else copied once), tensors are moved, anything else (str, int, None) stays.
    ``pin_memory`` pins CPU tensors (page-locked memory, needed for asynchronous copies to a
    GPU); ``non_blocking`` lets ``Tensor.to`` return before a copy from pinned memory ends.
    Both are harmless on the CPU: ``to_device(x, "cpu")`` moves nothing.

    >>> out = to_device({"feats": np.ones((2, 3), np.float32), "key": "u1"}, "cpu")
    >>> out["feats"].dtype, tuple(out["feats"].shape), out["key"]
    (torch.float32, (2, 3), 'u1')
    """
    if device is not None and not isinstance(device, torch.device):
        device = torch.device(device)
    return _convert(obj, device, pin_memory, non_blocking)


LEAVES = frozenset({str, int, float, bool, bytes, type(None)})


def _convert(obj: Any, device: torch.device | None, pin_memory: bool,
             non_blocking: bool) -> Any:
    kind = type(obj)
    if kind in LEAVES:
        return obj
    if kind is dict:  # a sample or a batch: its leaves and arrays without a call each
        out = {}
        for k, v in obj.items():
            kind = type(v)
            if kind in LEAVES:
                out[k] = v
            elif kind is np.ndarray and not pin_memory and (device is None
                                                            or device.type == "cpu"):
                out[k] = _to_tensor(v)  # a CPU tensor (or a non-numeric array, kept)
            else:
                out[k] = _convert(v, device, pin_memory, non_blocking)
        return out
    if isinstance(obj, torch.Tensor):
        tensor = obj
    elif isinstance(obj, np.ndarray):
        tensor = _to_tensor(obj)
        if not isinstance(tensor, torch.Tensor):
            return tensor
    elif isinstance(obj, np.generic) and obj.dtype.kind in "biufc":
        tensor = torch.from_numpy(np.asarray(obj))
    elif isinstance(obj, Mapping):
        return type(obj)({k: _convert(v, device, pin_memory, non_blocking)
                          for k, v in obj.items()})
    elif isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a namedtuple
        return kind(*(_convert(v, device, pin_memory, non_blocking) for v in obj))
    elif isinstance(obj, (list, tuple)):
        return kind(_convert(v, device, pin_memory, non_blocking) for v in obj)
    else:
        return obj
    if pin_memory:
        tensor = _pin(tensor)
    if device is not None and tensor.device != device:  # .to() costs even when a no-op
        tensor = tensor.to(device, non_blocking=non_blocking)
    return tensor


@functional_datapipe("move_to_device")
class DeviceMoverIterDataPipe(IterDataPipe):
    """Convert to torch tensors and move to a device (functional name: ``move_to_device``).

    Consumes samples or batches (dicts, lists, tuples of numpy arrays, tensors and other
    values) and yields the same structure with numeric numpy arrays as tensors (sharing
    memory where possible), pinned if ``pin_memory``, on ``device`` (see :func:`to_device`).
    Strings, ints and ``None`` pass unchanged. Place it last, in the process that owns the
    device -- the main process, after the DataLoader (``speechpipe.loader.build_loader(...,
    device=...)`` does this); in DataLoader workers keep tensors on the CPU.

    Args:
        source_datapipe: items.
        device: target device (``"cuda"``, ``"cuda:1"``, ``"cpu"``, a ``torch.device``), or
            None to only convert.
        pin_memory: pin CPU tensors before the move (page-locked memory, for asynchronous
            copies to a GPU). Without an accelerator it is ignored with a warning (once per
            pass), as torch's DataLoader does.
        non_blocking: pass ``non_blocking`` to ``Tensor.to``: from pinned memory the copy
            runs asynchronously on the current CUDA stream.

    >>> import numpy as np
    >>> from speechpipe import IterableWrapper
    >>> [batch] = IterableWrapper([{"feats": np.zeros((2, 4), np.float32)}]).move_to_device("cpu")
    >>> batch["feats"].device, batch["feats"].dtype
    (device(type='cpu'), torch.float32)
    """

    holds_nothing = True  # item by item: nothing kept between two yields

    def __init__(self, source_datapipe: Iterable, device: str | torch.device | None = None, *,
                 pin_memory: bool = False, non_blocking: bool = False) -> None:
        if device is not None:
            try:
                device = torch.device(device)
            except (RuntimeError, TypeError) as exc:
                raise ValueError(f"device must name a torch device, got {device!r}") from exc
        for name, value in (("pin_memory", pin_memory), ("non_blocking", non_blocking)):
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be a bool, got {value!r}")
        self.source_datapipe = source_datapipe
        self.device = device
        self.pin_memory = pin_memory
        self.non_blocking = non_blocking

    def __iter__(self) -> Iterator:
        pin = self.pin_memory and _can_pin()
        if self.pin_memory and not pin:
            warnings.warn("move_to_device: pin_memory=True but no accelerator is available; "
                          "tensors are not pinned", UserWarning, stacklevel=2)
        device, non_blocking = self.device, self.non_blocking
        for item in self.source_datapipe:
            yield _convert(item, device, pin, non_blocking)  # to_device, its checks done once

    def __len__(self) -> int:
        return len(self.source_datapipe)


def _can_pin() -> bool:
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "is_available"):
        return bool(accelerator.is_available())
    return torch.cuda.is_available()


DeviceMover = DeviceMoverIterDataPipe
