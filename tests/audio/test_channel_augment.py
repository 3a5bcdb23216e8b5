"""Augmentation and normalisation of several channels (issue 21): ``spec_augment``,
``apply_cmvn`` / ``compute_cmvn_stats`` on ``(frames, channels, dim)`` features, ``add_noise``
and ``reverberate`` on ``(samples, channels)`` audio.

Invariants: by default the channels of one recording get the same SpecAugment draws as a mono
matrix would (so they stay aligned), ``per_channel=True`` each channel the draws of a mono
matrix in turn; CMVN statistics pool the channels by default (a mono statistics file applies
to every channel), per-channel statistics normalise each channel on its own; the SNR achieved
over all channels is the SNR drawn whether the noise is mono or has the utterance's channels;
a multichannel response keeps the delays between channels; a channel count that fits neither
way is a DataError naming the sample and the noise or response.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import soundfile
import torch

import speechpipe  # noqa: F401  (registers the pipes)
from speechpipe.errors import DataError
from speechpipe.loader import PipeDataset
from speechpipe.pipes._core import IterableWrapper
from speechpipe.pipes.audio import spec_augment
from speechpipe.pipes.audio import CmvnStats, compute_cmvn_stats, normalize_features
from speechpipe.pipes.collate import PadCollate
from speechpipe.pipes.audio import AUGMENT, convolve_rir, snr_db
from speechpipe import PaddedArea

RATE = 16000
#: The SNR achieved equals the SNR drawn to this many dB (float32 rounding of the mixture).
SNR_TOLERANCE_DB = 0.01


def _feats(frames=120, channels=3, dim=40, seed=0) -> np.ndarray:
    """Features with no zero cell (masks are the zeros), each channel its own level."""
    rng = np.random.default_rng(seed)
    base = rng.uniform(1.0, 2.0, (frames, channels, dim)).astype(np.float32)
    return base + np.arange(channels, dtype=np.float32)[None, :, None] * 3.0


def _stereo(n=8, seed=0, channels=2) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        length = int(rng.integers(2000, 6000))
        audio = (rng.standard_normal((length, channels)) * 0.1).astype(np.float32)
        out.append({"key": f"u{i}", "audio": audio, "sample_rate": RATE})
    return out


def _gen(seed=7) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------------------ SpecAugment


@pytest.mark.parametrize("warp", [0, 10])
def test_spec_augment_gives_every_channel_the_draws_of_a_mono_matrix(warp):
    feats = torch.from_numpy(_feats())
    options = dict(freq_masks=2, freq_width=12, time_masks=2, time_width=20,
                   time_warp_window=warp)
    out = spec_augment(feats, generator=_gen(), **options)
    assert out.shape == feats.shape
    masked = out == 0
    assert masked.any() and all(torch.equal(masked[:, c], masked[:, 0]) for c in range(3))
    for c in range(3):  # one draw for all: each channel is what the mono call gives it
        mono = spec_augment(feats[:, c].contiguous(), generator=_gen(), **options)
        torch.testing.assert_close(out[:, c], mono, rtol=0, atol=1e-5)


def test_spec_augment_per_channel_draws_each_channel_its_own_masks():
    feats = torch.from_numpy(_feats())
    options = dict(freq_masks=2, freq_width=12, time_masks=2, time_width=20)
    out = spec_augment(feats, generator=_gen(), per_channel=True, **options)
    g = _gen()  # channel after channel, as mono matrices, from the one generator
    expected = [spec_augment(feats[:, c].contiguous(), generator=g, **options) for c in range(3)]
    assert torch.equal(out, torch.stack(expected, dim=1))
    masks = [(out[:, c] == 0) for c in range(3)]
    assert not (torch.equal(masks[0], masks[1]) and torch.equal(masks[1], masks[2]))


def test_spec_augment_mean_value_is_over_all_channels():
    feats = torch.from_numpy(_feats())
    out = spec_augment(feats, generator=_gen(), mask_value="mean", freq_masks=1, freq_width=12,
                       time_masks=0)
    changed = out != feats
    assert changed.any()
    assert torch.allclose(out[changed], feats.mean().expand(int(changed.sum())))


def test_spec_augment_stage_on_channels_is_seeded_and_per_channel_differs():
    rows = [{"key": f"u{i}", "feats": _feats(seed=i)} for i in range(4)]

    def run(**kw):
        return [s["feats"] for s in IterableWrapper(rows).spec_augment(
            freq_width=12, time_width=20, seed=3, **kw)]

    shared, again, independent = run(), run(), run(per_channel=True)
    assert all(np.array_equal(a, b) for a, b in zip(shared, again))
    for out in shared:
        assert out.shape == (120, 3, 40) and out.dtype == np.float32
        assert np.array_equal(out[:, 0] == 0, out[:, 2] == 0)
    assert any(not np.array_equal(out[:, 0] == 0, out[:, 1] == 0) for out in independent)


def test_spec_augment_refuses_features_with_four_axes_naming_the_key():
    rows = [{"key": "odd", "feats": np.ones((10, 2, 3, 4), np.float32)}]
    with pytest.raises(DataError, match=r"\(key 'odd'\).*\(frames, dim\) or \(frames, "
                                        r"channels, dim\)"):
        list(IterableWrapper(rows).spec_augment())
    with pytest.raises(TypeError, match="per_channel must be a bool"):
        IterableWrapper(rows).spec_augment(per_channel=1)


# ------------------------------------------------------------------------------ CMVN


def test_cmvn_stats_pool_the_channels_and_a_mono_stats_file_applies_to_every_channel(tmp_path):
    feats = [_feats(seed=i) for i in range(3)]
    stats = compute_cmvn_stats([{"key": "u", "feats": f} for f in feats], progress=False)
    as_mono = compute_cmvn_stats([f[:, c] for f in feats for c in range(3)], progress=False)
    assert stats.dim == 40 and stats.channels is None and stats.count == 3 * 120 * 3
    np.testing.assert_allclose(stats.sum, as_mono.sum)
    np.testing.assert_allclose(stats.sum_sq, as_mono.sum_sq)
    stats.save(tmp_path / "cmvn.json")  # the WeNet file of mono features: same format
    assert len(json.loads((tmp_path / "cmvn.json").read_text())["mean_stat"]) == 40
    [out] = IterableWrapper([{"key": "u", "feats": feats[0]}]).apply_cmvn(tmp_path / "cmvn.json")
    for c in range(3):
        np.testing.assert_array_equal(out["feats"][:, c], normalize_features(feats[0][:, c],
                                                                             stats))


def test_per_channel_cmvn_stats_normalise_each_channel_and_read_back(tmp_path):
    feats = [_feats(seed=i) for i in range(3)]
    rows = [{"key": f"u{i}", "feats": f} for i, f in enumerate(feats)]
    stats = compute_cmvn_stats(rows, progress=False, per_channel=True)
    assert stats.sum.shape == (3, 40) and stats.channels == 3 and stats.count == 360
    stats.save(tmp_path / "cmvn.json")
    loaded = CmvnStats.load(tmp_path / "cmvn.json")
    assert np.array_equal(loaded.sum, stats.sum) and loaded.channels == 3
    out = np.concatenate([s["feats"] for s in IterableWrapper(rows).apply_cmvn(loaded)])
    np.testing.assert_allclose(out.mean(axis=0), 0.0, atol=1e-4)
    np.testing.assert_allclose(out.std(axis=0), 1.0, atol=1e-4)
    pooled = compute_cmvn_stats(rows, progress=False)
    shared = np.concatenate([s["feats"] for s in IterableWrapper(rows).apply_cmvn(pooled)])
    assert abs(shared[:, 0].mean()) > 0.5  # pooled: the channels' levels stay apart


def test_utterance_cmvn_pools_the_channels_unless_per_channel():
    [row] = [{"key": "u", "feats": _feats()}]
    [pooled] = IterableWrapper([row]).apply_cmvn(utterance=True)
    [own] = IterableWrapper([row]).apply_cmvn(utterance=True, per_channel=True)
    np.testing.assert_allclose(pooled["feats"].mean(axis=(0, 1)), 0.0, atol=1e-4)
    assert abs(pooled["feats"][:, 0].mean()) > 0.5
    np.testing.assert_allclose(own["feats"].mean(axis=0), 0.0, atol=1e-4)
    for c in range(3):
        np.testing.assert_allclose(own["feats"][:, c], normalize_features(row["feats"][:, c]),
                                   atol=1e-5)
    mono = {"key": "m", "feats": row["feats"][:, 0].copy()}  # per channel of one channel
    [m] = IterableWrapper([mono]).apply_cmvn(utterance=True, per_channel=True)
    np.testing.assert_array_equal(m["feats"], normalize_features(mono["feats"]))


def test_per_channel_stats_refuse_another_channel_count_naming_the_key():
    stats = compute_cmvn_stats([_feats()], progress=False, per_channel=True)
    for key, feats in (("mono", _feats(channels=1)[:, 0]), ("three", _feats(channels=2))):
        rows = [{"key": key, "feats": feats}]
        with pytest.raises(DataError, match=rf"\(key '{key}'\): apply_cmvn: the CMVN statistics "
                                            r"are per channel, for 3 channels"):
            list(IterableWrapper(rows).apply_cmvn(stats))


def test_per_channel_stats_computation_refuses_mono_and_a_channel_change_naming_the_key():
    with pytest.raises(DataError, match=r"\(key 'm'\).*per-channel CMVN needs \(frames, "
                                        r"channels, dim\)"):
        compute_cmvn_stats([{"key": "m", "feats": np.ones((4, 5), np.float32)}],
                           progress=False, per_channel=True)
    rows = [{"key": "a", "feats": _feats(channels=2)}, {"key": "b", "feats": _feats(channels=3)}]
    with pytest.raises(DataError, match=r"\(key 'b'\).*per-channel statistics of 2 channels"):
        compute_cmvn_stats(rows, progress=False, per_channel=True)
    with pytest.raises(ValueError, match="per_channel=True is for utterance CMVN"):
        IterableWrapper(rows).apply_cmvn(CmvnStats.empty(40), per_channel=True)


def test_a_cmvn_json_with_three_axes_is_named(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"mean_stat": [[[1.0]]], "var_stat": [[[1.0]]], "frame_num": 1}))
    with pytest.raises(DataError, match=r"bad.json.*equal-length non-empty lists"):
        CmvnStats.load(path)


# ------------------------------------------------------------------------------ noise


@pytest.mark.parametrize("noise_channels", [1, 2])
def test_the_snr_over_all_channels_is_the_snr_drawn(tmp_path, noise_channels):
    rng = np.random.default_rng(5)
    rows = []
    for i, length in enumerate((30000, 900, 7000)):  # longer and shorter than the utterances
        path = tmp_path / f"n{i}.wav"
        noise = rng.standard_normal((length, noise_channels)) * 0.05
        soundfile.write(path, noise.astype(np.float32), RATE, subtype="FLOAT")
        rows.append({"key": f"n{i}", "audio_path": str(path)})
    manifest = tmp_path / "noise.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    source = IterableWrapper([str(manifest)]).open_files(mode="b").parse_manifest().load_audio()
    clean = _stereo()
    out = list(IterableWrapper(clean).add_noise(source, snr_db=(-5.0, 20.0), babble=2,
                                                pool_size=3, seed=1))
    for before, after in zip(clean, out):
        [entry] = after[AUGMENT]
        assert after["audio"].shape == before["audio"].shape
        assert abs(snr_db(before["audio"], after["audio"]) - entry["snr_db"]) < SNR_TOLERANCE_DB
        residual = after["audio"].astype(np.float64) - before["audio"]
        same = np.allclose(residual[:, 0], residual[:, 1], atol=1e-6)
        assert same is (noise_channels == 1)  # mono on every channel, else channel by channel


def _residual_gain(residual: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """The gains ``g`` with ``residual ≈ g × noise``, one per channel."""
    return (residual * noise).sum(axis=0) / (noise * noise).sum(axis=0)


def test_noise_of_the_utterances_channels_goes_channel_by_channel():
    [utt] = _stereo(1)
    length = utt["audio"].shape[0]
    rng = np.random.default_rng(1)
    noise = (rng.standard_normal((length, 2)) * [0.05, 0.2]).astype(np.float32)  # offset 0
    [out] = IterableWrapper([utt]).add_noise([{"key": "st", "audio": noise,
                                               "sample_rate": RATE}], snr_db=(4.0, 4.0))
    residual = out["audio"].astype(np.float64) - utt["audio"]
    gain = _residual_gain(residual, noise.astype(np.float64))
    assert gain[0] == pytest.approx(gain[1], rel=1e-4)  # one gain: the level differences kept
    np.testing.assert_allclose(residual, gain[0] * noise, atol=1e-6)


def test_a_mono_utterance_takes_the_first_channel_of_a_multichannel_noise():
    utt = {"key": "m", "audio": _stereo(1)[0]["audio"][:, 0].copy(), "sample_rate": RATE}
    noise = np.random.default_rng(2).standard_normal((utt["audio"].shape[0], 2))
    noise = noise.astype(np.float32)
    [out] = IterableWrapper([utt]).add_noise([{"key": "st", "audio": noise,
                                               "sample_rate": RATE}], snr_db=(4.0, 4.0))
    residual = out["audio"].astype(np.float64) - utt["audio"]
    gain = _residual_gain(residual[:, None], noise[:, :1].astype(np.float64))
    np.testing.assert_allclose(residual, gain[0] * noise[:, 0], atol=1e-6)


def test_noise_of_another_channel_count_is_named_with_the_utterance():
    noise = [{"key": "three", "audio": np.ones((500, 3), np.float32), "sample_rate": RATE}]
    with pytest.raises(DataError, match=r"three.*\(key 'u0'\): add_noise: the noise 'three' "
                                        r"has 3 channels and the utterance 2") as err:
        list(IterableWrapper(_stereo(1)).add_noise(noise))
    assert err.value.key == "u0" and err.value.source == "three"


# ------------------------------------------------------------------------------ reverberation


def test_a_multichannel_response_keeps_the_delays_between_channels():
    audio = _stereo(1)[0]["audio"]
    rir = np.zeros((300, 2), np.float32)
    rir[10, 0], rir[15, 1] = 1.0, 0.5  # the second microphone: 5 samples later, half as loud
    out = convolve_rir(audio, rir)
    assert out.shape == audio.shape
    energy = np.sum(audio.astype(np.float64) ** 2)
    assert np.sum(out.astype(np.float64) ** 2) == pytest.approx(energy, rel=1e-5)
    scale = out[100, 0] / audio[100, 0]  # one scale for both channels
    np.testing.assert_allclose(out[:, 0], scale * audio[:, 0], atol=1e-5)
    np.testing.assert_allclose(out[5:, 1], scale * 0.5 * audio[:-5, 1], atol=1e-5)
    np.testing.assert_allclose(out[:5, 1], 0.0, atol=1e-6)


def test_a_mono_response_applies_to_every_channel_and_a_wrong_shape_is_refused():
    audio = _stereo(1)[0]["audio"]
    stereo = np.stack([audio[:, 0], -audio[:, 0]], axis=1)
    rir = np.zeros(200, np.float32)
    rir[3], rir[40] = 1.0, 0.4
    out = convolve_rir(stereo, rir)
    np.testing.assert_allclose(out[:, 0], -out[:, 1], atol=1e-6)
    np.testing.assert_allclose(convolve_rir(stereo, rir[:, None].repeat(2, axis=1)), out,
                               atol=1e-6)
    with pytest.raises(ValueError, match=r"a response of shape \(200, 3\) for audio of shape"):
        convolve_rir(audio, rir[:, None].repeat(3, axis=1))
    with pytest.raises(ValueError, match=r"a response of shape \(200, 2\)"):
        convolve_rir(audio[:, 0].copy(), rir[:, None].repeat(2, axis=1))


def test_reverberate_stage_with_a_response_set_per_channel_and_a_wrong_count_named():
    rir = np.zeros((200, 2), np.float32)
    rir[10, 0], rir[12, 1] = 1.0, 0.8
    rirs = [{"key": "array", "audio": rir, "sample_rate": RATE}]
    clean = _stereo(2)
    out = list(IterableWrapper(clean).reverberate(rirs))
    for before, after in zip(clean, out):
        assert after[AUGMENT] == [{"kind": "reverb", "keys": ["array"]}]
        np.testing.assert_array_equal(after["audio"], convolve_rir(before["audio"], rir))
    three = [{"key": "ring", "audio": np.ones((50, 3), np.float32), "sample_rate": RATE}]
    with pytest.raises(DataError, match=r"\(key 'u0'\): reverberate: the response 'ring' has 3 "
                                        r"channels and the utterance 2"):
        list(IterableWrapper(clean).reverberate(three))


# ------------------------------------------------------------------------------ resume


def test_a_multichannel_augmented_pass_resumes_exactly():
    rng = np.random.default_rng(9)
    noise = [{"key": f"n{i}", "audio": (rng.standard_normal((3000 * (i + 1), c)) * 0.05)
              .astype(np.float32), "sample_rate": RATE} for i, c in enumerate((1, 2, 2, 1))]
    rir = np.zeros((120, 2), np.float32)
    rir[4, 0], rir[7, 1], rir[30:, :] = 1.0, 0.7, 0.01
    rirs = [{"key": "a", "audio": rir, "sample_rate": RATE},
            {"key": "b", "audio": rir[:, 0].copy(), "sample_rate": RATE}]
    clean = _stereo(30)

    def make():
        pipe = IterableWrapper(clean).shuffle_samples(seed=1).reverberate(rirs, p=0.7, seed=2)
        pipe = pipe.add_noise(noise, snr_db=(0.0, 10.0), babble=2, pool_size=3, seed=3)
        pipe = pipe.block_batch(PaddedArea(20000), shuffle_window=2, seed=5)
        return PipeDataset(pipe.collate(collate_fn=PadCollate()))

    def summary(batch):
        return (tuple(batch["key"]), float(batch["audio"].double().sum()),
                json.dumps(batch[AUGMENT]))

    full = [summary(b) for b in make()]
    dataset = make()
    it = iter(dataset)
    head = [summary(next(it)) for _ in range(2)]
    state = json.loads(json.dumps(dataset.state_dict()))
    it.close()
    again = make()
    again.load_state_dict(state)
    assert len(full) > 3 and head + [summary(b) for b in again] == full


def test_statistics_refuse_features_and_statistics_of_another_layout():
    per_channel = CmvnStats.empty((2, 40))
    with pytest.raises(ValueError, match=r"per-channel statistics of shape \(2, 40\) cannot "
                                         r"take features of shape \(5, 3, 40\)"):
        per_channel.update(_feats(frames=5, channels=3))
    with pytest.raises(ValueError, match=r"cannot merge statistics of shape \(40,\) and "
                                         r"\(2, 40\)"):
        CmvnStats.empty(40).merge(per_channel)


def test_convolve_rir_refuses_a_response_with_three_axes():
    with pytest.raises(ValueError, match=r"the response must be \(L,\) or \(L, C\), got shape "
                                         r"\(4, 2, 1\)"):
        convolve_rir(np.ones(10, np.float32), np.ones((4, 2, 1), np.float32))


def test_batched_cmvn_refuses_per_channel_statistics():
    stats = compute_cmvn_stats([_feats()], progress=False, per_channel=True)
    batch = {"key": ["u"], "feats": torch.ones(1, 5, 40), "feats_len": torch.tensor([5])}
    with pytest.raises(ValueError, match=r"batched=True\): the statistics are per channel"):
        list(IterableWrapper([batch]).apply_cmvn(stats, batched=True))
