"""speechpipe.pipes.audio._channels: exact against the references, seeded, picklable.

Invariants:
- with dither 0, every stage yields the numbers of the torchaudio function it wraps, called
  directly on the same audio (``torch.equal``, not ``allclose``);
- random stages draw from ``(seed, epoch, rank, worker)`` only: same seed and epoch -> same
  output; another epoch -> other output; torch's global RNG is neither read nor advanced;
- frame counts are known from sample counts before computing (``num_frames``).

Audio is the shipped demo corpus (16 kHz FLAC speech, LibriSpeech layout).
"""

from __future__ import annotations

import argparse
import json
import math
import pickle
import types
import warnings

import kaldiio
import numpy as np
import pytest
import soundfile
import torch
import torchaudio.functional as taF
import torchaudio.transforms as taT
from torchaudio.compliance import kaldi

import speechpipe  # noqa: F401  (registers the functional names)
from speechpipe.cli.cmvn import add_command as add_cmvn_command
from speechpipe.demo import DEMO_CORPUS
from speechpipe.diagnostics import SkippedInputWarning
from speechpipe.errors import DataError, MissingDataError
from speechpipe.pipes._core import IterableWrapper
from speechpipe.pipes.audio import resample_audio
from speechpipe.pipes.audio import change_speed, spec_augment, time_warp
from speechpipe.pipes.audio import CmvnStats, compute_cmvn_stats, normalize_features
from speechpipe.pipes.collate import PadCollate
from speechpipe.pipes.audio import (
    batch_features, compute_features, FeatureComputer, KALDI_SCALE, mel_num_frames, num_frames,
)
from speechpipe.recipes.librispeech import librispeech_samples
from speechpipe.seeding import derive_seed


@pytest.fixture(scope="module")
def corpus():
    """The demo corpus's 36 utterances: key, text, speaker, audio (float32), sample_rate."""
    return list(librispeech_samples(DEMO_CORPUS))


@pytest.fixture(scope="module")
def few(corpus):
    """Six utterances of different lengths (fast enough for every test)."""
    return sorted(corpus, key=lambda s: s["key"])[::6]


def _pipe(samples):
    return IterableWrapper(samples, deepcopy=False)


def _wave(sample):
    return torch.from_numpy(sample["audio"])


def _global_rng_untouched(fn):
    torch.manual_seed(1234)
    expected = torch.rand(3)
    torch.manual_seed(1234)
    result = fn()
    assert torch.equal(torch.rand(3), expected), "the stage used torch's global generator"
    return result


# ------------------------------------------------------------------------------- resample


@pytest.mark.parametrize("new_rate", [8000, 22050])
def test_resample_equals_torchaudio_functional_resample(few, new_rate):
    out = list(_pipe(few).resample(new_rate))
    for sample, got in zip(few, out):
        expected = taF.resample(_wave(sample), 16000, new_rate)
        assert torch.equal(torch.from_numpy(got["audio"]), expected)
        assert got["sample_rate"] == new_rate
        assert got["audio"].dtype == np.float32


def test_resample_at_the_same_rate_passes_samples_through_unchanged(few):
    out = list(_pipe(few).resample(16000))
    assert all(a is b for a, b in zip(out, few))
    assert resample_audio(few[0]["audio"], 16000, 16000) is few[0]["audio"]


def test_resample_keeps_channels_time_first_and_does_not_mutate_the_input(few):
    stereo = np.stack([few[0]["audio"], -few[0]["audio"]], axis=1)
    sample = {"key": "s", "audio": stereo, "sample_rate": 16000}
    [got] = _pipe([sample]).resample(8000)
    expected = taF.resample(torch.from_numpy(stereo.T.copy()), 16000, 8000)
    assert got["audio"].shape == (expected.shape[1], 2)
    assert torch.equal(torch.from_numpy(got["audio"].T.copy()), expected)
    assert sample["sample_rate"] == 16000 and sample["audio"] is stereo


def test_resample_kernels_are_per_source_rate_and_reused_across_passes(few):
    rates = [16000, 22050, 16000, 44100, 22050, 16000]
    mixed = [dict(sample, sample_rate=rate) for sample, rate in zip(few, rates)]
    pipe = _pipe(mixed).resample(8000)
    first, second = list(pipe), list(pipe)
    for sample, a, b in zip(mixed, first, second):
        expected = taF.resample(_wave(sample), sample["sample_rate"], 8000)
        assert torch.equal(torch.from_numpy(a["audio"]), expected)
        assert np.array_equal(a["audio"], b["audio"]) and a["sample_rate"] == 8000


def test_resample_of_a_sample_without_audio_names_the_key():
    with pytest.raises(DataError, match=r"\(key 'u9'\).*no 'audio' field"):
        list(_pipe([{"key": "u9", "sample_rate": 16000}]).resample(8000))


def test_resample_of_a_sample_without_rate_names_the_key():
    with pytest.raises(DataError, match=r"\(key 'u9'\).*no 'sample_rate' field"):
        list(_pipe([{"key": "u9", "audio": np.zeros(10, np.float32)}]).resample(8000))


def test_resample_of_integer_audio_names_the_key():
    sample = {"key": "u9", "audio": np.zeros(10, np.int16), "sample_rate": 16000}
    with pytest.raises(DataError, match=r"\(key 'u9'\).*floating-point"):
        list(_pipe([sample]).resample(8000))


@pytest.mark.parametrize("kwargs, error", [
    ({"rate": 0}, ValueError), ({"rate": 16000.0}, TypeError),
    ({"rate": 8000, "rolloff": 1.5}, ValueError),
    ({"rate": 8000, "resampling_method": "linear"}, ValueError),
    ({"rate": 8000, "lowpass_filter_width": 0}, ValueError),
])
def test_resample_rejects_bad_arguments_in_the_constructor(kwargs, error):
    with pytest.raises(error):
        _pipe([]).resample(**kwargs)


# ------------------------------------------------------------------------------ features


def test_num_frames_equals_kaldi_output_for_many_lengths():
    rng = np.random.default_rng(0)
    lengths = sorted(set(rng.integers(200, 6000, 60).tolist()) | {400, 401, 559, 560, 561})
    for rate, length_ms, shift_ms in [(16000, 25.0, 10.0), (8000, 25.0, 10.0),
                                      (16000, 20.0, 7.5), (22050, 32.0, 12.0)]:
        window = int(rate * length_ms * 0.001)
        for snip in (True, False):
            for n in lengths:
                if n < window:
                    continue  # Kaldi refuses audio shorter than one window
                out = kaldi.fbank(torch.zeros(1, n), sample_frequency=rate, num_mel_bins=10,
                                  frame_length=length_ms, frame_shift=shift_ms, snip_edges=snip)
                assert num_frames(n, length_ms, shift_ms, rate, snip) == out.shape[0], (
                    rate, length_ms, shift_ms, snip, n)


def test_mel_num_frames_equals_melspectrogram_output_for_many_lengths():
    for opts in [dict(n_fft=400), dict(n_fft=512, win_length=400, hop_length=160),
                 dict(n_fft=401, hop_length=100), dict(n_fft=400, hop_length=160, center=False),
                 dict(n_fft=256, hop_length=128, pad=7)]:
        transform = taT.MelSpectrogram(16000, n_mels=8, **opts)
        for n in range(520, 1500, 37):
            expected = transform(torch.zeros(n)).shape[-1]
            assert mel_num_frames(n, **opts) == expected, (opts, n)


def _assert_same_feats(got: torch.Tensor, expected: torch.Tensor, *, exact: bool) -> None:
    """Bit for bit, or to float32 rounding (speechpipe's fbank: tests/audio/test_kaldi_fbank.py)."""
    if exact:
        assert torch.equal(got, expected)
    else:
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-4)


def test_fbank_equals_kaldi_fbank_called_directly(few):
    # backend="torchaudio": bit for bit; the default backend: tests/audio/test_kaldi_fbank.py
    out = list(_pipe(few).compute_features("fbank", backend="torchaudio", num_mel_bins=80))
    for sample, got in zip(few, out):
        expected = kaldi.fbank(_wave(sample).unsqueeze(0) * KALDI_SCALE, num_mel_bins=80,
                               sample_frequency=16000)
        assert torch.equal(torch.from_numpy(got["feats"]), expected)
        assert got["feats"].dtype == np.float32 and got["feats"].shape[1] == 80


def test_fbank_options_pass_through_unchanged(few):
    opts = dict(num_mel_bins=40, frame_length=20.0, frame_shift=8.0, energy_floor=0.0,
                use_energy=True, snip_edges=False, low_freq=60.0, high_freq=-400.0)
    [got] = _pipe(few[:1]).compute_features("fbank", scale=1.0, backend="torchaudio", **opts)
    expected = kaldi.fbank(_wave(few[0]).unsqueeze(0), sample_frequency=16000, **opts)
    assert torch.equal(torch.from_numpy(got["feats"]), expected)


def test_mfcc_equals_kaldi_mfcc_called_directly(few):
    out = list(_pipe(few).compute_features("mfcc", num_mel_bins=40, num_ceps=20,
                                           backend="torchaudio"))
    for sample, got in zip(few, out):
        expected = kaldi.mfcc(_wave(sample).unsqueeze(0) * KALDI_SCALE, num_mel_bins=40,
                              num_ceps=20, sample_frequency=16000)
        assert torch.equal(torch.from_numpy(got["feats"]), expected)


@pytest.mark.parametrize("log", [False, True])
def test_mel_equals_melspectrogram_transform(few, log):
    opts = dict(n_fft=512, win_length=400, hop_length=160, n_mels=80)
    out = list(_pipe(few).compute_features("mel", log=log, **opts))
    transform = taT.MelSpectrogram(sample_rate=16000, **opts)
    for sample, got in zip(few, out):
        expected = transform(_wave(sample))
        if log:  # speechpipe's log_mel; torchaudio's MelSpectrogram without log
            expected = expected.clamp(min=1e-10).log()
        _assert_same_feats(torch.from_numpy(got["feats"]), expected.T, exact=not log)


def test_mel_transforms_are_per_sample_rate(few):
    opts = dict(n_fft=512, hop_length=160, n_mels=40)
    mixed = [dict(sample, sample_rate=rate) for sample, rate in zip(few, [16000, 8000] * 3)]
    pipe = _pipe(mixed).compute_features("mel", **opts)
    first, second = list(pipe), list(pipe)
    for sample, a, b in zip(mixed, first, second):
        expected = taT.MelSpectrogram(sample_rate=sample["sample_rate"], **opts)(_wave(sample))
        assert torch.equal(torch.from_numpy(a["feats"]), expected.T)
        assert np.array_equal(a["feats"], b["feats"])
        assert a["feats"].flags.c_contiguous


def test_feature_frames_are_known_before_computing(corpus):
    for kind, opts in [("fbank", {}), ("mel", {"hop_length": 160, "n_fft": 512, "n_mels": 80}),
                       ("fbank", {"snip_edges": False, "frame_shift": 12.5})]:
        pipe = _pipe(corpus[:8]).compute_features(kind, keep_audio=True, **opts)
        for got in pipe:
            assert got["feats"].shape[0] == pipe.num_frames(len(got["audio"]), 16000)


@pytest.mark.parametrize("backend", ["torchaudio", "speechpipe"])
def test_dither_is_seeded_noise_on_the_scaled_waveform(few, backend):
    pipe = _pipe(few[:2]).compute_features("fbank", dither=1.0, seed=7, backend=backend)
    out = _global_rng_untouched(lambda: list(pipe))
    g = torch.Generator().manual_seed(derive_seed(7, 0, 0, 0, "compute_features"))
    for sample, got in zip(few[:2], out):
        noisy = _wave(sample) * KALDI_SCALE
        noisy = noisy + torch.randn(noisy.shape[0], generator=g) * 1.0
        expected = kaldi.fbank(noisy.unsqueeze(0), sample_frequency=16000, num_mel_bins=80)
        _assert_same_feats(torch.from_numpy(got["feats"]), expected,  # 80 bins: the default
                           exact=backend == "torchaudio")
    clean = next(iter(_pipe(few[:1]).compute_features("fbank")))["feats"]
    assert not np.array_equal(out[0]["feats"], clean)


def test_dither_same_seed_same_features_other_epoch_other_features(few):
    def run(seed, epoch):
        pipe = _pipe(few[:2]).compute_features("fbank", dither=1.0, seed=seed)
        pipe.set_epoch(epoch)
        return [s["feats"] for s in pipe]

    a, b, c = run(3, 0), run(3, 0), run(3, 1)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not any(np.array_equal(x, z) for x, z in zip(a, c))


def test_keep_audio_false_drops_the_audio(few):
    [got] = _pipe(few[:1]).compute_features("fbank", keep_audio=False)
    assert "audio" not in got and "feats" in got and got["key"] == few[0]["key"]


def test_audio_shorter_than_a_frame_raises_naming_the_key():
    short = {"key": "tiny", "audio": np.zeros(300, np.float32), "sample_rate": 16000}
    with pytest.raises(DataError, match=r"\(key 'tiny'\).*300 samples is shorter than one fbank "
                                        r"frame \(400 samples"):
        list(_pipe([short]).compute_features("fbank"))


def test_audio_shorter_than_a_frame_is_skipped_counted_and_warned(few):
    short = {"key": "tiny", "audio": np.zeros(300, np.float32), "sample_rate": 16000}
    pipe = _pipe([few[0], short, few[1]]).compute_features("fbank", on_error="skip")
    with pytest.warns(SkippedInputWarning, match="audio shorter than a frame: 1"):
        out = list(pipe)
    assert [s["key"] for s in out] == [few[0]["key"], few[1]["key"]]
    assert pipe.diagnostics.total == 1
    with pytest.raises(TypeError, match="no len"):
        len(pipe)


def test_audio_of_three_dims_for_features_names_the_key():
    # Issue 21: (samples, channels) audio has per-channel features (tests/audio/test_channels.py);
    # anything with more axes is refused, naming the key.
    sample = {"key": "st", "audio": np.zeros((16000, 2, 1), np.float32), "sample_rate": 16000}
    with pytest.raises(DataError, match=r"\(key 'st'\).*got shape \(16000, 2, 1\)"):
        list(_pipe([sample]).compute_features("fbank"))


@pytest.mark.parametrize("kind, options, error, message", [
    ("spectrogram", {}, ValueError, "kind must be one of"),
    ("fbank", {"num_mel_bin": 80}, TypeError, "unknown fbank option 'num_mel_bin'"),
    ("mel", {"sample_rate": 0}, ValueError, "sample_rate must be an int >= 1"),
    ("fbank", {"min_duration": 1.0}, TypeError, "filter"),
    ("fbank", {"sample_frequency": 8000}, TypeError, "read from each sample"),
    ("mfcc", {"num_ceps": 40, "num_mel_bins": 23}, ValueError, "rejected: num_ceps must be"),
    ("fbank", {"window_type": "square"}, ValueError, "rejected: window_type must be"),
    ("fbank", {"window_type": "square", "backend": "torchaudio"}, ValueError,
     "rejected by torchaudio"),
    ("mel", {"n_mels": 40, "log": "yes"}, TypeError, "log must be a bool"),
])
def test_feature_options_are_checked_in_the_constructor(kind, options, error, message):
    with pytest.raises(error, match=message):
        _pipe([]).compute_features(kind, **options)


def test_len_is_the_source_length(few):
    assert len(_pipe(few).compute_features("fbank")) == len(few)
    assert len(_pipe(few).resample(8000).perturb_speed().perturb_volume()) == len(few)


# ------------------------------------------------------------------------ batched features


@pytest.mark.parametrize("kind, options", [
    ("fbank", {"num_mel_bins": 80}),
    ("mfcc", {}),
    ("mel", {"n_fft": 512, "win_length": 400, "hop_length": 160, "n_mels": 80, "log": True}),
    ("mel", {"n_fft": 400, "hop_length": 160, "center": False, "n_mels": 40}),
])
def test_batched_features_equal_per_sample_features_row_by_row(few, kind, options):
    batches = list(_pipe(few).batch(3).collate(collate_fn=PadCollate(fields=(
        "key", "audio", "sample_rate"))).compute_features(kind, batched=True, **options))
    singles = list(_pipe(few).compute_features(kind, **options))
    rows = [(b["feats"][i], int(b["feats_len"][i])) for b in batches for i in range(len(b["key"]))]
    for (row, n), single in zip(rows, singles):
        assert n == single["feats"].shape[0]
        # speechpipe's fbank/mfcc: one call per batch, equal to float32 rounding
        _assert_same_feats(row[:n], torch.from_numpy(single["feats"]),
                           exact=kind == "mel" and not options.get("log"))
        assert not row[n:].any(), "padding frames must be zeros"
    assert batches[0]["feats"].dtype == torch.float32
    assert batches[0]["feats_len"].dtype == torch.int64


def test_batched_dither_matches_per_sample_dither(few):
    collate = PadCollate(fields=("key", "audio", "sample_rate"))
    [batch] = _pipe(few[:3]).batch(3).collate(collate_fn=collate).compute_features(
        "fbank", batched=True, dither=1.0, seed=5)
    singles = list(_pipe(few[:3]).compute_features("fbank", dither=1.0, seed=5))
    for i, single in enumerate(singles):
        n = single["feats"].shape[0]
        _assert_same_feats(batch["feats"][i, :n], torch.from_numpy(single["feats"]), exact=False)


def test_batch_features_function_gives_lengths_from_num_frames(few):
    batch = PadCollate(fields=("audio", "sample_rate"))(few[:3])
    feats, lengths = batch_features(batch, "fbank", num_mel_bins=23)
    assert lengths.tolist() == [num_frames(len(s["audio"])) for s in few[:3]]
    assert tuple(feats.shape) == (3, max(lengths.tolist()), 23)


def test_batched_features_reject_a_batch_mixing_rates(few):
    batch = PadCollate(fields=("key", "audio", "sample_rate"))(few[:2])
    batch["sample_rate"] = torch.tensor([16000, 8000])
    with pytest.raises(DataError, match=r"mixes sample rates \[8000, 16000\]"):
        list(_pipe([batch]).compute_features("fbank", batched=True))


def test_batched_features_need_collated_audio_lengths(few):
    with pytest.raises(DataError, match=r"needs 'audio' and 'audio_len'"):
        list(_pipe([{"key": ["a"], "audio": torch.zeros(1, 1000)}]).compute_features(
            "fbank", batched=True))


def test_batched_short_row_names_its_key(few):
    batch = PadCollate(fields=("key", "audio", "sample_rate"))(few[:2])
    batch["audio_len"] = torch.tensor([batch["audio_len"][0], 100])
    with pytest.raises(DataError, match=rf"\(key '{few[1]['key']}'\).*100 samples"):
        list(_pipe([batch]).compute_features("fbank", batched=True))


# -------------------------------------------------------------------------- perturbation


def test_perturb_speed_changes_duration_by_the_factor(few):
    for factor in (0.9, 1.1, 1.25):
        out = list(_pipe(few).perturb_speed(factors=(factor,)))
        for sample, got in zip(few, out):
            n = len(sample["audio"])
            assert len(got["audio"]) == math.ceil(n * 16000 / round(16000 * factor))
            assert abs(len(got["audio"]) - n / factor) <= 1
            assert got["speed"] == factor and got["sample_rate"] == 16000


def test_perturb_speed_equals_torchaudio_functional_speed(few):
    for factor in (0.9, 1.1):
        [got] = _pipe(few[:1]).perturb_speed(factors=(factor,))
        expected, _ = taF.speed(_wave(few[0]), 16000, factor)
        assert torch.equal(torch.from_numpy(got["audio"]), expected)


def test_perturb_speed_kernels_are_per_rate_and_factor(few):
    mixed = [dict(sample, sample_rate=rate) for sample, rate in zip(few, [16000, 22050] * 3)]
    pipe = _pipe(mixed).perturb_speed(factors=(0.9, 1.1, 1.25), seed=5)
    first, second = list(pipe), list(pipe.set_epoch(0))  # the same epoch again
    assert len({(s["sample_rate"], s["speed"]) for s in first}) > 2
    for sample, a, b in zip(mixed, first, second):
        expected = change_speed(sample["audio"], sample["sample_rate"], a["speed"])
        assert np.array_equal(a["audio"], expected) and np.array_equal(a["audio"], b["audio"])
        if sample["sample_rate"] == 16000:
            speed, _ = taF.speed(_wave(sample), 16000, a["speed"])
            assert torch.equal(torch.from_numpy(a["audio"]), speed)


def test_perturb_speed_factor_one_keeps_the_audio(few):
    [got] = _pipe(few[:1]).perturb_speed(factors=(1.0,))
    assert got["audio"] is few[0]["audio"] and got["speed"] == 1.0


def test_perturb_speed_updates_a_duration_field():
    sample = {"key": "a", "audio": np.zeros(16000, np.float32), "sample_rate": 16000,
              "duration": 1.0}
    [got] = _pipe([sample]).perturb_speed(factors=(1.25,))
    assert got["duration"] == 0.8 and sample["duration"] == 1.0


def test_perturb_speed_draws_from_seed_and_epoch(corpus):
    def factors(seed, epoch):
        pipe = _pipe(corpus).perturb_speed(seed=seed)
        pipe.set_epoch(epoch)
        return [s["speed"] for s in _global_rng_untouched(lambda: list(pipe))]

    a = factors(0, 0)
    assert a == factors(0, 0)
    assert a != factors(0, 1) and a != factors(1, 0)
    assert set(a) == {0.9, 1.0, 1.1}


def test_perturb_speed_rejects_bad_factors():
    for factors, error in [((), ValueError), ((0.9, -1.0), ValueError), ("fast", TypeError)]:
        with pytest.raises(error, match="factors"):
            _pipe([]).perturb_speed(factors=factors)


def test_change_speed_rounds_the_source_rate():
    # 0.7 * 22050 == 15434.999999999998: torchaudio's int() would resample 15434 -> 22050
    # (gcd 2, an 11025 x 7700 kernel); rounding resamples 15435 -> 22050, i.e. 7 -> 10.
    audio = np.random.default_rng(0).normal(size=7001).astype(np.float32)
    out = change_speed(audio, 22050, 0.7)
    assert len(out) == math.ceil(7001 * 10 / 7)
    assert np.array_equal(out, taF.resample(torch.from_numpy(audio), 7, 10).numpy())


def test_perturb_volume_scales_by_the_recorded_gain(few):
    out = list(_pipe(few).perturb_volume(low=0.5, high=1.5, seed=2))
    for sample, got in zip(few, out):
        assert 0.5 <= got["gain"] <= 1.5
        assert np.array_equal(got["audio"], sample["audio"] * np.float32(got["gain"]))
    assert len({s["gain"] for s in out}) == len(out)


def test_perturb_volume_same_seed_same_gains_other_epoch_other_gains(few):
    def gains(epoch):
        pipe = _pipe(few).perturb_volume(seed=4)
        pipe.set_epoch(epoch)
        return [s["gain"] for s in pipe]

    assert gains(0) == gains(0) and gains(0) != gains(1)


@pytest.mark.parametrize("low, high", [(0.0, 1.0), (1.2, 0.8), ("1", 2.0)])
def test_perturb_volume_rejects_bad_ranges(low, high):
    with pytest.raises((ValueError, TypeError)):
        _pipe([]).perturb_volume(low=low, high=high)


# ---------------------------------------------------------------------------- SpecAugment


@pytest.fixture(scope="module")
def feats(few):
    return [compute_features(s["audio"], 16000, num_mel_bins=80) for s in few]


@pytest.mark.parametrize("zero", [True, False])
def test_spec_augment_equals_torchaudio_specaugment_with_the_same_seed(feats, zero):
    for i, f in enumerate(feats):
        x = torch.from_numpy(f)
        torch.manual_seed(i)
        reference = taT.SpecAugment(n_time_masks=2, time_mask_param=40, n_freq_masks=2,
                                    freq_mask_param=27, iid_masks=False, zero_masking=zero)
        expected = reference(x.T.clone()).T
        ours = spec_augment(x, time_width=40, mask_value=0.0 if zero else "mean",
                            generator=torch.Generator().manual_seed(i))
        assert torch.equal(ours, expected)


def test_a_time_mask_wider_than_the_utterance_masks_as_torchaudios(feats):
    # Regression (issue 20): W > frames may draw a start below 0; torchaudio masks [0, end),
    # a slice from a negative start masked the utterance's end instead (or nothing).
    x = torch.from_numpy(feats[0][:12])
    for seed in range(30):
        torch.manual_seed(seed)
        reference = taT.SpecAugment(n_time_masks=2, time_mask_param=40, n_freq_masks=0,
                                    freq_mask_param=27, iid_masks=False, zero_masking=True)
        expected = reference(x.T.clone()).T
        ours = spec_augment(x, freq_masks=0, time_width=40,
                            generator=torch.Generator().manual_seed(seed))
        assert torch.equal(ours, expected), seed


def test_spec_augment_time_width_fraction_is_torchaudios_p(feats):
    x = torch.from_numpy(feats[0])
    torch.manual_seed(3)
    expected = taT.TimeMasking(time_mask_param=x.shape[0], p=0.05)(x.T.clone()).T
    ours = spec_augment(x, freq_masks=0, time_masks=1, time_width=0.05,
                        generator=torch.Generator().manual_seed(3))
    assert torch.equal(ours, expected)


def test_spec_augment_masks_have_the_configured_widths():
    ones = np.ones((300, 80), np.float32)
    widths_f, widths_t = [], []
    pipe = _pipe([{"key": str(i), "feats": ones} for i in range(200)])
    for got in pipe.spec_augment(freq_masks=1, freq_width=10, time_masks=1, time_width=30):
        f = got["feats"]
        widths_f.append(int((f == 0).all(axis=0).sum()))
        widths_t.append(int((f == 0).all(axis=1).sum()))
    # one mask each: the fully masked columns/rows are that mask's width, in [0, W)
    assert max(widths_f) <= 9 and max(widths_t) <= 29
    assert set(widths_f) == set(range(10))  # uniform over {0..9}: all appear in 200 draws
    assert min(widths_t) >= 0 and len(set(widths_t)) > 20


def test_spec_augment_same_seed_same_output_other_epoch_other_output(feats):
    samples = [{"key": str(i), "feats": f} for i, f in enumerate(feats)]

    def run(seed, epoch):
        pipe = _pipe(samples).spec_augment(time_warp=5, seed=seed)
        pipe.set_epoch(epoch)
        return [s["feats"] for s in _global_rng_untouched(lambda: list(pipe))]

    a = run(0, 0)
    assert all(np.array_equal(x, y) for x, y in zip(a, run(0, 0)))
    assert not any(np.array_equal(x, y) for x, y in zip(a, run(0, 1)))
    assert not any(np.array_equal(x, y) for x, y in zip(a, run(1, 0)))
    assert all(x.dtype == np.float32 and x.shape == f.shape for x, f in zip(a, feats))


def test_spec_augment_does_not_modify_its_input(feats):
    original = feats[0].copy()
    list(_pipe([{"key": "a", "feats": feats[0]}]).spec_augment(mask_value=-5.0))
    assert np.array_equal(feats[0], original)


def test_time_warp_is_two_interpolations_around_a_seeded_centre(feats):
    x = torch.from_numpy(feats[0])
    g = torch.Generator().manual_seed(11)
    draws = torch.Generator().manual_seed(11)
    center = int(torch.randint(80, x.shape[0] - 80, (1,), generator=draws)[0])
    warped = int(torch.randint(center - 80, center + 80, (1,), generator=draws)[0]) + 1
    interp = torch.nn.functional.interpolate
    left = interp(x[None, None, :center], (warped, 80), mode="bicubic", align_corners=False)
    right = interp(x[None, None, center:], (x.shape[0] - warped, 80), mode="bicubic",
                   align_corners=False)
    expected = torch.cat([left, right], dim=2)[0, 0]
    assert torch.equal(time_warp(x, 80, g), expected)
    assert torch.equal(time_warp(x[:160], 80, g), x[:160])  # too short for the window: unchanged


def test_spec_augment_of_a_sample_without_feats_names_the_key():
    with pytest.raises(DataError, match=r"\(key 'u3'\).*no 'feats' field"):
        list(_pipe([{"key": "u3"}]).spec_augment())


@pytest.mark.parametrize("kwargs", [{"freq_masks": -1}, {"time_width": 1.5},
                                    {"mask_value": "median"}, {"time_warp": 2.0}])
def test_spec_augment_rejects_bad_arguments(kwargs):
    with pytest.raises((ValueError, TypeError)):
        _pipe([]).spec_augment(**kwargs)


# --------------------------------------------------------------------------------- CMVN


@pytest.fixture(scope="module")
def corpus_feats(corpus):
    return [{"key": s["key"], "feats": compute_features(s["audio"], 16000, num_mel_bins=80)}
            for s in corpus]


def test_cmvn_stats_equal_numpy_on_the_same_features(corpus_feats):
    stats = compute_cmvn_stats(_pipe(corpus_feats), progress=False)
    every = np.concatenate([s["feats"] for s in corpus_feats]).astype(np.float64)
    assert stats.count == every.shape[0] and stats.dim == 80
    np.testing.assert_allclose(stats.mean, every.mean(axis=0), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(stats.variance, every.var(axis=0), rtol=1e-6, atol=1e-6)


def test_cmvn_stats_round_trip_through_wenet_json(tmp_path, corpus_feats):
    stats = compute_cmvn_stats(corpus_feats[:5], progress=False)
    path = tmp_path / "global_cmvn.json"
    stats.save(path)
    data = json.loads(path.read_text())
    assert sorted(data) == ["frame_num", "mean_stat", "var_stat"]
    back = CmvnStats.load(path)
    assert back.count == stats.count
    assert np.array_equal(back.sum, stats.sum) and np.array_equal(back.sum_sq, stats.sum_sq)


def test_cmvn_stats_load_a_kaldi_stats_matrix(tmp_path, corpus_feats):
    stats = compute_cmvn_stats(corpus_feats[:5], progress=False)
    matrix = np.zeros((2, stats.dim + 1))
    matrix[0, :-1], matrix[0, -1], matrix[1, :-1] = stats.sum, stats.count, stats.sum_sq
    path = str(tmp_path / "cmvn.mat")
    kaldiio.save_mat(path, matrix)
    back = CmvnStats.load(path)
    assert back.count == stats.count and np.array_equal(back.sum, stats.sum)


@pytest.mark.parametrize("content, message", [
    ('{"mean_stat": [1.0]}', r"lacks \['var_stat', 'frame_num'\]"),
    ('{"mean_stat": [1.0], "var_stat": [1.0, 2.0], "frame_num": 3}', "equal-length"),
    ('{"mean_stat": [1.0], "var_stat": [1.0], "frame_num": 0}', "positive int"),
    ('{"mean_stat": [1.0], ', "not valid CMVN JSON"),
    ("garbage that is not a matrix", "neither CMVN JSON nor a Kaldi stats matrix"),
])
def test_malformed_cmvn_files_name_the_file(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(DataError, match=message) as info:
        CmvnStats.load(path)
    assert str(path) in str(info.value)


def test_cmvn_stats_reject_a_dimension_change_naming_the_key():
    rows = [{"key": "a", "feats": np.ones((3, 4), np.float32)},
            {"key": "b", "feats": np.ones((3, 5), np.float32)}]
    with pytest.raises(DataError, match=r"\(key 'b'\).*dim 5.*dim 4"):
        compute_cmvn_stats(rows, progress=False)


def test_apply_cmvn_normalises_the_corpus_to_zero_mean_unit_variance(corpus_feats):
    stats = compute_cmvn_stats(corpus_feats, progress=False)
    out = np.concatenate([s["feats"] for s in _pipe(corpus_feats).apply_cmvn(stats)])
    np.testing.assert_allclose(out.mean(axis=0), 0.0, atol=1e-4)
    np.testing.assert_allclose(out.var(axis=0), 1.0, atol=1e-4)
    f = corpus_feats[0]["feats"].astype(np.float64)
    expected = (f - stats.mean) / np.sqrt(stats.variance)
    [first] = _pipe(corpus_feats[:1]).apply_cmvn(stats)
    np.testing.assert_allclose(first["feats"], expected, rtol=1e-5, atol=1e-5)


def test_apply_cmvn_per_utterance(corpus_feats):
    for got in _pipe(corpus_feats[:4]).apply_cmvn(utterance=True):
        np.testing.assert_allclose(got["feats"].mean(axis=0), 0.0, atol=1e-4)
        np.testing.assert_allclose(got["feats"].std(axis=0), 1.0, atol=1e-3)


def test_apply_cmvn_means_only(corpus_feats):
    stats = compute_cmvn_stats(corpus_feats, progress=False)
    [got] = _pipe(corpus_feats[:1]).apply_cmvn(stats, norm_vars=False)
    expected = corpus_feats[0]["feats"] - stats.mean.astype(np.float32)
    assert np.array_equal(got["feats"], expected)


@pytest.mark.parametrize("norm_means, norm_vars", [(True, True), (True, False), (False, True)])
def test_apply_cmvn_equals_normalize_features_on_every_pass(corpus_feats, norm_means, norm_vars):
    stats = compute_cmvn_stats(corpus_feats, progress=False)
    pipe = _pipe(corpus_feats[:6]).apply_cmvn(stats, norm_means=norm_means, norm_vars=norm_vars)
    first, second = list(pipe), list(pipe)
    for sample, a, b in zip(corpus_feats, first, second):
        expected = normalize_features(sample["feats"], stats, norm_means=norm_means,
                                      norm_vars=norm_vars)
        assert np.array_equal(a["feats"], expected) and np.array_equal(b["feats"], expected)
        assert a["feats"].dtype == np.float32


def test_apply_cmvn_reads_a_stats_file_when_iterated_not_when_built(tmp_path, corpus_feats):
    path = tmp_path / "later.json"
    pipe = _pipe(corpus_feats[:2]).apply_cmvn(str(path))  # no file yet: fine
    with pytest.raises(MissingDataError, match="later.json"):
        list(pipe)
    compute_cmvn_stats(corpus_feats, progress=False).save(path)
    assert len(list(pipe)) == 2


def test_apply_cmvn_dimension_mismatch_names_the_key():
    stats = CmvnStats(2, np.zeros(3), np.ones(3))
    with pytest.raises(DataError, match=r"\(key 'x'\).*dim 2.*dim 3"):
        list(_pipe([{"key": "x", "feats": np.ones((4, 2), np.float32)}]).apply_cmvn(stats))


def test_apply_cmvn_needs_stats_or_utterance():
    with pytest.raises(ValueError, match="needs stats"):
        _pipe([]).apply_cmvn()
    with pytest.raises(ValueError, match="not both"):
        _pipe([]).apply_cmvn(CmvnStats.empty(2), utterance=True)


def test_normalize_features_floors_the_variance():
    out = normalize_features(np.full((3, 1), 5.0, np.float32))
    assert np.array_equal(out, np.zeros((3, 1), np.float32))


def test_cmvn_command_computes_fbank_from_a_manifest_of_audio_files(tmp_path, few):
    rows = []
    for sample in few[:2]:
        soundfile.write(tmp_path / f"{sample['key']}.flac", sample["audio"], 16000)
        rows.append(json.dumps({"key": sample["key"], "audio_path": f"{sample['key']}.flac"}))
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("\n".join(rows) + "\n")
    out = tmp_path / "stats.json"
    args = _cmvn_parser().parse_args(["cmvn", "--manifest", str(manifest), "--out", str(out),
                                      "--no-progress"])
    assert args.func(args) == 0
    expected = compute_cmvn_stats(
        [compute_features(s["audio"], 16000, num_mel_bins=80) for s in few[:2]], progress=False)
    got = CmvnStats.load(out)
    assert got.count == expected.count and np.allclose(got.sum, expected.sum, rtol=1e-12)


def _cmvn_parser():
    parser = argparse.ArgumentParser(prog="speechpipe")
    add_cmvn_command(parser.add_subparsers(dest="command"))
    return parser


def test_cmvn_command_on_the_demo_corpus_equals_the_function(tmp_path, corpus_feats):
    out = tmp_path / "stats.json"
    args = _cmvn_parser().parse_args(["cmvn", "--out", str(out), "--no-progress"])
    assert args.func(args) == 0
    expected = compute_cmvn_stats(corpus_feats, progress=False)
    got = CmvnStats.load(out)
    assert got.count == expected.count
    np.testing.assert_allclose(got.sum, expected.sum, rtol=1e-12)


def test_cmvn_command_reads_kaldi_feats_scp(tmp_path):
    rng = np.random.default_rng(0)
    mats = {f"utt{i}": rng.normal(size=(10 + i, 5)).astype(np.float32) for i in range(3)}
    ark, scp = str(tmp_path / "feats.ark"), str(tmp_path / "feats.scp")
    kaldiio.save_ark(ark, mats, scp=scp)
    out = tmp_path / "stats.json"
    args = _cmvn_parser().parse_args(["cmvn", "--scp", scp, "--out", str(out), "--no-progress"])
    assert args.func(args) == 0
    every = np.concatenate(list(mats.values())).astype(np.float64)
    got = CmvnStats.load(out)
    assert got.count == 33
    np.testing.assert_allclose(got.mean, every.mean(axis=0), rtol=1e-9)


# ------------------------------------------------------------------- unusual inputs


def test_read_only_float64_and_non_dict_samples_give_the_same_numbers(few):
    plain = few[0]
    read_only = plain["audio"].copy()
    read_only.setflags(write=False)
    variants = [dict(plain, audio=read_only), dict(plain, audio=plain["audio"].astype(np.float64)),
                types.MappingProxyType(plain)]
    stages = [("audio", lambda p: p.resample(8000)),
              ("audio", lambda p: p.perturb_speed(factors=(1.1,))),
              ("audio", lambda p: p.perturb_volume(seed=1)),
              ("feats", lambda p: p.compute_features("fbank")),
              ("feats", lambda p: p.compute_features("mel", n_fft=512, hop_length=160, n_mels=40))]
    for field, stage in stages:
        [expected] = stage(_pipe([plain]))
        for variant in variants:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                [got] = stage(_pipe([variant]))
            assert np.array_equal(got[field], expected[field])
            assert got[field].dtype == np.float32


def test_fortran_ordered_float64_and_read_only_feats_give_the_same_numbers(corpus_feats):
    plain = corpus_feats[0]
    read_only = plain["feats"].copy()
    read_only.setflags(write=False)
    variants = [dict(plain, feats=np.asfortranarray(plain["feats"], dtype=np.float64)),
                dict(plain, feats=read_only), dict(plain, feats=torch.from_numpy(plain["feats"]))]
    stats = compute_cmvn_stats(corpus_feats, progress=False)
    for stage in (lambda p: p.spec_augment(seed=3), lambda p: p.apply_cmvn(stats)):
        [expected] = stage(_pipe([plain]))
        for variant in variants:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                [got] = stage(_pipe([variant]))
            assert np.array_equal(got["feats"], expected["feats"])
            assert got["feats"].dtype == np.float32 and got["feats"].flags.c_contiguous


# ------------------------------------------------------------------ pickling, DataLoader


def _all_stages(samples, stats):
    return (_pipe(samples).resample(8000).perturb_speed(seed=1).perturb_volume(seed=2)
            .compute_features("fbank", dither=0.5, seed=3, num_mel_bins=40)
            .spec_augment(time_warp=5, seed=4).apply_cmvn(stats))


def test_pickled_pipes_give_the_same_output(few):
    stats = CmvnStats(10, np.zeros(40), np.full(40, 10.0))
    pipe = _all_stages(few[:3], stats)
    copy = pickle.loads(pickle.dumps(pipe))
    for a, b in zip(pipe, copy):
        assert np.array_equal(a["feats"], b["feats"]) and a["speed"] == b["speed"]


def test_dataloader_with_two_workers_yields_every_sample_once_reproducibly(corpus):
    stats = CmvnStats(10, np.zeros(40), np.full(40, 10.0))
    pipe = _all_stages(corpus[:8], stats).sharding_filter()

    def keys():  # epoch 0 both times: a plain DataLoader's next pass is the next epoch
        loader = torch.utils.data.DataLoader(speechpipe.set_epoch(pipe, 0), batch_size=None,
                                             num_workers=2)
        return [(s["key"], s["speed"], s["feats"].shape) for s in loader]

    first = keys()
    assert sorted(k for k, _, _ in first) == sorted(s["key"] for s in corpus[:8])
    assert first == keys()  # seeded per worker: two runs agree


def test_every_pipe_is_exported_under_its_alias():
    import speechpipe.pipes.audio as audio

    for name in ("Resampler", "SpeedPerturber", "VolumePerturber", "FeatureComputer",
                 "SpecAugmenter", "CmvnApplier"):
        assert getattr(audio, name) is getattr(audio, f"{name}IterDataPipe")
    assert FeatureComputer(_pipe([]), "mel", n_mels=40).dim == 40


# ------------------------------------------------------------------------------ speech defaults


def test_features_default_to_80_bins_and_drop_the_waveform(few):
    # issue 17: fbank defaulted to torchaudio's 23 bins and batches kept the raw audio
    got = next(iter(_pipe(few[:1]).compute_features("fbank")))
    assert got["feats"].shape[1] == 80 and "audio" not in got
    assert next(iter(_pipe(few[:1]).compute_features("mel")))["feats"].shape[1] == 80
    assert next(iter(_pipe(few[:1]).compute_features("mfcc")))["feats"].shape[1] == 13  # Kaldi's
    kept = next(iter(_pipe(few[:1]).compute_features("fbank", keep_audio=True,
                                                     num_mel_bins=23)))
    assert kept["feats"].shape[1] == 23 and "audio" in kept


def test_spec_augment_masks_scale_with_the_feature_size():
    # issue 17: the default 27-bin mask on 23-bin features zeroed ~76 % of each utterance
    g = torch.Generator().manual_seed(0)
    widest = 0
    for _ in range(200):
        out = spec_augment(torch.ones(50, 23), freq_masks=1, time_masks=0, generator=g)
        widest = max(widest, int((out == 0).all(dim=0).sum()))
    assert 0 < widest <= 7  # W = round(27 * 23 / 80) = 8: widths 0..7
    with pytest.raises(ValueError, match="freq_width 27 is wider than the features \\(23 bins\\)"):
        spec_augment(torch.ones(50, 23), freq_width=27)
    rows = [{"key": "u", "feats": np.ones((50, 23), np.float32)}]
    with pytest.raises(ValueError, match="leave freq_width unset"):
        list(IterableWrapper(rows).spec_augment(freq_width=30))

