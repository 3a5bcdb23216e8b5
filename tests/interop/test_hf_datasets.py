"""Hugging Face datasets (issue 22): a local audio dataset, map-style and streaming, read into
samples; its manifest rows through a recipe builder.

Invariant: a sample's audio is exactly what soundfile reads from the WAV file the dataset's
``Audio`` column was built from, whether the dataset holds the path or (after
``save_to_disk``) the bytes, and whether it is read map-style or streamed.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import soundfile

datasets = pytest.importorskip("datasets")

import speechpipe as sp  # noqa: E402
from speechpipe.errors import DataError  # noqa: E402
from speechpipe.testing import cut_and_resume  # noqa: E402

RATE = 16000


@pytest.fixture()
def corpus(tmp_path):
    """A dataset of 5 WAV files (the Audio column holds their paths), and the audio."""
    rng = np.random.default_rng(0)
    paths, audio = [], {}
    for i in range(5):
        path = str(tmp_path / f"u{i}.wav")
        soundfile.write(path, (rng.standard_normal(RATE // 4 * (i + 1)) * 0.1).astype(np.float32),
                        RATE)
        paths.append(path)
        audio[f"u{i}"] = soundfile.read(path, dtype="float32")[0]
    ds = datasets.Dataset.from_dict({"audio": paths, "id": list(audio),
                                     "text": [f"text {i}" for i in range(5)],
                                     "speaker": [i % 2 for i in range(5)]})
    return ds.cast_column("audio", datasets.Audio()), audio, tmp_path


def _check(samples, audio):
    assert [s["key"] for s in samples] == list(audio)
    for i, s in enumerate(samples):
        np.testing.assert_array_equal(s["audio"], audio[s["key"]])
        assert (s["sample_rate"], s["text"], s["speaker"]) == (RATE, f"text {i}", i % 2)
        assert s["duration"] == len(audio[s["key"]]) / RATE


def test_a_dataset_with_paths_gives_the_files_audio(corpus):
    ds, audio, _ = corpus
    _check(list(sp.read_hf_dataset(ds, key_column="id")), audio)


def test_saved_and_loaded_dataset_holds_the_bytes_and_gives_the_same_audio(corpus):
    ds, audio, root = corpus
    ds.save_to_disk(str(root / "ds"))
    for path in root.glob("u*.wav"):
        os.remove(path)  # the saved dataset embeds the bytes: the files are not needed
    loaded = datasets.load_from_disk(str(root / "ds"))
    _check(list(sp.read_hf_dataset(loaded, key_column="id")), audio)


def test_a_streaming_dataset_gives_the_same_samples(corpus):
    ds, audio, root = corpus
    ds.save_to_disk(str(root / "ds"))
    stream = datasets.load_from_disk(str(root / "ds")).to_iterable_dataset(num_shards=2)
    pipe = sp.read_hf_dataset(stream, key_column="id")
    _check(list(pipe), audio)
    with pytest.raises(TypeError, match="streaming dataset has no len"):
        len(pipe)


def test_keys_default_to_row_numbers(corpus):
    ds, _, _ = corpus
    assert [s["key"] for s in sp.read_hf_dataset(ds)] == ["0", "1", "2", "3", "4"]


def test_manifest_rows_name_their_row_and_load_hf_audio_reads_it(corpus):
    ds, audio, _ = corpus
    rows = list(sp.read_hf_dataset(ds, key_column="id", with_audio=False))
    assert [(r["hf_index"], r["duration"]) for r in rows] == [
        (i, len(audio[f"u{i}"]) / RATE) for i in range(5)]
    assert all("audio" not in r for r in rows)
    loaded = list(sp.IterableWrapper(rows[::-1]).load_hf_audio(ds))
    _check(loaded[::-1], audio)


def test_a_column_that_is_not_audio_is_refused(corpus):
    ds, _, _ = corpus
    with pytest.raises(ValueError, match="column 'text' must be an Audio feature"):
        sp.read_hf_dataset(ds, audio_column="text")


def test_manifest_rows_of_a_streaming_dataset_are_refused(corpus):
    ds, _, _ = corpus
    with pytest.raises(ValueError, match="with_audio=False needs a map-style Dataset"):
        sp.read_hf_dataset(ds.to_iterable_dataset(), with_audio=False)


def test_an_empty_key_names_the_row(corpus):
    ds, _, _ = corpus
    ds = ds.map(lambda row, i: {"id": "" if i == 2 else row["id"]}, with_indices=True)
    with pytest.raises(DataError, match="key column 'id' must hold a non-empty string") as err:
        list(sp.read_hf_dataset(ds, key_column="id"))
    assert err.value.source == "row 2"


@pytest.mark.parametrize("form", ["path", "bytes"])
def test_audio_that_is_not_audio_names_the_row(tmp_path, form):
    (tmp_path / "bad.wav").write_bytes(b"not audio at all")
    bad = datasets.Dataset.from_dict({"audio": [str(tmp_path / "bad.wav")], "id": ["bad"]})
    bad = bad.cast_column("audio", datasets.Audio())
    if form == "bytes":
        bad.save_to_disk(str(tmp_path / "ds"))
        bad = datasets.load_from_disk(str(tmp_path / "ds"))
        assert bad.cast_column("audio", datasets.Audio(decode=False))[0]["audio"]["bytes"]
    for with_audio in (True, False):
        with pytest.raises(DataError) as err:
            list(sp.read_hf_dataset(bad, key_column="id", with_audio=with_audio))
        assert (err.value.key, err.value.source) == ("bad", "row 0")


def test_a_missing_audio_file_is_named(corpus):
    ds, _, root = corpus
    os.remove(root / "u3.wav")
    with pytest.raises(sp.MissingDataError, match="u3.wav") as err:
        list(sp.read_hf_dataset(ds, key_column="id"))
    assert err.value.key == "u3"


def test_load_hf_audio_refuses_a_row_outside_the_dataset(corpus):
    ds, _, _ = corpus
    pipe = sp.IterableWrapper([{"key": "x", "hf_index": 5}]).load_hf_audio(ds)
    with pytest.raises(DataError, match="'hf_index' must be a row of the dataset") as err:
        list(pipe)
    assert err.value.key == "x"


def test_a_dataset_trains_through_train_pipeline_and_resumes_exactly(corpus):
    ds, audio, root = corpus
    ds.save_to_disk(str(root / "ds"))
    loaded = datasets.load_from_disk(str(root / "ds"))

    def make():
        pipe = sp.train_pipeline(sp.read_hf_dataset(loaded, key_column="id", with_audio=False),
                                 input=lambda p: p.load_hf_audio(loaded), budget=1.5,
                                 features="fbank", seed=2)
        return sp.build_loader(pipe, num_workers=0)

    batches = list(make())
    assert sorted(k for b in batches for k in b["key"]) == sorted(audio)
    assert all(b["feats"].shape[2] == 80 for b in batches)
    full, resumed = cut_and_resume(make, 1, lambda b: b["key"])
    assert resumed == full


def test_text_column_names_the_transcript_column(corpus):
    # Issue 32.11: Common Voice on the Hub calls the transcript 'sentence'; read_hf_dataset
    # had no way to make it the 'text' the text stages read.
    ds, audio, _ = corpus
    cv = ds.rename_column("text", "sentence")
    samples = list(sp.read_hf_dataset(cv, key_column="id", text_column="sentence"))
    assert [s["text"] for s in samples] == [f"text {i}" for i in range(5)]
    rows = list(sp.read_hf_dataset(cv, key_column="id", text_column="sentence",
                                   with_audio=False))
    assert [s["text"] for s in rows] == [f"text {i}" for i in range(5)]
    with pytest.raises(DataError, match=r"row 0 \(key 'u0'\).*no text column 'transcript' "
                                        r"\(columns: \['audio', 'id', 'sentence', 'speaker'\]"):
        list(sp.read_hf_dataset(cv, key_column="id", text_column="transcript"))
    with pytest.raises(DataError, match="text column 'speaker' must hold a str, got 0"):
        list(sp.read_hf_dataset(cv, key_column="id", text_column="speaker"))
    with pytest.raises(TypeError, match="text_column must be a non-empty str or None, got 3"):
        sp.read_hf_dataset(cv, text_column=3)
