"""speechpipe's vectorised Kaldi fbank / MFCC against torchaudio's (issue 20).

Invariant: for every option set, sample rate and input, :func:`speechpipe.pipes.audio._fbank.fbank`
/ ``mfcc`` give exactly torchaudio's frame count and its numbers to float32 rounding; a batch
row gives what the row alone gives, whatever the padding holds (the same frame count, the same
numbers to float32 rounding: a sum's order can follow the row's alignment in memory).

Tolerance (float32 rounding only). Measured max abs difference to torchaudio: log fbank and
log-mel 1.9e-6 (one float32 ulp of values in [16, 32)), on the demo's speech and on real
recorded speech (alsa-utils' nine voice prompts, 48 kHz, at 48, 44.1, 16 and 8 kHz, 15
fbank option sets like those below, all five windows); MFCC 2.9e-5 (sums of 23 such logs);
linear fbank (``use_log_fbank=False``) 1.6e-5 relative. The tests allow 1e-5 absolute (log
fbank, log-mel), 1e-4 absolute + 1e-5 relative (MFCC), 1e-4 relative (linear). Test speech
is the demo corpus's (shipped, synthesized), resampled for the other rates, and real recorded
speech where the system has it (alsa-utils' voice prompts in /usr/share/sounds/alsa, read in
place: alsa-utils is GPL-2, speechpipe Apache-2.0, so they are not copied into the repository).
"""

from __future__ import annotations

import math
import pathlib

import numpy as np
import pytest
import soundfile
import torch
import torchaudio.functional as taF
import torchaudio.transforms as taT
from torchaudio.compliance import kaldi

import speechpipe as sp
from speechpipe.demo import DEMO_CORPUS
from speechpipe.pipes.collate import PadCollate
from speechpipe.pipes.audio import KALDI_SCALE
from speechpipe.pipes.audio import (
    fbank, fbank_frames, FbankOptions, log_mel, LogMelOptions, mfcc, MfccOptions,
)
from speechpipe.recipes.librispeech import librispeech_samples

LOG_ATOL = 1e-5
MFCC_ATOL, MFCC_RTOL = 1e-4, 1e-5
LINEAR_RTOL = 1e-4


@pytest.fixture(scope="module")
def speech():
    """Three demo utterances at Kaldi's 16-bit scale, 16 kHz."""
    samples = sorted(librispeech_samples(DEMO_CORPUS), key=lambda s: s["key"])[:3]
    return [torch.from_numpy(s["audio"]) * KALDI_SCALE for s in samples]


def _close(got: torch.Tensor, expected: torch.Tensor, *, log: bool = True) -> None:
    assert got.shape == expected.shape  # the frame count exactly
    if log:
        torch.testing.assert_close(got, expected, rtol=0.0, atol=LOG_ATOL)
    else:
        torch.testing.assert_close(got, expected, rtol=LINEAR_RTOL, atol=0.0)


def _same_fbank(wave: torch.Tensor, rate: int, **options) -> None:
    got, count = fbank(wave, sample_rate=rate, **options)
    expected = kaldi.fbank(wave.unsqueeze(0), sample_frequency=rate, **options)
    _close(got, expected, log=options.get("use_log_fbank", True))
    assert int(count) == expected.shape[0]


FBANK_OPTIONS = [
    {},
    {"num_mel_bins": 80},
    {"snip_edges": False},
    {"use_energy": True},
    {"use_energy": True, "raw_energy": False, "htk_compat": True},
    {"use_energy": True, "energy_floor": 0.0},
    {"use_power": False},
    {"use_log_fbank": False},
    {"round_to_power_of_two": False},
    {"remove_dc_offset": False, "preemphasis_coefficient": 0.0},
    {"preemphasis_coefficient": 1.0},
    {"low_freq": 60.0, "high_freq": -400.0},
    {"low_freq": 100.0, "high_freq": 7000.0},
    {"subtract_mean": True},
    {"frame_length": 20.0, "frame_shift": 7.5, "num_mel_bins": 40},
]


@pytest.mark.parametrize("options", FBANK_OPTIONS, ids=str)
def test_fbank_equals_torchaudio_on_speech(speech, options):
    for wave in speech:
        _same_fbank(wave, 16000, **options)


@pytest.mark.parametrize("window_type", ["povey", "hamming", "hanning", "rectangular",
                                         "blackman"])
def test_every_window_type_equals_torchaudio(speech, window_type):
    _same_fbank(speech[0], 16000, window_type=window_type)
    _same_fbank(speech[0], 16000, window_type=window_type, blackman_coeff=0.4)


@pytest.mark.parametrize("rate", [8000, 44100, 48000])
def test_other_sample_rates_equal_torchaudio(speech, rate):
    wave = taF.resample(speech[1], 16000, rate)
    for options in ({}, {"num_mel_bins": 40, "snip_edges": False}, {"high_freq": -200.0}):
        _same_fbank(wave, rate, **options)
    got, _ = mfcc(wave, sample_rate=rate)
    torch.testing.assert_close(got, kaldi.mfcc(wave.unsqueeze(0), sample_frequency=rate),
                               rtol=MFCC_RTOL, atol=MFCC_ATOL)


# Real recorded speech: the nine human-voice prompts alsa-utils installs (48 kHz, GPL-2: read
# where the system has them, never copied into the repository; `apt-get install alsa-utils`).
ALSA_SOUNDS = pathlib.Path("/usr/share/sounds/alsa")
REAL = sorted(p for p in ALSA_SOUNDS.glob("*.wav") if p.name != "Noise.wav")


@pytest.mark.skipif(not REAL, reason=f"no recorded speech in {ALSA_SOUNDS} (alsa-utils)")
@pytest.mark.parametrize("rate", [48000, 16000, 8000])
def test_fbank_and_mfcc_equal_torchaudio_on_real_recorded_speech(rate):
    for path in REAL:
        audio, native = soundfile.read(path, dtype="float32")
        wave = torch.from_numpy(audio if audio.ndim == 1 else audio[:, 0]) * KALDI_SCALE
        wave = taF.resample(wave, native, rate) if rate != native else wave
        for options in FBANK_OPTIONS[:4]:
            _same_fbank(wave, rate, **options)
        got, count = mfcc(wave, sample_rate=rate)
        expected = kaldi.mfcc(wave.unsqueeze(0), sample_frequency=rate)
        assert int(count) == expected.shape[0]
        torch.testing.assert_close(got, expected, rtol=MFCC_RTOL, atol=MFCC_ATOL)


@pytest.mark.parametrize("options", [
    {},
    {"use_energy": True},
    {"htk_compat": True},
    {"htk_compat": True, "use_energy": True},
    {"cepstral_lifter": 0.0, "num_ceps": 20, "num_mel_bins": 40},
    {"snip_edges": False, "subtract_mean": True, "raw_energy": False, "use_energy": True},
], ids=str)
def test_mfcc_equals_torchaudio_on_speech(speech, options):
    for wave in speech:
        got, count = mfcc(wave, sample_rate=16000, **options)
        expected = kaldi.mfcc(wave.unsqueeze(0), sample_frequency=16000, **options)
        assert got.shape == expected.shape and int(count) == expected.shape[0]
        torch.testing.assert_close(got, expected, rtol=MFCC_RTOL, atol=MFCC_ATOL)


LOG_MEL_OPTIONS = [
    {"n_mels": 80},
    {"n_fft": 512, "win_length": 400, "hop_length": 160, "n_mels": 80},
    {"n_fft": 400, "hop_length": 160, "center": False, "n_mels": 40},
    {"n_fft": 512, "hop_length": 128, "pad_mode": "constant", "norm": "slaney",
     "mel_scale": "slaney", "n_mels": 64},
    {"power": 1.0, "f_min": 20.0, "f_max": 7600.0, "n_mels": 80, "log_floor": 1e-6},
]


@pytest.mark.parametrize("options", LOG_MEL_OPTIONS, ids=str)
def test_log_mel_equals_torchaudios_melspectrogram_log(speech, options):
    floor = options.get("log_floor", 1e-10)
    transform = taT.MelSpectrogram(16000, **{k: v for k, v in options.items()
                                             if k != "log_floor"})
    for wave in speech:
        wave = wave / KALDI_SCALE
        got, count = log_mel(wave, sample_rate=16000, **options)
        expected = transform(wave).clamp(min=floor).log().T
        assert got.shape == expected.shape and int(count) == expected.shape[0]
        torch.testing.assert_close(got, expected, rtol=0.0, atol=LOG_ATOL)


@pytest.mark.parametrize("options", LOG_MEL_OPTIONS[1:4], ids=str)
def test_log_mel_batch_rows_equal_each_row_alone(speech, options):
    waves = [w / KALDI_SCALE for w in (speech[0], speech[1][:513], speech[2][:9000])]
    batch, lengths = _padded(waves, float("nan"))
    feats, counts = log_mel(batch, lengths, sample_rate=16000, **options)
    for row, count, wave in zip(feats, counts.tolist(), waves):
        alone, alone_count = log_mel(wave, sample_rate=16000, **options)
        assert count == int(alone_count)
        _same_row(row[:count], alone)
        assert not row[count:].any()


def test_log_mel_refuses_rows_too_short_to_reflect_and_bad_options():
    with pytest.raises(ValueError, match="needs more than n_fft // 2 = 200 samples"):
        log_mel(torch.zeros(2, 800), torch.tensor([800, 150]), sample_rate=16000)
    with pytest.raises(ValueError, match="pad_mode must be"):
        LogMelOptions(pad_mode="circular")
    with pytest.raises(ValueError, match="win_length <= n_fft"):
        LogMelOptions(n_fft=400, win_length=512)


# ----------------------------------------------------------------------------- edge cases


@pytest.mark.parametrize("snip_edges", [True, False])
def test_exactly_one_window_of_samples_gives_torchaudios_frames(speech, snip_edges):
    wave = speech[0][3000:3400]  # 400 samples: one 25 ms window at 16 kHz
    _same_fbank(wave, 16000, snip_edges=snip_edges, use_energy=True)


def test_fewer_samples_than_a_window_give_no_frame_with_snip_edges():
    # torchaudio refuses such audio; Kaldi's count is 0 (snip_edges) or (n + shift/2) // shift
    feats, count = fbank(torch.ones(399), sample_rate=16000)
    assert tuple(feats.shape) == (0, 23) and int(count) == 0
    feats, count = fbank(torch.linspace(-1, 1, 399), sample_rate=16000, snip_edges=False)
    assert tuple(feats.shape) == (2, 23) and int(count) == 2
    assert torch.isfinite(feats).all()
    assert fbank_frames(torch.tensor([399, 400, 0]), FbankOptions(), 16000).tolist() == [0, 1, 0]
    assert fbank_frames(torch.tensor([399, 79, 80]), FbankOptions(snip_edges=False),
                        16000).tolist() == [2, 0, 1]


def test_silence_hits_the_log_and_energy_floors_as_torchaudio():
    silence = torch.zeros(16000)
    for options in ({}, {"use_energy": True}, {"use_energy": True, "energy_floor": 0.0},
                    {"use_energy": True, "raw_energy": False, "energy_floor": 2.0}):
        _same_fbank(silence, 16000, **options)
    feats, _ = fbank(silence, sample_rate=16000, use_energy=True)
    assert torch.all(feats[:, 0] == 0.0)  # log(energy_floor = 1)
    assert torch.allclose(feats[:, 1:], torch.tensor(math.log(torch.finfo(torch.float32).eps)))


def test_clipped_full_scale_audio_equals_torchaudio():
    t = torch.arange(32000) / 16000
    clipped = (3 * torch.sin(2 * math.pi * 220 * t)).clamp(-1.0, 1.0) * KALDI_SCALE
    square = torch.where(torch.sin(2 * math.pi * 5 * t) >= 0, 1.0, -1.0) * KALDI_SCALE
    for wave in (clipped, square):
        for options in ({}, {"use_energy": True}, {"snip_edges": False, "num_mel_bins": 80}):
            _same_fbank(wave, 16000, **options)


def test_float64_in_float64_out(speech):
    wave = speech[2].double()
    got, _ = fbank(wave, sample_rate=16000)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, kaldi.fbank(wave.unsqueeze(0)), rtol=0.0, atol=1e-9)


# ----------------------------------------------------------------------------- batches


def _same_row(row: torch.Tensor, alone: torch.Tensor, kind: str = "fbank") -> None:
    assert row.shape == alone.shape
    atol = MFCC_ATOL if kind == "mfcc" else LOG_ATOL
    torch.testing.assert_close(row, alone, rtol=MFCC_RTOL, atol=atol)


def _padded(waves: list[torch.Tensor], fill: float) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.tensor([w.shape[0] for w in waves])
    out = torch.full((len(waves), int(lengths.max()) + 500), fill)
    for row, w in zip(out, waves):
        row[: w.shape[0]] = w
    return out, lengths


@pytest.mark.parametrize("compute, options", [
    (fbank, {}),
    (fbank, {"snip_edges": False, "use_energy": True}),
    (fbank, {"subtract_mean": True, "num_mel_bins": 80}),
    (mfcc, {"htk_compat": True}),
], ids=["fbank", "fbank-reflect", "fbank-mean", "mfcc"])
def test_batch_rows_equal_each_row_alone_whatever_the_padding(speech, compute, options):
    # Very different lengths: 3 utterances, one window, less than one, nothing at all.
    waves = [speech[0], speech[1][:400], speech[2][:12345], speech[0][:399], speech[1][:0]]
    batch, lengths = _padded(waves, float("nan"))  # NaN padding would poison any frame it entered
    feats, counts = compute(batch, lengths, sample_rate=16000, **options)
    assert counts.dtype == torch.int64 and feats.shape[:2] == (5, int(counts.max()))
    for row, count, wave in zip(feats, counts.tolist(), waves):
        alone, alone_count = compute(wave, sample_rate=16000, **options)
        assert count == int(alone_count) == alone.shape[0]
        _same_row(row[:count], alone, compute.__name__)
        assert not row[count:].any(), "frames past a row's count are zero"


def test_batch_without_lengths_is_rows_of_full_length(speech):
    batch = torch.stack([speech[0][:16000], speech[1][:16000]])
    feats, counts = fbank(batch, sample_rate=16000)
    assert counts.tolist() == [98, 98]
    _same_row(feats[1], fbank(speech[1][:16000], sample_rate=16000)[0])


def test_batch_dither_draws_each_rows_noise_in_turn(speech):
    waves = [speech[0][:8000], speech[1][:5000]]
    batch, lengths = _padded(waves, 0.0)
    feats, counts = fbank(batch, lengths, sample_rate=16000, dither=1.0,
                          generator=torch.Generator().manual_seed(3))
    g = torch.Generator().manual_seed(3)
    for row, count, wave in zip(feats, counts.tolist(), waves):
        noisy = wave + torch.randn(wave.shape[0], generator=g)
        _same_row(row[:count], fbank(noisy, sample_rate=16000)[0])


def test_options_object_and_keywords(speech):
    options = FbankOptions(num_mel_bins=40, use_energy=True)
    a, _ = fbank(speech[0], sample_rate=16000, options=options)
    b, _ = fbank(speech[0], sample_rate=16000, num_mel_bins=40, use_energy=True)
    c, _ = fbank(speech[0], sample_rate=16000, options=options, use_energy=False)
    assert torch.equal(a, b) and a.shape[1] == 41 and c.shape[1] == 40
    with pytest.raises(TypeError, match="options must be a MfccOptions"):
        mfcc(speech[0], sample_rate=16000, options=options)


@pytest.mark.parametrize("options, error, message", [
    ({"window_type": "square"}, ValueError, "window_type must be one of"),
    ({"vtln_warp": 0.9}, ValueError, "VTLN is not supported"),
    ({"num_mel_bins": 3}, ValueError, "num_mel_bins must be > 3"),
    ({"num_mel_bins": 40.0}, TypeError, "num_mel_bins must be an int"),
    ({"preemphasis_coefficient": 1.5}, ValueError, r"preemphasis_coefficient must be in \[0, 1\]"),
    ({"snip_edges": 1}, TypeError, "snip_edges must be a bool"),
    ({"frame_shift": 0.0}, ValueError, "must be > 0 ms"),
    ({"num_bins": 40}, TypeError, "num_bins"),
])
def test_bad_options_are_refused(options, error, message):
    with pytest.raises(error, match=message):
        FbankOptions(**options)


@pytest.mark.parametrize("call, message", [
    (lambda: fbank(torch.zeros(8000), sample_rate=8000, frame_length=0.1),
     "give a window of 0"),
    (lambda: fbank(torch.zeros(8000), sample_rate=8000, high_freq=4100.0),
     r"outside \(0, 4000.0\]"),
    (lambda: fbank(torch.zeros(8000), sample_rate=16000, frame_length=25.0625,
                   round_to_power_of_two=False), "must be even"),
    (lambda: mfcc(torch.zeros(8000), sample_rate=16000, num_ceps=24), "num_ceps must be in"),
    (lambda: mfcc(torch.zeros(8000), sample_rate=16000, use_power=False), "use_power"),
    (lambda: fbank(torch.zeros(2, 800), torch.tensor([800, 801]), sample_rate=16000),
     r"lengths must be 2 ints in \[0, 800\]"),
    (lambda: fbank(torch.zeros(2, 800), torch.tensor([800]), sample_rate=16000),
     "lengths must be 2 ints"),
    (lambda: fbank(torch.zeros(800), torch.tensor([800]), sample_rate=16000),
     "a 1-D waveform is one whole utterance"),
    (lambda: fbank(torch.zeros(2, 2, 800), sample_rate=16000), r"got \(2, 2, 800\)"),
    (lambda: fbank(torch.zeros(800, dtype=torch.int16), sample_rate=16000), "torch.int16"),
])
def test_bad_input_is_refused_with_a_reason(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_mfcc_options_keep_fbanks_log_power():
    assert MfccOptions().use_log_fbank and MfccOptions().num_ceps == 13


# ----------------------------------------------------------------------------- the stages


def _samples(speech, lengths=(None, 9000, 400)):
    return [{"key": f"u{i}", "audio": (w[:n] / KALDI_SCALE).numpy(), "sample_rate": 16000}
            for i, (w, n) in enumerate(zip(speech, lengths))]


@pytest.mark.parametrize("kind, options", [("fbank", {}), ("mfcc", {"use_energy": True})])
def test_compute_features_default_backend_is_ours_torchaudios_by_name(speech, kind, options):
    samples = _samples(speech)
    ours = list(sp.IterableWrapper(samples).compute_features(kind, **options))
    theirs = list(sp.IterableWrapper(samples).compute_features(kind, backend="torchaudio",
                                                               **options))
    for sample, a, b in zip(samples, ours, theirs):
        expected = getattr(kaldi, kind)(torch.from_numpy(sample["audio"])[None] * KALDI_SCALE,
                                        **({"num_mel_bins": 80} if kind == "fbank" else {}),
                                        **options)
        assert torch.equal(torch.from_numpy(b["feats"]), expected)  # torchaudio: bit for bit
        assert a["feats"].dtype == np.float32 and a["feats"].shape == b["feats"].shape
        np.testing.assert_allclose(a["feats"], b["feats"], rtol=MFCC_RTOL, atol=MFCC_ATOL)
    with pytest.raises(ValueError, match="backend must be one of"):
        sp.IterableWrapper(samples).compute_features(kind, backend="kaldi")


@pytest.mark.parametrize("kind", ["fbank", "mfcc"])
def test_batched_compute_features_equals_the_per_utterance_stage(speech, kind):
    samples = _samples(speech)
    collate = PadCollate(fields=("key", "audio", "sample_rate"))
    batches = (sp.IterableWrapper(samples).batch(3).collate(collate_fn=collate)
               .move_to_device("cpu").compute_features(kind, batched=True, device="cpu", dither=1.0,
                                                             seed=4))
    [batch] = list(batches)
    singles = list(sp.IterableWrapper(samples).compute_features(kind, dither=1.0, seed=4))
    assert batch["feats"].device == torch.device("cpu") and "audio" not in batch
    assert batch["feats_len"].tolist() == [s["feats"].shape[0] for s in singles]
    for row, count, single in zip(batch["feats"], batch["feats_len"].tolist(), singles):
        _same_row(row[:count], torch.from_numpy(single["feats"]), kind)
        assert not row[count:].any()


def test_batched_compute_features_moves_numpy_batches_to_its_device(speech):
    batch = PadCollate(fields=("key", "audio", "sample_rate"))(_samples(speech))
    batch["audio"] = batch["audio"].numpy().astype(np.float64)
    [out] = sp.IterableWrapper([batch]).compute_features("fbank", batched=True, device="cpu",
                                                              keep_audio=True)
    assert out["feats"].dtype == torch.float32 and out["feats_len"].device.type == "cpu"
    assert "audio" in out


def test_batched_compute_features_refuses_a_bad_device():
    with pytest.raises(ValueError, match="device must name a torch device, got 'gpu7'"):
        sp.IterableWrapper([]).compute_features("fbank", batched=True, device="gpu7")
