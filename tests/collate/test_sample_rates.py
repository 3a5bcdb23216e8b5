"""Sample rate as a first-class fact (issue 18, case 1): recipes resample to a target rate,
features and collation refuse rates they were not told about, and lengths in samples carry
their rate from ``pack`` to ``stats``."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile

import speechpipe as sp
from speechpipe.pack import pack_data
from speechpipe.pipes.collate import PadCollate
from speechpipe.pipes.sources import write_manifest
from speechpipe.recipes import eval_pipeline
from speechpipe.stats import read_durations


def _tone(seconds: float, rate: int) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)


@pytest.fixture
def mixed_rates(tmp_path):
    """Two 16 kHz utterances and one 8 kHz utterance of 1.5 s, as a manifest's samples."""
    rows = []
    for key, rate in (("a16", 16000), ("b08", 8000), ("c16", 16000)):
        path = tmp_path / f"{key}.flac"
        soundfile.write(path, _tone(1.5, rate), rate)
        rows.append({"key": key, "audio_path": str(path), "duration": 1.5,
                     "sample_rate": rate, "text": "hello"})
    return rows


# Invariant: features set up for one rate are never computed at another (issue 18.1).
def test_features_for_16k_refuse_an_8k_sample_naming_it_even_under_skip():
    rows = [{"key": "u8", "audio": _tone(1.0, 8000), "sample_rate": 8000}]
    pipe = sp.IterableWrapper(rows).compute_features("fbank", sample_rate=16000,
                                                     on_error="skip")
    with pytest.raises(sp.SampleRateError, match=r"key 'u8'.*8000 Hz audio.*resample"):
        list(pipe)


def test_features_for_16k_accept_16k_samples():
    rows = [{"key": "u", "audio": _tone(1.0, 16000), "sample_rate": 16000}]
    [s] = sp.IterableWrapper(rows).compute_features("fbank", sample_rate=16000)
    assert s["feats"].shape == (98, 80)


def test_batched_features_refuse_a_batch_at_another_rate():
    batch = {"key": ["u"], "audio": np.zeros((1, 8000), np.float32),
             "audio_len": np.array([8000]), "sample_rate": np.array([8000])}
    pipe = sp.IterableWrapper([batch]).compute_features("fbank", batched=True,
                                                        sample_rate=16000)
    with pytest.raises(sp.SampleRateError, match="8000 Hz"):
        list(pipe)


def test_collate_refuses_a_batch_mixing_rates_naming_the_keys():
    samples = [{"key": "a", "audio": _tone(0.1, 16000), "sample_rate": 16000},
               {"key": "b", "audio": _tone(0.1, 8000), "sample_rate": 8000}]
    with pytest.raises(sp.SampleRateError, match=r"8000 Hz: 1 \['b'\]; 16000 Hz: 1 \['a'\]"):
        PadCollate()(samples)
    batch = PadCollate(drop=("sample_rate",))(samples)  # dropping the field is the way out
    assert batch["audio"].shape[0] == 2


def test_recipe_pipelines_resample_to_16k_by_default(mixed_rates):
    [batch] = list(eval_pipeline(mixed_rates, features=None, budget=sp.SampleCount(3), shard=False))
    assert batch["key"] == ["a16", "b08", "c16"]
    assert batch["sample_rate"].tolist() == [16000] * 3
    assert batch["audio_len"].tolist() == [24000] * 3  # 1.5 s at 16 kHz, the 8 kHz one too


def test_recipe_pipelines_take_another_target_rate_or_none(mixed_rates):
    [batch] = list(eval_pipeline(mixed_rates, features=None, budget=sp.SampleCount(3), shard=False,
                                 sample_rate=8000))
    assert batch["audio_len"].tolist() == [12000] * 3
    with pytest.raises(sp.SampleRateError, match="b08"):  # None: own rates, never mixed
        list(eval_pipeline(mixed_rates, features=None, budget=sp.SampleCount(3), shard=False,
                           sample_rate=None))


def test_recipe_features_are_computed_at_the_target_rate(mixed_rates):
    # issue 18.1: the recipe computed fbank at 8 kHz and batched it with 16 kHz utterances
    from speechpipe.pipes.audio import compute_features, resample_audio

    [batch] = list(eval_pipeline(mixed_rates, budget=sp.SampleCount(3), shard=False))
    assert batch["feats_len"].tolist() == [148] * 3
    audio, _ = soundfile.read(mixed_rates[1]["audio_path"], dtype="float32")
    expected = compute_features(resample_audio(audio, 8000, 16000), 16000, "fbank",
                                num_mel_bins=80)
    assert np.allclose(batch["feats"][1].numpy(), expected, atol=1e-4)


def test_pack_records_the_rate_of_lengths_in_samples_and_stats_reads_it(tmp_path):
    # issue 18.1: an 8 kHz corpus packed in samples was read at 16 kHz by stats (half its
    # duration); the index now says at which rate its samples count.
    soundfile.write(tmp_path / "u1.flac", _tone(5.52, 8000), 8000)
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(f'{{"key": "u1", "audio_path": "{tmp_path}/u1.flac", "text": "x"}}\n')
    report = pack_data(None, None, manifests=[str(manifest)], d_out=tmp_path / "out",
                       progress=False)
    assert report.sample_rates == {8000: 1} and "8000 Hz: 1" in report.report()
    assert sp.ShardIndex.read(tmp_path / "out").sample_rate == 8000
    assert read_durations(str(tmp_path / "out")) == [pytest.approx(5.52, abs=1e-3)]


def test_pack_refuses_lengths_in_samples_of_mixed_rates_and_packs_them_in_seconds(
        tmp_path, mixed_rates):
    manifest = tmp_path / "m.jsonl"
    write_manifest(manifest, mixed_rates)
    with pytest.raises(sp.DataError, match=r"8000 Hz: 1, 16000 Hz: 2.*'b08'.*--length-unit"):
        pack_data(None, None, manifests=[str(manifest)], d_out=tmp_path / "out",
                  progress=False, length_unit="samples")  # issue 32: seconds by default
    report = pack_data(None, None, manifests=[str(manifest)], d_out=tmp_path / "out",
                       progress=False, length_unit="seconds")
    assert report.sample_rates == {8000: 1, 16000: 2}
    assert read_durations(str(tmp_path / "out")) == [pytest.approx(1.5)] * 3


def test_stats_reports_mixed_rates_with_counts_from_manifests_and_shards(tmp_path, mixed_rates):
    # issue 18.1: stats did not notice an 8 kHz file among 16 kHz ones
    manifest = tmp_path / "m.jsonl"
    write_manifest(manifest, mixed_rates)
    assert "sample rates        16000 Hz: 2, 8000 Hz: 1" in sp.corpus_stats(  # most common first
        str(manifest)).report()
    pack_data(None, None, manifests=[str(manifest)], d_out=tmp_path / "out", progress=False,
              length_unit="seconds", filter_group=["0:1.4", "1.4:2"])
    assert sp.ShardIndex.read(tmp_path / "out" / "1.4_2").sample_rates == {8000: 1, 16000: 2}
    assert sp.corpus_stats(str(tmp_path / "out" / "1.4_2")).sample_rates == {8000: 1,
                                                                             16000: 2}


@pytest.mark.parametrize("field, message", [
    ('"sample_rate": "16k"', "sample_rate must be an int"),
    ('"sample_rates": {"16k": 3}', "sample_rates must map rates to counts"),
    ('"sample_rates": [16000]', "sample_rates must map rates to counts"),
])
def test_an_index_with_malformed_rates_is_named(tmp_path, field, message):
    (tmp_path / "index.jsonl").write_text(
        '{"format": "speechpipe-shard-index", "version": 1, "length_unit": "samples", '
        f'{field}}}\n')
    with pytest.raises(sp.DataError, match=rf"index.jsonl:1: {message}"):
        sp.ShardIndex.read(tmp_path)


def test_shards_of_folders_at_different_rates_are_refused_together(tmp_path):
    for name, rate in (("a", 8000), ("b", 16000)):
        (tmp_path / name).mkdir()
        entry = sp.ShardEntry("data-00000.tar", 1, 10, ("u",), (rate,))
        sp.ShardIndex(str(tmp_path / name), [entry], "samples", sample_rate=rate).write()
    with pytest.raises(sp.DataError, match=r"different sample rates: \[8000, 16000\]"):
        sp.ShardIndex.for_shards([str(tmp_path / "a" / "data-00000.tar"),
                                  str(tmp_path / "b" / "data-00000.tar")])


# Issue 32, the new-user trial on real recorded speech (8, 16 and 48 kHz): pack stopped on a
# mixed corpus until told --length-unit seconds, the only unit that means one thing there.
def test_pack_counts_seconds_by_default_when_the_audio_has_several_rates(mixed_rates, tmp_path):
    manifest = tmp_path / "m.jsonl"
    write_manifest(manifest, mixed_rates)
    report = sp.pack_data(None, None, tmp_path / "shards", manifests=[str(manifest)],
                          progress=False)
    assert report.length_unit == "seconds" and "lengths in seconds" in report.report()
    index = sp.ShardIndex.read(str(tmp_path / "shards"))
    assert index.length_unit == "seconds" and index.lengths() == [1.5, 1.5, 1.5]
    write_manifest(manifest, [row for row in mixed_rates if row["sample_rate"] == 16000])
    report = sp.pack_data(None, None, tmp_path / "one", manifests=[str(manifest)],
                          progress=False)
    assert report.length_unit == "samples"  # one rate: samples, as before


def test_pack_at_several_rates_still_refuses_samples_named_or_groups_without_a_unit(
        mixed_rates, tmp_path):
    manifest = tmp_path / "m.jsonl"
    write_manifest(manifest, mixed_rates)
    for kwargs in ({"length_unit": "samples"}, {"filter_group": ["0:30000"]}):
        with pytest.raises(sp.DataError, match=r"the audio has 2 sample rates"):
            sp.pack_data(None, None, tmp_path / "out", manifests=[str(manifest)],
                         progress=False, **kwargs)
