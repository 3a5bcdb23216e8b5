"""Field-wise padded collation: PadCollate and the pad/stack/list field functions.

Invariant: for each padded field, ``batch[name][i, :batch[name_len][i]]`` equals sample ``i``'s
array and every position after it equals the field's pad value; nothing else is in the batch
besides the samples' fields (minus ``drop``) and one ``_len`` per padded field.
"""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from speechpipe.errors import DataError
from speechpipe.pipes._core import IterableWrapper
from speechpipe.pipes.collate import (
    PadCollate,
    list_field,
    pad_collate,
    pad_field,
    stack_field,
)


def _asr_samples(n=3, dim=4):
    """Samples with audio, feats, tokens, text and scalars; lengths grow with the index."""
    rng = np.random.default_rng(0)
    return [
        {
            "key": f"utt{i}",
            "audio": rng.standard_normal(100 + 10 * i).astype(np.float32),
            "sample_rate": 16000,
            "feats": rng.standard_normal((5 + i, dim)).astype(np.float32),
            "tokens": np.arange(1, 3 + i, dtype=np.int64),
            "text": f"text {i}",
            "duration": 0.5 + i,
        }
        for i in range(n)
    ]


# --- shapes, padding, lengths ----------------------------------------------------------------

def test_audio_is_padded_to_batch_by_time_with_exact_lengths():
    samples = _asr_samples()
    batch = PadCollate()(samples)
    assert batch["audio"].shape == (3, 120)
    assert batch["audio_len"].tolist() == [100, 110, 120]
    assert batch["audio_len"].dtype == torch.int64
    for i, s in enumerate(samples):
        n = len(s["audio"])
        assert np.array_equal(batch["audio"][i, :n].numpy(), s["audio"])
        assert torch.all(batch["audio"][i, n:] == 0)


def test_feats_are_padded_to_batch_time_dim():
    samples = _asr_samples(dim=7)
    batch = PadCollate()(samples)
    assert batch["feats"].shape == (3, 7, 7)
    assert batch["feats_len"].tolist() == [5, 6, 7]
    assert np.array_equal(batch["feats"][0, :5].numpy(), samples[0]["feats"])
    assert torch.all(batch["feats"][0, 5:] == 0)


def test_tokens_are_padded_with_minus_one_by_default():
    batch = PadCollate()(_asr_samples())
    assert batch["tokens"].tolist() == [[1, 2, -1, -1], [1, 2, 3, -1], [1, 2, 3, 4]]
    assert batch["tokens_len"].tolist() == [2, 3, 4]


def test_pad_values_set_per_field_and_merge_with_default():
    batch = PadCollate(pad_values={"feats": -80.0})(_asr_samples())
    assert torch.all(batch["feats"][0, 5:] == -80.0)
    assert batch["tokens"][0, -1].item() == -1  # the tokens default still applies
    assert PadCollate(pad_values={"tokens": 0})(_asr_samples())["tokens"][0, -1].item() == 0


def test_batch_fields_keep_sample_order_with_len_after_each_padded_field():
    batch = PadCollate()(_asr_samples())
    assert list(batch) == [
        "key", "audio", "audio_len", "sample_rate", "feats", "feats_len",
        "tokens", "tokens_len", "text", "duration",
    ]


# --- dtypes -------------------------------------------------------------------------------

def test_source_dtypes_are_kept():
    samples = [
        {"key": "a", "f32": np.ones(3, np.float32), "f64": np.ones(2), "i32": np.ones(2, np.int32)},
        {"key": "b", "f32": np.ones(1, np.float32), "f64": np.ones(4), "i32": np.ones(5, np.int32)},
    ]
    batch = PadCollate()(samples)
    assert batch["f32"].dtype == torch.float32
    assert batch["f64"].dtype == torch.float64
    assert batch["i32"].dtype == torch.int32


def test_dtype_casts_floating_fields_only():
    samples = _asr_samples()
    for s in samples:
        s["feats"] = s["feats"].astype(np.float64)
    batch = PadCollate(dtype=torch.float32)(samples)
    assert batch["feats"].dtype == torch.float32
    assert batch["duration"].dtype == torch.float32
    assert batch["tokens"].dtype == torch.int64
    assert batch["sample_rate"].dtype == torch.int64


def test_mixed_input_dtypes_are_promoted():
    padded, _ = pad_field([np.array([1, 2], np.int32), torch.tensor([1.5])])
    assert padded.dtype == torch.float32
    assert padded.tolist() == [[1.0, 2.0], [1.5, 0.0]]


def test_pad_field_dtype_argument_sets_the_output_dtype():
    padded, _ = pad_field([np.array([1, 2]), np.array([3])], dtype=torch.float16)
    assert padded.dtype == torch.float16
    assert padded.tolist() == [[1.0, 2.0], [3.0, 0.0]]


# --- scalars, strings, objects --------------------------------------------------------------

def test_scalars_become_one_dimensional_tensors():
    samples = [
        {"key": "a", "n": 3, "x": 0.5, "ok": True, "f": np.float32(2.5)},
        {"key": "b", "n": 4, "x": 1.0, "ok": False, "f": np.float32(1.0)},
    ]
    batch = PadCollate()(samples)
    assert batch["n"].tolist() == [3, 4] and batch["n"].dtype == torch.int64
    assert batch["x"].tolist() == [0.5, 1.0] and batch["x"].dtype == torch.float64
    assert batch["ok"].tolist() == [True, False] and batch["ok"].dtype == torch.bool
    assert batch["f"].tolist() == [2.5, 1.0] and batch["f"].dtype == torch.float32
    assert "n_len" not in batch


def test_strings_none_and_objects_stay_lists():
    samples = [
        {"key": "a", "text": "hello", "speaker": None, "meta": {"x": 1}},
        {"key": "b", "text": "world", "speaker": "s2", "meta": {"x": 2}},
    ]
    batch = PadCollate()(samples)
    assert batch == {
        "key": ["a", "b"],
        "text": ["hello", "world"],
        "speaker": [None, "s2"],
        "meta": [{"x": 1}, {"x": 2}],
    }


def test_list_field_returns_a_list():
    assert list_field(("a", "b")) == ["a", "b"]


# --- options ------------------------------------------------------------------------------

def test_stack_option_stacks_fixed_size_arrays_without_lengths():
    samples = [{"key": k, "xvector": np.full(5, i, np.float32)} for i, k in enumerate("abc")]
    batch = PadCollate(stack=("xvector",))(samples)
    assert batch["xvector"].shape == (3, 5)
    assert batch["xvector"][:, 0].tolist() == [0.0, 1.0, 2.0]
    assert "xvector_len" not in batch


def test_as_list_keeps_arrays_as_a_list():
    samples = _asr_samples()
    batch = PadCollate(as_list=("audio",))(samples)
    assert isinstance(batch["audio"], list) and batch["audio"][1] is samples[1]["audio"]
    assert "audio_len" not in batch


def test_drop_leaves_fields_out():
    batch = PadCollate(drop=("audio", "text"))(_asr_samples())
    assert "audio" not in batch and "audio_len" not in batch and "text" not in batch
    assert "feats" in batch


def test_fields_restricts_and_orders_the_batch():
    batch = PadCollate(fields=("tokens", "key"))(_asr_samples())
    assert list(batch) == ["tokens", "tokens_len", "key"]


def test_field_named_in_pad_values_is_padded_even_as_lists():
    samples = [{"key": "a", "ids": [1, 2, 3]}, {"key": "b", "ids": [4]}]
    assert PadCollate()(samples)["ids"] == [[1, 2, 3], [4]]  # lists stay lists by default
    batch = PadCollate(pad_values={"ids": 0})(samples)
    assert batch["ids"].tolist() == [[1, 2, 3], [4, 0, 0]]
    assert batch["ids_len"].tolist() == [3, 1]


def test_pad_field_accepts_tensors_and_lists():
    padded, lengths = pad_field([torch.tensor([1.0, 2.0]), [3.0], []], pad_value=9)
    assert padded.tolist() == [[1.0, 2.0], [3.0, 9.0], [9.0, 9.0]]
    assert lengths.tolist() == [2, 1, 0]


def test_read_only_and_big_endian_arrays_are_copied_without_warning():
    read_only = np.frombuffer(np.arange(4, dtype=np.float32).tobytes(), dtype=np.float32)
    big_endian = np.arange(2, dtype=">f4")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        padded, lengths = pad_field([read_only, big_endian])
    assert padded.tolist() == [[0, 1, 2, 3], [0, 1, 0, 0]]
    assert lengths.tolist() == [4, 2]


def test_pad_collate_function_is_the_one_call_form():
    samples = _asr_samples()
    expected = PadCollate(drop=("audio",))(samples)
    got = pad_collate(samples, drop=("audio",))
    assert list(got) == list(expected)
    assert torch.equal(got["feats"], expected["feats"])


# --- errors -------------------------------------------------------------------------------

def test_empty_batch_raises_value_error():
    with pytest.raises(ValueError, match="empty batch"):
        PadCollate()([])


def test_missing_field_names_the_field_and_the_keys_lacking_it():
    samples = _asr_samples(4)
    del samples[1]["tokens"]
    del samples[3]["tokens"]
    with pytest.raises(DataError) as info:
        PadCollate()(samples)
    message = str(info.value)
    assert "'tokens'" in message
    assert "['utt1', 'utt3']" in message
    assert info.value.key == "utt1"


def test_extra_field_in_a_later_sample_names_the_keys_lacking_it():
    samples = _asr_samples(3)
    samples[2]["speaker"] = "s1"
    with pytest.raises(DataError) as info:
        PadCollate()(samples)
    assert "'speaker'" in str(info.value) and "['utt0', 'utt1']" in str(info.value)


def test_requested_field_missing_from_all_samples_raises():
    with pytest.raises(DataError, match="'lang' is missing from 3 of 3"):
        PadCollate(fields=("key", "lang"))(_asr_samples())


def test_dropped_field_may_be_missing():
    samples = _asr_samples()
    del samples[0]["text"]
    assert "text" not in PadCollate(drop=("text",))(samples)


def test_trailing_dim_mismatch_names_field_and_keys():
    samples = _asr_samples(3, dim=80)
    samples[2]["feats"] = np.zeros((5, 40), np.float32)
    with pytest.raises(DataError) as info:
        PadCollate()(samples)
    message = str(info.value)
    assert "'feats'" in message and "trailing dims" in message
    assert "(80,) in ['utt0', 'utt1']" in message
    assert "(40,) in ['utt2']" in message


def test_stack_shape_mismatch_names_keys():
    samples = [{"key": "a", "v": np.zeros(3)}, {"key": "b", "v": np.zeros(4)}]
    with pytest.raises(DataError, match=r"'v'.*\(3,\) in \['a'\]; \(4,\) in \['b'\]"):
        PadCollate(stack=("v",))(samples)


def test_none_among_arrays_names_the_key():
    samples = _asr_samples()
    samples[1]["feats"] = None
    with pytest.raises(DataError) as info:
        PadCollate()(samples)
    assert info.value.key == "utt1" and "'feats'" in str(info.value)


def test_scalar_in_a_padded_field_is_an_error():
    with pytest.raises(DataError, match="no time axis"):
        pad_field([np.zeros(3), np.float32(1.0)], keys=["a", "b"])


def test_string_array_is_an_error():
    with pytest.raises(DataError, match="non-numeric dtype"):
        pad_field([np.array(["a", "b"])], name="text", keys=["u1"])


def test_samples_without_keys_are_named_by_position():
    with pytest.raises(DataError) as info:
        stack_field([np.zeros(2), np.zeros(3)], name="v")
    assert "batch item 1" in str(info.value) and "[#0]" in str(info.value)


def test_existing_len_field_is_not_overwritten():
    samples = [
        {"key": "a", "x": np.zeros(2), "x_len": 5},
        {"key": "b", "x": np.zeros(1), "x_len": 4},
    ]
    with pytest.raises(DataError, match="'x_len' would be overwritten"):
        PadCollate()(samples)


def test_pad_value_that_does_not_fit_an_integer_field_raises():
    with pytest.raises(ValueError, match="pad value 0.5 for field 'tokens'"):
        pad_field([np.array([1, 2])], pad_value=0.5, name="tokens")


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"pad_values": [("tokens", -1)]}, TypeError),
        ({"pad_values": {"tokens": "-1"}}, TypeError),
        ({"stack": "xvector"}, TypeError),
        ({"drop": [1]}, TypeError),
        ({"stack": ("a",), "as_list": ("a",)}, ValueError),
        ({"fields": ("a",), "drop": ("a",)}, ValueError),
        ({"pad_values": {"a": 0}, "stack": ("a",)}, ValueError),
        ({"dtype": torch.int64}, ValueError),
        ({"dtype": "float32"}, TypeError),
    ],
)
def test_constructor_rejects_bad_arguments(kwargs, error):
    with pytest.raises(error):
        PadCollate(**kwargs)


def test_non_dict_samples_raise_type_error():
    with pytest.raises(TypeError, match="sample dicts"):
        PadCollate()([np.zeros(3)])


# --- inside torch -------------------------------------------------------------------------

def test_pad_collate_pickles_and_behaves_the_same():
    collate = PadCollate(pad_values={"feats": -1.0}, drop=("audio",), dtype=torch.float32)
    clone = pickle.loads(pickle.dumps(collate))
    samples = _asr_samples()
    a, b = collate(samples), clone(samples)
    assert list(a) == list(b)
    assert all(torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k]
               for k in a)


def test_works_as_collate_fn_of_torch_collate_stage():
    samples = _asr_samples(7)
    pipe = IterableWrapper(samples).batch(3).collate(collate_fn=PadCollate(drop=("audio",)))
    batches = list(pipe)
    assert [b["key"] for b in batches] == [["utt0", "utt1", "utt2"], ["utt3", "utt4", "utt5"],
                                          ["utt6"]]
    assert batches[1]["tokens"].shape == (3, 7)  # utt5 has 7 tokens
    assert batches[2]["feats"].shape == (1, 11, 4)
    assert list(pipe)[0]["key"] == ["utt0", "utt1", "utt2"]  # a second epoch


def test_works_in_dataloader_workers():
    # spawn pickles the pipe (with its PadCollate) into each worker: this checks picklability
    samples = _asr_samples(8)
    pipe = (
        IterableWrapper(samples)
        .sharding_filter()
        .batch(2)
        .collate(collate_fn=PadCollate(drop=("audio",)))
    )
    loader = torch.utils.data.DataLoader(
        pipe, batch_size=None, num_workers=2, multiprocessing_context="spawn"
    )
    batches = list(loader)
    keys = sorted(k for b in batches for k in b["key"])
    assert keys == sorted(s["key"] for s in samples)
    for b in batches:
        assert b["tokens"].shape[0] == 2
        for i, key in enumerate(b["key"]):
            n = b["tokens_len"][i].item()
            expected = torch.from_numpy(samples[int(key[3:])]["tokens"])
            assert torch.equal(b["tokens"][i, :n], expected)


# --- property -----------------------------------------------------------------------------

_dtypes = st.sampled_from([np.float32, np.float64, np.int64, np.int16])


@st.composite
def _variable_length_arrays(draw):
    dtype = draw(_dtypes)
    trailing = draw(st.sampled_from([(), (1,), (3,), (2, 2)]))
    lengths = draw(st.lists(st.integers(0, 12), min_size=1, max_size=6))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    arrays = [(rng.standard_normal((n, *trailing)) * 100).astype(dtype) for n in lengths]
    pad_value = draw(st.sampled_from([0, -1, 7]))
    return arrays, pad_value


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_variable_length_arrays())
def test_padded_batch_unpads_to_inputs_and_pads_with_pad_value(case):
    arrays, pad_value = case
    samples = [{"key": f"u{i}", "x": a} for i, a in enumerate(arrays)]
    batch = PadCollate(pad_values={"x": pad_value})(samples)
    padded, lengths = batch["x"], batch["x_len"]
    assert padded.shape == (len(arrays), max(len(a) for a in arrays), *arrays[0].shape[1:])
    assert padded.dtype == torch.from_numpy(arrays[0]).dtype
    assert lengths.tolist() == [len(a) for a in arrays]
    for i, a in enumerate(arrays):
        assert np.array_equal(padded[i, : len(a)].numpy(), a)
        assert torch.all(padded[i, len(a):] == pad_value)


class _CollatingWorker(torch.utils.data.IterableDataset):
    """Collates in a DataLoader worker and reports whether the batch was born shared."""

    def __init__(self, samples):
        self.samples = samples

    def __iter__(self):
        batch = PadCollate(pad_values={"tokens": -1})(self.samples)
        yield {"batch": batch, "shared": {k: v.is_shared() for k, v in batch.items()
                                          if isinstance(v, torch.Tensor)}}


def test_in_a_dataloader_worker_batches_are_allocated_in_shared_memory():
    rng = np.random.default_rng(0)
    samples = [{"key": f"u{i}", "feats": rng.standard_normal((n, 3)).astype(np.float32),
                "tokens": np.arange(i + 1), "duration": 0.5 * n}
               for i, n in enumerate((5, 2, 7))]
    [out] = torch.utils.data.DataLoader(_CollatingWorker(samples), batch_size=None,
                                        num_workers=1)
    assert out["shared"]["feats"] and out["shared"]["tokens"]  # the padded (large) fields
    here = PadCollate(pad_values={"tokens": -1})(samples)
    assert not here["feats"].is_shared()  # in the main process: ordinary memory
    for name in ("feats", "feats_len", "tokens", "tokens_len", "duration"):
        assert torch.equal(out["batch"][name], here[name]), name
    assert out["batch"]["tokens"][1].tolist() == [0, 1, -1]  # padding filled


def _vocab_pad(values):
    """A vocabulary's own padding: id 0 is its <pad>, and a mask instead of lengths."""
    longest = max(len(v) for v in values)
    ids = torch.zeros(len(values), longest, dtype=torch.long)
    for i, v in enumerate(values):
        ids[i, :len(v)] = torch.as_tensor(v)
    return {"ids": ids, "mask": ids != 0}


def test_a_field_can_have_the_users_own_collate_function():
    # Issue 32.12: PadCollate padded, stacked or listed a field, with a pad value per field,
    # but took no function of the user's (Parakeet's per-field collate functions).
    import pickle

    samples = [{"key": "a", "phones": [3, 4, 5], "audio": np.ones(2, np.float32)},
               {"key": "b", "phones": [6], "audio": np.ones(3, np.float32)}]
    collate = PadCollate(collate_fns={"phones": _vocab_pad})
    batch = collate(samples)
    assert list(batch) == ["key", "phones", "audio", "audio_len"]
    assert batch["phones"]["ids"].tolist() == [[3, 4, 5], [6, 0, 0]]
    assert batch["phones"]["mask"].sum().item() == 4
    again = pickle.loads(pickle.dumps(collate))(samples)  # workers receive it
    assert torch.equal(again["phones"]["ids"], batch["phones"]["ids"])
    with pytest.raises(ValueError, match=r"fields \['phones'\] have a collate function and "
                                         r"are also in pad_values"):
        PadCollate(collate_fns={"phones": _vocab_pad}, pad_values={"phones": 0})
    with pytest.raises(TypeError, match="collate_fns must map field names to functions"):
        PadCollate(collate_fns={"phones": 3})
