"""Features on the device (issue 20): SpecAugment and CMVN on the padded batch, after
``move_to_device`` and ``compute_features(batched=True)``, tested on the CPU device.

Invariant: a batch augmented and normalised on the device equals its samples augmented and
normalised one by one with the same seed, row by row over each row's ``feats_len`` frames; the
padding is never touched, and never enters a statistic.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import speechpipe  # noqa: F401  (registers the functional names)
from speechpipe.demo import DEMO_CORPUS
from speechpipe.errors import DataError
from speechpipe import ResumeWarning
from speechpipe.loader import PipeDataset
from speechpipe.pipes._core import IterableWrapper, SequenceWrapper
from speechpipe.pipes.audio import spec_augment, spec_augment_batch
from speechpipe.pipes.audio import CmvnStats, compute_cmvn_stats, normalize_batch
from speechpipe.pipes.collate import PadCollate
from speechpipe.pipes.batching import BatchView
from speechpipe.recipes.librispeech import librispeech_samples

PAD = 7.0  # a padding value no mask or normalisation writes


@pytest.fixture(scope="module")
def few():
    """Seven utterances of real recorded speech, of different lengths."""
    return sorted(librispeech_samples(DEMO_CORPUS), key=lambda s: s["key"])[::5]


@pytest.fixture(scope="module")
def stats(few):
    feats = IterableWrapper(few).compute_features("fbank", num_mel_bins=80)
    return compute_cmvn_stats(feats, progress=False)


def _on_device(samples, size: int = 3):
    """samples -> batch -> collate -> move_to_device("cpu") -> compute_features(batched=True)."""
    collate = PadCollate(fields=("key", "audio", "sample_rate"))
    return (IterableWrapper(samples, deepcopy=False).batch(size).collate(collate_fn=collate)
            .move_to_device("cpu").compute_features("fbank", batched=True, num_mel_bins=80))


def _rows(batches):
    return [(b["feats"][i], int(b["feats_len"][i])) for b in batches for i in range(len(b["key"]))]


@pytest.mark.parametrize("options", [
    {},
    {"time_warp": 5, "time_width": 30},
    {"mask_value": "mean", "freq_masks": 3, "time_masks": 4, "time_width": 0.1},
])
def test_device_pipeline_equals_the_per_utterance_pipeline_with_the_same_seed(few, stats,
                                                                               options):
    batches = list(_on_device(few).spec_augment(seed=4, batched=True, **options)
                   .apply_cmvn(stats, batched=True))
    singles = list(IterableWrapper(few, deepcopy=False)
                   .compute_features("fbank", num_mel_bins=80)
                   .spec_augment(seed=4, **options).apply_cmvn(stats))
    rows = _rows(batches)
    assert len(rows) == len(singles)
    for (row, n), single in zip(rows, singles):
        assert n == single["feats"].shape[0]
        assert torch.equal(row[:n], torch.from_numpy(single["feats"]))
    assert all(isinstance(b["feats"], torch.Tensor) for b in batches)


def test_after_build_loader_the_device_stages_run_on_the_loaders_batches(few, stats):
    # The training loop's road: workers decode and collate, build_loader moves each batch to
    # the device, the batched stages follow in the main process.
    from speechpipe.loader import build_loader

    collate = PadCollate(fields=("key", "audio", "sample_rate"))
    view = BatchView({s["key"]: len(s["audio"]) for s in few}, budget=40 * 16000, seed=2)
    pipe = (SequenceWrapper({s["key"]: s for s in few}).batch_by_view(view)
            .collate(collate_fn=collate))
    loader = build_loader(pipe, num_workers=0, device="cpu")
    on_device = IterableWrapper(loader, deepcopy=False)
    batches = list(on_device.compute_features("fbank", batched=True, num_mel_bins=80)
                   .spec_augment(seed=4, batched=True).apply_cmvn(stats, batched=True))
    order = [key for b in batches for key in b["key"]]
    assert sorted(order) == sorted(s["key"] for s in few)
    by_key = {s["key"]: s for s in few}
    singles = list(IterableWrapper([by_key[k] for k in order], deepcopy=False)
                   .compute_features("fbank", num_mel_bins=80).spec_augment(seed=4)
                   .apply_cmvn(stats))
    for (row, n), single in zip(_rows(batches), singles):
        assert torch.equal(row[:n], torch.from_numpy(single["feats"]))


def _padded_batch(lengths, dim: int = 40, seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    feats = torch.full((len(lengths), max(lengths) + 5, dim), PAD)
    for b, n in enumerate(lengths):
        feats[b, :n] = torch.randn(n, dim, generator=gen) * 3 + 1
    return {"key": [f"u{b}" for b in range(len(lengths))], "feats": feats,
            "feats_len": torch.tensor(lengths)}


def test_masks_stay_within_each_rows_length():
    # Wide masks on short rows: a mask computed on the padded width would reach the padding.
    lengths = [120, 30, 9, 1]
    batch = _padded_batch(lengths)
    for seed in range(20):
        [out] = IterableWrapper([batch]).spec_augment(
            freq_masks=2, freq_width=20, time_masks=4, time_width=60, seed=seed, batched=True)
        for b, n in enumerate(lengths):
            assert (out["feats"][b, n:] == PAD).all()
        assert (out["feats"][:, :max(lengths)] == 0).any()


@pytest.mark.parametrize("mask_value", [0.0, "mean"])
def test_the_accelerator_masking_equals_the_cpu_masking(monkeypatch, mask_value):
    # Off the CPU the masks are applied with one torch.where instead of slice by slice; the
    # same draws must give the same batch (the CPU path is the one compared with spec_augment).
    from speechpipe.pipes.audio import _augment as augment

    lengths = [120, 30, 9, 1]
    batch = _padded_batch(lengths)
    options = dict(freq_masks=2, freq_width=20, time_masks=4, time_width=60,
                   mask_value=mask_value)
    by_slices = [spec_augment_batch(batch["feats"], lengths, **options,
                                    generator=torch.Generator().manual_seed(s))
                 for s in range(10)]
    monkeypatch.setattr(augment, "_masked_by_slices", augment._masked_at_once)
    for seed, expected in enumerate(by_slices):
        got = spec_augment_batch(batch["feats"], lengths, **options,
                                 generator=torch.Generator().manual_seed(seed))
        assert torch.equal(got, expected), seed


def test_batched_spec_augment_same_seed_same_masks_other_epoch_other_masks():
    batch = _padded_batch([100, 80, 60])

    def masks(seed, epoch):
        pipe = IterableWrapper([batch]).spec_augment(seed=seed, batched=True)
        [out] = pipe.set_epoch(epoch)
        return out["feats"] == 0

    assert torch.equal(masks(1, 0), masks(1, 0))
    assert not torch.equal(masks(1, 0), masks(1, 1))
    assert not torch.equal(masks(1, 0), masks(2, 0))


def test_batched_spec_augment_keeps_numpy_batches_numpy_and_does_not_modify_its_input():
    batch = _padded_batch([50, 20])
    batch["feats"] = batch["feats"].numpy()
    before = batch["feats"].copy()
    [out] = IterableWrapper([batch]).spec_augment(mask_value=-5.0, batched=True)
    assert isinstance(out["feats"], np.ndarray) and out["feats"].dtype == np.float32
    assert (out["feats"] == -5.0).any()
    np.testing.assert_array_equal(batch["feats"], before)


@pytest.mark.parametrize("pad", [PAD, float("inf")])
def test_utterance_cmvn_statistics_come_from_the_real_frames_only(pad):
    lengths = [50, 20, 3]
    batch = _padded_batch(lengths)
    for b, n in enumerate(lengths):
        batch["feats"][b, n:] = pad
    [out] = IterableWrapper([batch]).apply_cmvn(utterance=True, batched=True)
    for b, n in enumerate(lengths):
        row = out["feats"][b, :n].double()
        torch.testing.assert_close(row.mean(0), torch.zeros(40, dtype=torch.float64),
                                   atol=1e-5, rtol=0)
        torch.testing.assert_close(row.var(0, unbiased=False),
                                   torch.ones(40, dtype=torch.float64), atol=1e-4, rtol=0)
        assert (out["feats"][b, n:] == pad).all()


def test_normalize_batch_with_global_stats_is_normalize_features_row_by_row():
    batch = _padded_batch([30, 12])
    stats = CmvnStats.empty(40)
    stats.update(batch["feats"][0, :30].numpy())
    out = normalize_batch(batch["feats"], [30, 12], stats, norm_vars=False)
    expected = batch["feats"][1, :12] - torch.from_numpy(stats.mean.astype(np.float32))
    assert torch.equal(out[1, :12], expected)
    assert (out[1, 12:] == PAD).all()


def test_spec_augment_batch_function_equals_spec_augment_per_row():
    batch = _padded_batch([90, 40, 2])
    g_batch, g_rows = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    out = spec_augment_batch(batch["feats"], [90, 40, 2], time_width=30, generator=g_batch)
    for b, n in enumerate([90, 40, 2]):
        assert torch.equal(out[b, :n], spec_augment(batch["feats"][b, :n], time_width=30,
                                                    generator=g_rows))


def test_a_resumed_pass_gives_the_same_batches_and_warns_that_the_draws_restart():
    """Resumable as the per-utterance stages: the batches resume exactly (same keys), the
    masks' draws restart, with the same ResumeWarning."""
    rng = np.random.default_rng(5)
    data = {f"v{i:03d}": {"key": f"v{i:03d}",
                          "feats": rng.standard_normal((int(rng.integers(20, 60)), 40))
                          .astype(np.float32)} for i in range(60)}

    def make():
        view = BatchView({k: len(s["feats"]) for k, s in data.items()}, budget=200, seed=4)
        return (SequenceWrapper(data).batch_by_view(view).collate(collate_fn=PadCollate())
                .move_to_device("cpu").spec_augment(seed=1, batched=True)
                .apply_cmvn(utterance=True, batched=True))

    full = [b["key"] for b in PipeDataset(make())]
    dataset = PipeDataset(make())
    it = iter(dataset)
    head = [next(it)["key"] for _ in range(3)]
    state = dataset.state_dict()
    it.close()
    again = PipeDataset(make())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again.load_state_dict(state)
        tail = [b["key"] for b in again]
    assert head + tail == full
    assert any(issubclass(w.category, ResumeWarning) and "SpecAugmenter" in str(w.message)
               for w in caught)


# ------------------------------------------------------------------------------ bad input


def test_a_batch_without_feats_len_names_its_first_key():
    batch = _padded_batch([10])
    del batch["feats_len"]
    with pytest.raises(DataError, match=r"\(key 'u0'\).*needs 'feats' and 'feats_len'"):
        list(IterableWrapper([batch]).spec_augment(batched=True))


def test_a_length_beyond_the_padded_frames_names_the_rows_key():
    batch = _padded_batch([10, 8])
    batch["feats_len"] = torch.tensor([10, 99])
    with pytest.raises(DataError, match=r"\(key 'u1'\).*'feats_len' 99 outside the 15"):
        list(IterableWrapper([batch]).apply_cmvn(utterance=True, batched=True))


def test_feats_that_are_not_a_3d_float_batch_are_refused():
    batch = {"key": ["u0"], "feats": torch.zeros(10, 40), "feats_len": torch.tensor([10])}
    with pytest.raises(DataError, match=r"must be a float \(batch, frames, dim\) tensor"):
        list(IterableWrapper([batch]).spec_augment(batched=True))


def test_batched_cmvn_refuses_a_dimension_other_than_the_statistics(stats):
    with pytest.raises(DataError, match=r"\(key 'u0'\).*dim 40, but the CMVN statistics have "
                                        r"dim 80"):
        list(IterableWrapper([_padded_batch([10])]).apply_cmvn(stats, batched=True))


def test_samples_given_to_a_batched_stage_are_refused():
    with pytest.raises(TypeError, match=r"expects collated batch dicts, got list"):
        list(IterableWrapper([[1, 2]]).spec_augment(batched=True))


@pytest.mark.parametrize("make", [
    lambda p: p.spec_augment(batched=1),
    lambda p: p.apply_cmvn(utterance=True, batched="yes"),
])
def test_batched_must_be_a_bool(make):
    with pytest.raises(TypeError, match="batched must be a bool"):
        make(IterableWrapper([]))


# ------------------------------------------------------------------- recipes: FrontEnd option


def _demo_rows():
    """Manifest rows of every fourth demo utterance (real recorded speech, FLAC)."""
    import soundfile

    rows = []
    for flac in sorted(Path(DEMO_CORPUS).rglob("*.flac"))[::4]:
        info = soundfile.info(str(flac))
        rows.append({"key": flac.stem, "audio_path": str(flac), "text": "x",
                     "duration": info.frames / info.samplerate})
    return rows


def test_a_recipe_with_features_on_the_device_gives_the_features_the_workers_give():
    from speechpipe.loader import build_loader
    from speechpipe.recipes import FrontEnd, train_pipeline

    rows = _demo_rows()
    in_workers = list(build_loader(train_pipeline([rows], budget=40.0, seed=3),
                                   num_workers=2, device="cpu"))
    loaded = list(build_loader(train_pipeline([rows], budget=40.0, seed=3,
                                              features_on="device"),
                               num_workers=2, device="cpu"))
    assert all("audio" in b and "feats" not in b for b in loaded)  # the workers only decoded
    batches = list(FrontEnd(features_on="device").on_device(loaded, seed=3))
    assert [b["key"] for b in batches] == [b["key"] for b in in_workers]
    for ours, theirs in zip(batches, in_workers):
        assert "audio" not in ours
        assert torch.equal(ours["feats_len"], theirs["feats_len"])
        torch.testing.assert_close(ours["feats"], theirs["feats"], rtol=1e-5, atol=1e-5)


def test_features_on_must_name_workers_or_the_device():
    from speechpipe.recipes import FrontEnd

    with pytest.raises(ValueError, match=r"features_on must be one of \('workers', 'device'\)"):
        FrontEnd(features_on="gpu")
