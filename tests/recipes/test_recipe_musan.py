"""The MUSAN recipe on a fixture in its official layout (speechpipe.testing.write_musan):
exact manifests per part, layout errors, download from a local mirror, a noise source for
add_noise."""

from __future__ import annotations

import hashlib
import tarfile

import numpy as np
import pytest
import soundfile

from test_recipes_common import manifest_rows

import speechpipe  # noqa: F401  (registers the pipes)
from speechpipe.errors import DataError, MissingDataError
from speechpipe.pipes._core import IterableWrapper
from speechpipe.pipes.audio import snr_db
from speechpipe.recipes import augment_source, get_recipe, manifest_path
from speechpipe.recipes.musan import ARCHIVES, PARTS, download_musan, prepare_musan
from speechpipe.testing import MUSAN_FIXTURE, serve_directory, write_musan


@pytest.fixture
def corpus(tmp_path):
    return write_musan(tmp_path / "data")


def test_prepare_writes_one_exact_manifest_per_part(corpus, tmp_path):
    out = prepare_musan(corpus, tmp_path / "m", progress=False)
    assert out == {p: manifest_path(tmp_path / "m", "musan", p) for p in PARTS}
    for part in PARTS:
        expected = []
        for source in sorted(MUSAN_FIXTURE[part]):
            for wav in sorted((corpus / part / source).glob("*.wav")):
                info = soundfile.info(str(wav))
                expected.append({"audio_path": str(wav.resolve()), "category": source,
                                 "duration": info.frames / info.samplerate, "key": wav.stem,
                                 "sample_rate": 16000})
        assert manifest_rows(out[part]) == expected
        assert len(expected) == sum(MUSAN_FIXTURE[part].values())


def test_auto_takes_the_parts_present_and_a_missing_part_is_named(corpus):
    import shutil

    shutil.rmtree(corpus / "music")
    assert sorted(prepare_musan(corpus, progress=False)) == ["noise", "speech"]
    with pytest.raises(MissingDataError, match="musan part 'music' not found"):
        prepare_musan(corpus, parts=["music"], progress=False)


def test_a_source_folder_without_annotations_is_not_musan(corpus):
    (corpus / "noise" / "free-sound" / "ANNOTATIONS").unlink()
    with pytest.raises(DataError, match="no ANNOTATIONS file") as err:
        prepare_musan(corpus, parts="noise", progress=False)
    assert err.value.source.endswith("noise/free-sound")


def test_a_part_without_wav_files_is_named(corpus):
    for wav in (corpus / "speech").glob("*/*.wav"):
        wav.unlink()
    with pytest.raises(DataError, match="no <source>/\\*.wav file in speech/"):
        prepare_musan(corpus, parts="speech", progress=False)


def test_the_same_key_in_two_sources_is_named(corpus):
    src = corpus / "noise" / "free-sound" / "noise-free-sound-0000.wav"
    (corpus / "noise" / "sound-bible" / src.name).write_bytes(src.read_bytes())
    with pytest.raises(DataError, match="the same key in two sources") as err:
        prepare_musan(corpus, parts="noise", progress=False)
    assert err.value.key == "noise-free-sound-0000"


def test_download_from_a_local_mirror_is_verified_and_idempotent(tmp_path):
    srv = tmp_path / "srv"
    srv.mkdir()
    corpus = write_musan(tmp_path / "src")
    archive = srv / ARCHIVES["all"].name
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(corpus, arcname="musan")
    md5 = "md5:" + hashlib.md5(archive.read_bytes()).hexdigest()
    with serve_directory(str(srv)) as url:
        got = download_musan(tmp_path / "data", base_url=url, checksums={"all": md5},
                             progress=False)
        assert got == tmp_path / "data" / "musan" and (got / ".completed").is_file()
        archive.unlink()  # a second call reads nothing from the server
        assert download_musan(tmp_path / "data", base_url=url, progress=False) == got
    assert sorted(prepare_musan(got, progress=False)) == list(PARTS)
    assert ARCHIVES["all"].checksum == "md5:0c472d4fc0c5141eca47ad1ffeb2a7df"  # OpenSLR's


def test_a_prepared_part_is_a_noise_source_for_add_noise(corpus, tmp_path):
    noise = augment_source(prepare_musan(corpus, tmp_path / "m", parts="noise",
                                         progress=False)["noise"])
    rng = np.random.default_rng(0)
    clean = [{"key": f"u{i}", "audio": rng.standard_normal(24000).astype(np.float32) * 0.1,
              "sample_rate": 16000} for i in range(6)]
    out = list(IterableWrapper(clean).add_noise(noise, snr_db=(5.0, 10.0), seed=1))
    for before, after in zip(clean, out):
        [entry] = after["augment"]
        assert entry["keys"][0].startswith("noise-")
        assert abs(snr_db(before["audio"], after["audio"]) - entry["snr_db"]) < 0.01


def test_the_recipe_is_registered():
    assert get_recipe("musan").prepare_musan is prepare_musan


def test_a_manifest_source_is_shuffled_at_each_pass_the_same_in_every_process(corpus):
    from speechpipe.pipes._core import propagate_epoch

    source = augment_source(prepare_musan(corpus, parts="speech", progress=False)["speech"])
    orders = []
    for epoch in (0, 1, 0):
        propagate_epoch(source, epoch)  # what add_noise does before each pass of its source
        orders.append([s["key"] for s in source])
    assert sorted(orders[0]) == sorted(orders[1]) and len(orders[0]) == 5
    assert orders[0] != orders[1] and orders[0] == orders[2]
