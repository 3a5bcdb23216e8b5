"""Reading Kaldi arks in sequence: iter_ark (speechpipe.pipes.kaldi._ark).

Arks are written with kaldiio.save_ark. Invariants: an ark cut between objects reads the
objects before the cut, as float32 (frames, dim); an object that is not a numeric matrix, a
truncated ark and random bytes raise a DataError naming the ark (and the key), never anything
else; an object header is refused (or accepted) alike by iter_ark and by read_matrix at an
offset, which share one header parser.
"""

from __future__ import annotations

import io
import struct

import kaldiio
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from speechpipe.errors import DataError, UnsafeInputError
from speechpipe.pipes.kaldi import iter_ark
from speechpipe.pipes.kaldi import read_matrix


@pytest.mark.parametrize("kind, value, match", [
    ("vector", np.zeros(4, np.float32), "vector"),
    ("int vector", np.zeros(4, np.int32), "integer vector"),
])
def test_an_ark_object_that_is_not_a_matrix_is_named(tmp_path, kind, value, match):
    ark = str(tmp_path / "v.ark")
    kaldiio.save_ark(ark, {"u1": np.zeros((2, 2), np.float32), "u2": value})
    with pytest.raises(DataError, match=match) as exc_info:
        list(iter_ark(open_buffered(ark), source=ark))
    assert ark in str(exc_info.value) and "(key 'u2')" in str(exc_info.value)


def open_buffered(path):
    with open(path, "rb") as f:
        return io.BytesIO(f.read())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_random_bytes_as_an_ark_give_only_documented_errors(data):
    try:
        for key, matrix in iter_ark(io.BytesIO(data), source="r.ark"):
            assert matrix.ndim == 2 and matrix.dtype == np.float32
    except DataError as err:  # includes UnsafeInputError
        assert str(err).startswith("r.ark")


@settings(max_examples=40, deadline=None)
@given(st.integers(min_value=0, max_value=10_000))
def test_every_truncation_of_an_ark_is_detected(cut):
    mats = {"a": np.ones((3, 4), np.float32), "b": np.ones((2, 4), np.float64)}
    buf, first = io.BytesIO(), io.BytesIO()
    kaldiio.save_ark(buf, mats)
    kaldiio.save_ark(first, {"a": mats["a"]})
    data = buf.getvalue()
    cut = cut % (len(data) + 1)
    ends = {0: [], len(first.getvalue()): ["a"], len(data): ["a", "b"]}  # between objects
    if cut in ends:
        assert [k for k, _ in iter_ark(io.BytesIO(data[:cut]))] == ends[cut]
    else:
        with pytest.raises(DataError, match="truncated ark"):
            list(iter_ark(io.BytesIO(data[:cut]), source="t.ark"))


@pytest.mark.parametrize("header, error, match", [
    (b"PKL", UnsafeInputError, "never unpickles"),
    (b"RIFF\x24\x00\x00\x00WAVE", DataError, "holds audio"),
    (b"\x00B\x04\x04\x02\x00\x00\x00", DataError, "integer vector"),
    (b"\x00BFM \x04" + struct.pack("<i", -1) + b"\x04" + struct.pack("<i", 2), DataError,
     "negative size -1 x 2"),
    (b"\x00BFM \x05" + struct.pack("<i", 1) + b"\x04" + struct.pack("<i", 2), DataError,
     "bad size marker"),
    (b"\x00BXM \x04", DataError, "unsupported binary object type 'XM'"),
    (b"\x00BCM2 " + struct.pack("<ffii", 0.0, 1.0, 30, 2), DataError, "truncated"),
    (b"NPY\x09", DataError, "bad NPY length header"),
])
def test_both_readers_refuse_a_bad_header_alike(tmp_path, header, error, match):
    ark = tmp_path / "bad.ark"
    ark.write_bytes(b"u1 " + header + b"\x00" * 8)
    with pytest.raises(error, match=match) as streamed:
        list(iter_ark(io.BytesIO(ark.read_bytes()), source=str(ark)))
    assert "(key 'u1')" in str(streamed.value)
    with pytest.raises(error, match=match) as at_offset:
        read_matrix(f"{ark}:3", source="feats.scp", line=1, key="u1")
    assert str(at_offset.value).startswith(f"feats.scp:1 (key 'u1'): {ark}:3")


def test_a_valid_ark_reads_alike_in_sequence_and_at_offsets(tmp_path):
    mats = {"a": np.arange(6, dtype=np.float32).reshape(3, 2), "b": np.ones((1, 4)),
            "c": np.zeros((0, 2), np.float32)}
    ark, scp = tmp_path / "raw.ark", tmp_path / "feats.scp"
    kaldiio.save_ark(str(ark), mats, scp=str(scp))
    streamed = list(iter_ark(io.BytesIO(ark.read_bytes())))
    assert [k for k, _ in streamed] == ["a", "b", "c"]
    for (key, matrix), line in zip(streamed, scp.read_text().splitlines()):
        assert line.split()[0] == key
        np.testing.assert_array_equal(matrix, read_matrix(line.split()[1]))
        assert matrix.dtype == np.float32
