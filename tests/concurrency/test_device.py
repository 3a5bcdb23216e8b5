"""The device converter (speechpipe.pipes.concurrency._device).

Invariants: numeric numpy arrays become torch tensors in the same containers (sharing memory
with writable arrays), other values pass unchanged; the move to a device passes
``non_blocking``; pinning without an accelerator warns and pins nothing; the constructor
validates its arguments.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import speechpipe  # noqa: F401  (registers the pipes)
from speechpipe.pipes._core import IterableWrapper
from speechpipe.pipes.concurrency import DeviceMover, to_device


def test_to_device_converts_arrays_in_nested_containers_and_keeps_the_rest():
    batch = {"feats": np.arange(6, dtype=np.float32).reshape(2, 3), "key": ["a", "b"],
             "n": (np.int64(3), np.array([1, 2], np.int64)), "text": "hi", "none": None}
    out = to_device(batch, "cpu")
    assert isinstance(out["feats"], torch.Tensor) and out["feats"].dtype == torch.float32
    assert out["feats"].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert out["key"] == ["a", "b"] and out["text"] == "hi" and out["none"] is None
    assert isinstance(out["n"], tuple) and out["n"][0].item() == 3
    assert out["n"][1].dtype == torch.int64


def test_to_device_shares_memory_with_writable_arrays_and_copies_read_only_ones():
    array = np.zeros(4, np.float32)
    assert to_device(array).data_ptr() == array.ctypes.data
    frozen = np.frombuffer(np.ones(4, np.float32).tobytes(), np.float32)  # read-only view
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns about non-writable arrays: not here
        tensor = to_device(frozen)
    assert tensor.tolist() == [1, 1, 1, 1]


def test_to_device_moves_to_the_device_with_non_blocking(monkeypatch):
    calls = []
    original = torch.Tensor.to

    def spy(self, *args, **kwargs):
        calls.append((args, kwargs))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", spy)
    out = to_device({"feats": np.ones((2, 2), np.float32)}, "meta", non_blocking=True)
    assert out["feats"].device.type == "meta"
    assert calls == [((torch.device("meta"),), {"non_blocking": True})] or \
        calls == [(("meta",), {"non_blocking": True})]


def test_move_to_device_pipe_on_cpu():
    data = [{"key": "u1", "feats": np.ones((3, 2), np.float32)}]
    [out] = IterableWrapper(data).move_to_device("cpu", non_blocking=True)
    assert out["feats"].device == torch.device("cpu") and out["key"] == "u1"
    assert len(DeviceMover(IterableWrapper(data), None)) == 1


def test_pin_memory_without_an_accelerator_warns_and_leaves_tensors_unpinned(monkeypatch):
    import speechpipe.pipes.concurrency._device as device

    monkeypatch.setattr(device, "_can_pin", lambda: False)
    pipe = IterableWrapper([{"x": np.ones(2, np.float32)}]).move_to_device("cpu",
                                                                           pin_memory=True)
    with pytest.warns(UserWarning, match="no accelerator"):
        [out] = list(pipe)
    assert not out["x"].is_pinned()


@pytest.mark.parametrize("make, message", [
    (lambda: DeviceMover(IterableWrapper([1]), "gpu7"), "device must name a torch device"),
    (lambda: DeviceMover(IterableWrapper([1]), "cpu", pin_memory="yes"),
     "pin_memory must be a bool"),
])
def test_arguments_are_validated_in_the_constructor(make, message):
    with pytest.raises((ValueError, TypeError), match=message):
        make()
