"""DecodeCollate: raw samples decoded straight into the padded batch (issue 20).

Checked on the demo corpus's recorded speech (FLAC) and on WAV/FLAC written here: the batch is
the one ``decode_sample`` then ``PadCollate`` give (fields, names, rates, values bit for bit),
for mono and multi-channel audio, every channel choice and output dtype; every bad payload
raises what the decode road raises, naming the member and the key; in DataLoader workers the
audio is decoded into the worker's shared memory and the batches equal the decode road's.
"""

from __future__ import annotations

import glob
import io

import numpy as np
import pytest
import soundfile
import torch

import speechpipe as sp
from speechpipe.demo import DEMO_CORPUS
from speechpipe.errors import (
    AudioFormatError, ChannelMismatchError, DataError, SampleRateError, UnsafeInputError,
)
from speechpipe.pipes.collate import DecodeCollate, PadCollate
from speechpipe.pipes.decode import DeferredAudio, decode_sample
from speechpipe.pipes.shards import ShardWriter

FLACS = sorted(glob.glob(f"{DEMO_CORPUS}/**/*.flac", recursive=True))


def encoded(audio: np.ndarray, rate: int = 16000, fmt: str = "FLAC",
            subtype: str = "PCM_16") -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, audio, rate, format=fmt, subtype=subtype)
    return buffer.getvalue()


def speech_samples(count: int = 6) -> list[dict]:
    """Raw samples of the demo corpus's recorded speech, with a transcript and a label."""
    out = []
    for i, path in enumerate(FLACS[:count]):
        with open(path, "rb") as f:
            out.append({"key": f"u{i}", "source": "demo.tar", "flac": memoryview(f.read()),
                        "txt": f"words {i}".encode(), "n.cls": str(i).encode()})
    return out


def assert_same_batch(got: dict, expected: dict) -> None:
    assert list(got) == list(expected)
    for name, value in expected.items():
        if isinstance(value, torch.Tensor):
            assert got[name].dtype == value.dtype, name
            assert torch.equal(got[name], value), name
        else:
            assert got[name] == value, name


def test_recorded_speech_decoded_into_the_batch_equals_decode_then_pad_collate():
    raws = speech_samples()
    expected = PadCollate()([decode_sample(r) for r in raws])
    got = DecodeCollate()(raws)
    assert_same_batch(got, expected)
    assert list(got) == ["key", "source", "audio", "audio_len", "sample_rate", "text", "n"]
    assert got["audio"].shape[0] == len(raws) and len(set(got["audio_len"].tolist())) > 1


@pytest.mark.parametrize("channels", ["keep", "downmix", 0, 1])
@pytest.mark.parametrize("fmt", ["FLAC", "WAV"])
def test_multichannel_audio_and_every_channel_choice_equal_the_decode_road(channels, fmt):
    rng = np.random.default_rng(0)
    raws = [{"key": f"s{i}", f"{fmt.lower()}": encoded(
        rng.uniform(-0.5, 0.5, (800 + 300 * i, 2)).astype(np.float32), fmt=fmt)}
        for i in range(3)]
    expected = PadCollate()([decode_sample(r, channels=channels) for r in raws])
    got = DecodeCollate(channels=channels)(raws)
    assert_same_batch(got, expected)
    assert got["audio"].ndim == (3 if channels == "keep" else 2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_an_output_dtype_gives_the_decode_roads_values_in_it(dtype):
    raws = speech_samples(3)
    expected = PadCollate(dtype=dtype)([decode_sample(r) for r in raws])
    assert_same_batch(DecodeCollate(dtype=dtype)(raws), expected)


def test_renamed_and_second_audio_fields_get_their_own_rates_and_pads():
    rng = np.random.default_rng(1)
    raws = [{"key": f"k{i}", "mic1.flac": encoded(rng.uniform(-1, 1, 500 + i).astype(np.float32)),
             "mic2.wav": encoded(rng.uniform(-1, 1, 700 - i).astype(np.float32), 8000, "WAV")}
            for i in range(3)]
    options = dict(rename={"mic1.flac": "audio"}, pad_values={"mic2": -1.0})
    expected = PadCollate(pad_values={"mic2": -1.0})(
        [decode_sample(r, rename=options["rename"]) for r in raws])
    got = DecodeCollate(**options)(raws)
    assert_same_batch(got, expected)
    assert got["mic2_sample_rate"].tolist() == [8000] * 3
    assert got["mic2"][2, -1].item() == -1.0  # the shortest row is padded with its value


def test_deferred_audio_describes_the_array_it_decodes_to():
    raw = speech_samples(1)[0]
    deferred = decode_sample(raw, defer_audio=True)["audio"]
    assert isinstance(deferred, DeferredAudio)
    audio, rate = soundfile.read(io.BytesIO(bytes(raw["flac"])), dtype="float32")
    assert deferred.shape == audio.shape and deferred.ndim == 1
    assert deferred.sample_rate == rate and deferred.nbytes == audio.nbytes
    out = np.empty(audio.shape, np.float32)
    deferred.read_into(out)
    assert np.array_equal(out, audio)


def test_a_corrupt_payload_raises_the_decode_roads_error_naming_member_and_key():
    raws = speech_samples(2)
    raws[1]["flac"] = b"this is not audio at all, just text" * 20
    with pytest.raises(AudioFormatError) as caught:
        DecodeCollate()(raws)
    with pytest.raises(AudioFormatError) as reference:
        decode_sample(raws[1])
    assert str(caught.value) == str(reference.value)
    assert "u1.flac" in str(caught.value) and "'u1'" in str(caught.value)


def test_a_truncated_wav_is_refused_not_padded():
    whole = encoded(np.full(16000, 0.25, np.float32), fmt="WAV")
    raws = [{"key": "ok", "wav": encoded(np.zeros(100, np.float32), fmt="WAV")},
            {"key": "cut", "wav": whole[:len(whole) // 3]}]
    with pytest.raises(DataError, match=r"truncated WAV: its header promises 32000 bytes"):
        DecodeCollate()(raws)


def test_a_flac_cut_short_raises_instead_of_giving_fewer_samples():
    whole = encoded(np.random.default_rng(2).uniform(-1, 1, 48000).astype(np.float32))
    raws = [{"key": "cut", "flac": whole[:len(whole) // 2]}]
    with pytest.raises(DataError) as caught:
        DecodeCollate()(raws)
    assert "'cut'" in str(caught.value)


def test_mixed_channel_counts_and_rates_are_refused_naming_the_keys():
    mono = encoded(np.zeros(400, np.float32))
    stereo = encoded(np.zeros((400, 2), np.float32))
    with pytest.raises(ChannelMismatchError, match="'b'"):
        DecodeCollate()([{"key": "a", "flac": mono}, {"key": "b", "flac": stereo}])
    other_rate = encoded(np.zeros(400, np.float32), rate=8000)
    with pytest.raises(SampleRateError, match=r"8000 Hz: 1 \['b'\]"):
        DecodeCollate()([{"key": "a", "flac": mono}, {"key": "b", "flac": other_rate},
                         {"key": "c", "flac": mono}])


def test_a_channel_the_audio_lacks_and_unsafe_fields_are_refused():
    mono = encoded(np.zeros(400, np.float32))
    with pytest.raises(DataError, match=r"channel 1 does not exist: the audio has 1 channel"):
        DecodeCollate(channels=1)([{"key": "a", "flac": mono}])
    with pytest.raises(UnsafeInputError):
        DecodeCollate()([{"key": "a", "flac": mono, "x.pkl": b"\x80\x04."}])
    with pytest.raises(ValueError, match="unknown must be"):
        DecodeCollate(unknown="ignore")


class _Noting(DecodeCollate):
    """Notes, in the worker, whether the audio was decoded into shared memory."""

    def __call__(self, samples):
        batch = super().__call__(samples)
        batch["shared"] = batch["audio"].is_shared()
        return batch


def _one(sample) -> int:  # raw samples have no length to measure: batches of a count
    return 1


def test_in_dataloader_workers_audio_is_decoded_into_shared_memory_as_the_decode_road(
        tmp_path):
    raws = speech_samples(12)
    with ShardWriter(str(tmp_path / "s-%03d.tar"), maxcount=6) as writer:
        for raw in raws:
            writer.write({"key": raw["key"], "flac": bytes(raw["flac"]), "txt": raw["txt"]})
    shards = writer.paths

    def loader(collate, decode_first):
        pipe = sp.IterableWrapper(shards).sharded_shuffle(buffer_size=4, seed=3)
        if decode_first:
            pipe = pipe.decode()
        pipe = pipe.block_batch(sp.SampleCount(4, length=_one), seed=3)
        pipe = pipe.collate(collate_fn=collate)
        return sp.build_loader(pipe, num_workers=2, seed=3)

    got = list(loader(_Noting(), decode_first=False))
    expected = list(loader(PadCollate(), decode_first=True))
    assert len(got) == len(expected) == 4  # each worker: a shard of 6 in batches of 4 and 2
    for batch, reference in zip(got, expected):
        assert batch.pop("shared") is True  # the batch's memory, written once by soundfile
        assert_same_batch(batch, reference)


# ---------------------------------------------------------------------------------------------
# The road: shards of recorded speech, batched on the index's durations, decoded in the batch


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """The demo corpus's dev-clean speech packed by pack (FLAC members, index.jsonl)."""
    root = tmp_path_factory.mktemp("packed")
    manifests = sp.recipes.librispeech.prepare_librispeech(DEMO_CORPUS, root / "m",
                                                           parts=["dev-clean"], progress=False)
    sp.pack_data(None, None, root / "shards", manifests=[manifests["dev-clean"]],
                 utts_per_shard=5, progress=False)
    rows = {r["key"]: r for r in sp.recipes.manifest_samples([manifests["dev-clean"]])}
    return root / "shards", rows


def test_durations_from_the_index_are_the_manifests_durations(packed):
    shards, rows = packed
    raw = list(sp.IterableWrapper([str(shards)]).sharded_shuffle(buffer_size=4, seed=0)
               .durations_from_index())
    assert sorted(s["key"] for s in raw) == sorted(rows)
    for sample in raw:
        assert sample["duration"] == pytest.approx(rows[sample["key"]]["duration"], abs=1e-4)
        assert isinstance(sample["flac"], (bytes, memoryview))  # nothing decoded


def test_recorded_speech_batched_on_index_durations_decodes_into_batches_in_workers(packed):
    # The road of features on the device (README): workers read, bucket and batch undecoded
    # samples on the index's durations and decode each batch straight into shared memory.
    shards, rows = packed
    budget = sp.PaddedArea(budget=40.0, length="duration")
    pipe = (sp.IterableWrapper([str(shards)]).sharded_shuffle(buffer_size=8, seed=1)
            .durations_from_index().bucket_by_length(16, budget=budget, seed=1)
            .block_batch(budget, seed=1)
            .collate(collate_fn=sp.DecodeCollate(drop=("source",))))
    loader = sp.build_loader(pipe, num_workers=2, seed=1)
    seen = []
    for batch in loader:
        # meta: the manifest's other fields, kept by pack as a JSON member (issue 32.9)
        assert list(batch) == ["key", "audio", "audio_len", "sample_rate", "meta", "text",
                               "duration"]
        assert batch["audio"].shape[1] * len(batch["key"]) <= 40.0 * 16000  # the budget
        for row, key in enumerate(batch["key"]):
            audio, rate = soundfile.read(rows[key]["audio_path"], dtype="float32")
            n = int(batch["audio_len"][row])
            assert n == len(audio) and rate == batch["sample_rate"][row]
            assert torch.equal(batch["audio"][row, :n], torch.from_numpy(audio))
            assert not batch["audio"][row, n:].any()
        seen.extend(batch["key"])
    assert sorted(seen) == sorted(rows)
    [done] = sp.IterableWrapper([batch]).compute_features("fbank", batched=True, device="cpu")
    assert done["feats"].shape[0] == len(batch["key"])  # then features on the device


def test_a_key_or_shard_the_index_does_not_hold_is_named(packed, tmp_path):
    shards, _ = packed
    stranger = tmp_path / "other.tar"
    with ShardWriter(str(tmp_path / "x-%03d.tar"), maxcount=5) as writer:  # no index beside
        writer.write({"key": "nobody", "txt": b"hi"})
    lonely = writer.paths[0]
    with pytest.raises(sp.MissingDataError, match=r"no shard index for this shard") as caught:
        list(sp.IterableWrapper([{"key": "nobody", "source": lonely}]).durations_from_index())
    assert lonely in str(caught.value) and "'nobody'" in str(caught.value)
    index = sp.ShardIndex.read(str(shards))
    first = index.paths()[0]
    with pytest.raises(DataError, match=r"key is not in its shard's entry") as caught:
        list(sp.IterableWrapper([{"key": "ghost", "source": first}])
             .durations_from_index(index))
    assert "'ghost'" in str(caught.value) and first in str(caught.value)
    with pytest.raises(DataError, match="the shard is not in the shard index"):
        list(sp.IterableWrapper([{"key": "u", "source": str(stranger)}])
             .durations_from_index(index))
    with pytest.raises(DataError, match="has no shard 'source'"):
        list(sp.IterableWrapper([{"key": "u"}]).durations_from_index(index))


def mixed_rate_samples() -> list[dict]:
    """The demo corpus's recorded speech at 8, 16 and 48 kHz (telephone, wideband, Common
    Voice's rate), resampled by torchaudio and encoded as FLAC, WAV and FLAC."""
    from speechpipe.pipes.audio import resample_audio

    out = []
    for i, raw in enumerate(speech_samples(6)):
        audio, rate = soundfile.read(io.BytesIO(bytes(raw["flac"])), dtype="float32")
        new = (8000, 16000, 48000)[i % 3]
        audio = resample_audio(audio, rate, new)
        field = "wav" if new == 8000 else "flac"
        out.append({"key": raw["key"], "source": "mixed.tar", "txt": raw["txt"],
                    field: encoded(np.clip(audio, -1, 1), new, field.upper())})
    return out


def test_mixed_sample_rates_are_resampled_into_the_rows_as_the_resample_stage_does():
    # Issue 32.3: DecodeCollate refused a batch mixing 8/16/48 kHz, advising to resample
    # before batching -- impossible when samples stay undecoded until collation.
    from speechpipe.pipes.audio import resample_audio

    raws = mixed_rate_samples()
    got = DecodeCollate(sample_rate=16000)(raws)
    decoded = [decode_sample(r) for r in raws]
    rates = [d["sample_rate"] for d in decoded]
    assert sorted(set(rates)) == [8000, 16000, 48000]
    for d in decoded:  # the decode road: decode, then the resample stage's function
        d["audio"], d["sample_rate"] = resample_audio(d["audio"], d["sample_rate"], 16000), 16000
    assert_same_batch(got, PadCollate()(decoded))
    assert got["sample_rate"].tolist() == [16000] * 6
    for i, d in enumerate(decoded):  # the same duration at the new rate
        frames = soundfile.info(io.BytesIO(raws[i].get("flac") or raws[i]["wav"])).frames
        assert got["audio_len"][i] == -(-frames * 16000 // rates[i])
    with pytest.raises(SampleRateError, match=r"DecodeCollate\(sample_rate=rate\)"):
        DecodeCollate()(raws)


def test_resampling_decode_collate_in_dataloader_workers_equals_in_process():
    raws = mixed_rate_samples()
    pipe = sp.IterableWrapper([raws[:3], raws[3:]]).collate(
        collate_fn=DecodeCollate(sample_rate=16000))
    loader = sp.build_loader(pipe, num_workers=1, seed=0, resumable=False)
    expected = [DecodeCollate(sample_rate=16000)(part) for part in (raws[:3], raws[3:])]
    for batch, want in zip(loader, expected):
        assert_same_batch(batch, want)


@pytest.mark.parametrize("rate", [0, 16000.0, True, "16k"])
def test_decode_collate_refuses_a_sample_rate_that_is_not_a_positive_int(rate):
    with pytest.raises(ValueError, match="sample_rate must be an int >= 1"):
        DecodeCollate(sample_rate=rate)
