"""Several channels (issue 21): audio keeps its channel axis on every read path, the
``select_channel`` / ``downmix`` stages and the ``channels=`` option of ``decode`` and
``load_audio``, per-channel features, collation of ``(samples, channels)`` audio, and Kaldi
``wav.scp`` commands that pick a channel (``sox ... remix 1 |``).

Convention (speechpipe/sample.py): audio is time first, ``(samples,)`` mono and
``(samples, channels)`` for several channels; features of several channels are
``(frames, channels, dim)``; a batch is ``(batch, time, ...)``.
"""

from __future__ import annotations

import pathlib
import shutil
import sys

import numpy as np
import pytest
import soundfile

import speechpipe as sp
from speechpipe.errors import ChannelMismatchError, DataError
from speechpipe.loader import PipeDataset
from speechpipe.pipes._core import IterableWrapper
from speechpipe.pipes.decode import choose_channels
from speechpipe.pipes.audio import compute_features
from speechpipe.pipes.shards import write_shard
from speechpipe.sample import sample_duration, sample_length
from speechpipe.demo import DEMO_CORPUS

SPEECH_FILE = sorted(pathlib.Path(DEMO_CORPUS).rglob("*.flac"))[0]


@pytest.fixture(scope="module")
def stereo():
    """Real speech as channel 0, the same speech reversed in time and halved as channel 1."""
    speech, rate = soundfile.read(SPEECH_FILE, dtype="float32")
    speech = speech[: rate]  # one second
    return np.stack([speech, speech[::-1] * 0.5], axis=1), rate


def _sample(key, audio, rate):
    return {"key": key, "audio": audio, "sample_rate": rate}


# -------------------------------------------------------------------- every read path keeps C


def test_load_audio_decode_and_wav_scp_keep_the_channel_axis(tmp_path, stereo):
    audio, rate = stereo
    soundfile.write(tmp_path / "st.wav", audio, rate, subtype="FLOAT")
    [row] = IterableWrapper([{"key": "st", "audio_path": str(tmp_path / "st.wav")}]).load_audio()
    assert row["audio"].shape == (rate, 2) and np.array_equal(row["audio"], audio)

    write_shard(tmp_path / "s.tar", [{"key": "st", "flac": sp.encode_audio(audio, rate)}])
    [dec] = IterableWrapper([str(tmp_path / "s.tar")]).open_files(mode="b").read_shards().decode()
    assert dec["audio"].shape == (rate, 2)

    (tmp_path / "wav.scp").write_text(f"st {tmp_path / 'st.wav'}\n")
    [kal] = (IterableWrapper([str(tmp_path / "wav.scp")]).open_files(mode="b").parse_scp()
             .load_scp("wav"))
    assert np.array_equal(kal["audio"], audio)


def test_decode_and_load_audio_channels_option(tmp_path, stereo):
    audio, rate = stereo
    soundfile.write(tmp_path / "st.wav", audio, rate, subtype="FLOAT")
    rows = [{"key": "st", "audio_path": str(tmp_path / "st.wav")}]
    [one] = IterableWrapper(rows).load_audio(channels=1)
    [mix] = IterableWrapper(rows).load_audio(channels="downmix")
    assert np.array_equal(one["audio"], audio[:, 1]) and one["audio"].flags.c_contiguous
    np.testing.assert_allclose(mix["audio"], audio.mean(axis=1), atol=1e-7)

    write_shard(tmp_path / "s.tar", [{"key": "st", "wav": sp.encode_audio(audio, rate, "wav",
                                                                          subtype="FLOAT")}])
    shards = IterableWrapper([str(tmp_path / "s.tar")]).open_files(mode="b").read_shards()
    [dec] = shards.decode(channels=0)
    assert np.array_equal(dec["audio"], audio[:, 0])


def test_decode_channel_that_does_not_exist_names_the_member_and_count(tmp_path, stereo):
    audio, rate = stereo
    write_shard(tmp_path / "s.tar", [{"key": "st", "flac": sp.encode_audio(audio, rate)}])
    shards = IterableWrapper([str(tmp_path / "s.tar")]).open_files(mode="b").read_shards()
    with pytest.raises(DataError, match=r"s.tar \[member st.flac\] \(key 'st'\): channel 2 "
                                        r"does not exist: the audio has 2 channel\(s\)"):
        list(shards.decode(channels=2))


@pytest.mark.parametrize("bad, error", [(-1, ValueError), ("left", ValueError),
                                        (True, ValueError), (1.0, ValueError)])
def test_channels_option_is_validated_in_the_constructor(bad, error):
    with pytest.raises(error, match="channel"):
        IterableWrapper([]).load_audio(channels=bad)
    with pytest.raises(error, match="channel"):
        IterableWrapper([]).decode(channels=bad)


# -------------------------------------------------------------------- select_channel, downmix


def test_select_channel_and_downmix_stages(stereo):
    audio, rate = stereo
    rows = [_sample("st", audio, rate), _sample("mo", audio[:, 0].copy(), rate)]
    [picked] = IterableWrapper(rows[:1]).select_channel(1)
    assert np.array_equal(picked["audio"], audio[:, 1]) and picked["audio"].ndim == 1
    first = list(IterableWrapper(rows, deepcopy=False).select_channel(0))
    assert np.array_equal(first[0]["audio"], audio[:, 0]) and first[0]["audio"].flags.contiguous
    assert first[1]["audio"] is rows[1]["audio"]  # channel 0 of mono audio: the audio
    mixed = list(IterableWrapper(rows, deepcopy=False).downmix())
    expected = ((audio[:, 0].astype(np.float64) + audio[:, 1]) / 2).astype(np.float32)
    assert np.array_equal(mixed[0]["audio"], expected)
    assert mixed[1]["audio"] is rows[1]["audio"]  # mono passes unchanged
    assert rows[0]["audio"].shape == (rate, 2)  # the input samples are not changed
    assert len(IterableWrapper(rows).downmix()) == len(IterableWrapper(rows).select_channel(0)) == 2


@pytest.mark.parametrize("stage", ["select_channel", "downmix"])
def test_channel_stages_len_and_a_partial_epoch_then_restart(stereo, stage):
    audio, rate = stereo
    rows = [_sample(f"u{i}", audio[: 100 * (i + 1)], rate) for i in range(4)]
    pipe = getattr(IterableWrapper(rows), stage)()
    assert len(pipe) == 4
    unsized = getattr(IterableWrapper(iter(rows)).filter(lambda s: True), stage)()
    with pytest.raises(TypeError):
        len(unsized)
    it = iter(pipe)
    next(it)
    assert [s["key"] for s in pipe] == ["u0", "u1", "u2", "u3"]  # a new pass starts over


def test_select_channel_beyond_mono_names_the_key(stereo):
    audio, rate = stereo
    with pytest.raises(DataError, match=r"\(key 'mo'\): channel 1 does not exist: the audio "
                                        r"has 1 channel"):
        list(IterableWrapper([_sample("mo", audio[:, 0].copy(), rate)]).select_channel(1))


def test_select_channel_takes_an_index_only():
    with pytest.raises(TypeError, match="channel must be an int index"):
        IterableWrapper([]).select_channel("downmix")
    with pytest.raises(ValueError, match=">= 0"):
        IterableWrapper([]).select_channel(-1)


def test_choose_channels_refuses_audio_with_three_axes():
    with pytest.raises(DataError, match=r"\(key 'k'\): expected \(samples,\) or \(samples, "
                                        r"channels\) audio, got shape \(4, 2, 1\)"):
        choose_channels(np.zeros((4, 2, 1), np.float32), "downmix", key="k")


# -------------------------------------------------------------------- features, lengths


def test_features_of_stereo_are_each_channels_own(stereo):
    audio, rate = stereo
    [out] = IterableWrapper([_sample("st", audio, rate)]).compute_features("fbank")
    feats = out["feats"]
    assert feats.shape == (98, 2, 80) and feats.dtype == np.float32
    for c in range(2):
        assert np.array_equal(feats[:, c], compute_features(audio[:, c].copy(), rate))
    assert sample_length(out) == 98  # frames, whatever the channel count


def test_lengths_and_durations_do_not_depend_on_the_channel_count(stereo):
    audio, rate = stereo
    st, mo = _sample("st", audio, rate), _sample("mo", audio[:, 0].copy(), rate)
    assert sample_length(st) == sample_length(mo) == rate
    assert sample_duration(st) == sample_duration(mo) == 1.0


def test_perturbation_and_resampling_act_on_every_channel(stereo):
    audio, rate = stereo
    [out] = IterableWrapper([_sample("st", audio, rate)]).resample(8000)
    [mono] = IterableWrapper([_sample("mo", audio[:, 1].copy(), rate)]).resample(8000)
    assert out["audio"].shape == (8000, 2) and np.allclose(out["audio"][:, 1], mono["audio"],
                                                           atol=1e-6)


# -------------------------------------------------------------------- collation


def test_collate_pads_the_time_axis_of_multichannel_audio(stereo):
    audio, rate = stereo
    batch = sp.PadCollate()([_sample("a", audio, rate), _sample("b", audio[:1000], rate)])
    assert tuple(batch["audio"].shape) == (2, rate, 2)
    assert batch["audio_len"].tolist() == [rate, 1000]
    assert np.array_equal(batch["audio"][1, :1000].numpy(), audio[:1000])
    assert not batch["audio"][1, 1000:].any()


def test_collate_of_multichannel_features_pads_frames(stereo):
    audio, rate = stereo
    pipe = IterableWrapper([_sample("a", audio, rate), _sample("b", audio[:8000], rate)])
    batch = sp.PadCollate()(list(pipe.compute_features("fbank")))
    assert tuple(batch["feats"].shape) == (2, 98, 2, 80) and batch["feats_len"].tolist() == [98,
                                                                                             48]


def test_a_batch_mixing_mono_and_stereo_raises_channel_mismatch(stereo):
    audio, rate = stereo
    samples = [_sample("st", audio, rate), _sample("mo", audio[:, 0].copy(), rate)]
    with pytest.raises(ChannelMismatchError, match=r"\(key 'mo'\): field 'audio'.*\(\) in "
                                                   r"\['mo'\].*select_channel\(i\) or downmix"):
        sp.PadCollate()(samples)
    batch = sp.PadCollate()(list(IterableWrapper(samples).downmix()))
    assert tuple(batch["audio"].shape) == (2, rate)
    batch = sp.PadCollate()(list(IterableWrapper(samples).select_channel(0)))
    assert np.array_equal(batch["audio"][0].numpy(), batch["audio"][1].numpy())


def test_features_of_mono_beside_stereo_raise_channel_mismatch(stereo):
    audio, rate = stereo
    samples = [_sample("st", audio, rate), _sample("mo", audio[:, 0].copy(), rate)]
    feats = list(IterableWrapper(samples).compute_features("fbank"))
    with pytest.raises(ChannelMismatchError, match=r"field 'feats'"):
        sp.PadCollate()(feats)


def test_other_fields_with_different_trailing_dims_stay_a_plain_data_error():
    samples = [{"key": "a", "emb": np.zeros((2, 3))}, {"key": "b", "emb": np.zeros((2, 4))}]
    with pytest.raises(DataError, match="trailing dims") as info:
        sp.PadCollate()(samples)
    assert type(info.value) is DataError


# -------------------------------------------------------------------- Kaldi commands


def _stereo_scp(tmp_path, stereo, command):
    audio, rate = stereo
    soundfile.write(tmp_path / "in.wav", audio, rate, subtype="PCM_16")
    (tmp_path / "wav.scp").write_text(f"st {command} |\n")
    pipe = (IterableWrapper([str(tmp_path / "wav.scp")]).open_files(mode="b").parse_scp()
            .load_scp("wav", allow_commands=True))
    [out] = pipe
    return out, soundfile.read(tmp_path / "in.wav", dtype="float32")[0]


@pytest.mark.skipif(shutil.which("sox") is None, reason="sox is not installed")
def test_wav_scp_sox_remix_command_gives_one_channel(tmp_path, stereo):
    out, written = _stereo_scp(tmp_path, stereo, f"sox {tmp_path / 'in.wav'} -t wav - remix 2")
    assert out["audio"].shape == (stereo[1],) and np.array_equal(out["audio"], written[:, 1])


def test_wav_scp_python_command_picking_a_channel(tmp_path, stereo):
    # The same line without sox: a Python command writing channel 2 as WAV to its stdout.
    script = ("import io, sys, soundfile; a, r = soundfile.read(sys.argv[1], dtype='int16'); "
              "b = io.BytesIO(); soundfile.write(b, a[:, 1], r, format='WAV'); "
              "sys.stdout.buffer.write(b.getvalue())")
    command = f"{sys.executable} -c \"{script}\" {tmp_path / 'in.wav'}"
    out, written = _stereo_scp(tmp_path, stereo, command)
    assert out["audio"].shape == (stereo[1],) and np.array_equal(out["audio"], written[:, 1])


# -------------------------------------------------------------------- resume


def test_a_pipeline_with_channel_stages_resumes_exactly(tmp_path, stereo):
    # The channel stages hold nothing between yields: a cut resumes as an unbroken run does.
    audio, rate = stereo
    rows = []
    for i in range(6):
        soundfile.write(tmp_path / f"u{i}.wav", audio[: 2000 * (i + 1)], rate, subtype="FLOAT")
        rows.append({"key": f"u{i}", "audio_path": str(tmp_path / f"u{i}.wav")})

    def make():
        return (IterableWrapper(rows).shuffle_samples(seed=3).load_audio().select_channel(1)
                .downmix().block_batch(sp.PaddedArea(8000), seed=0))

    def keys(batch):
        assert all(s["audio"].ndim == 1 for s in batch)
        return [s["key"] for s in batch]

    full = [keys(b) for b in PipeDataset(make())]
    dataset = PipeDataset(make())
    it = iter(dataset)
    head = [keys(next(it))]
    state = dataset.state_dict()
    it.close()
    again = PipeDataset(make())
    again.load_state_dict(state)
    assert len(full) > 2 and head + [keys(b) for b in again] == full


def test_batched_features_of_stereo_equal_the_samples_one_by_one(stereo):
    audio, rate = stereo
    samples = [_sample("a", audio, rate), _sample("b", audio[:8000], rate)]
    one_by_one = list(IterableWrapper(samples).compute_features("fbank", dither=1.0, seed=4))
    batch = sp.PadCollate()(samples)
    [out] = IterableWrapper([batch]).compute_features("fbank", dither=1.0, seed=4, batched=True)
    assert tuple(out["feats"].shape) == (2, 98, 2, 80) and out["feats_len"].tolist() == [98, 48]
    for i, sample in enumerate(one_by_one):  # the same numbers, dither draws included
        n = len(sample["feats"])
        assert np.array_equal(out["feats"][i, :n].numpy(), sample["feats"])
        assert not out["feats"][i, n:].any()
