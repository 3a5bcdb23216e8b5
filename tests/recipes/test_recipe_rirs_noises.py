"""The RIRS_NOISES recipe on a fixture in its official layout
(speechpipe.testing.write_rirs_noises): the Kaldi lists read into exact manifests, malformed
lines and absent files named by list:line, the zip downloaded from a local mirror and extracted
safely, a response source for reverberate."""

from __future__ import annotations

import hashlib
import zipfile

import numpy as np
import pytest
import soundfile

from test_recipes_common import manifest_rows

import speechpipe  # noqa: F401  (registers the pipes)
from speechpipe.errors import DataError, MissingDataError
from speechpipe.pipes._core import IterableWrapper
from speechpipe.recipes import augment_source, get_recipe, manifest_path
from speechpipe.recipes.rirs_noises import (
    ARCHIVES,
    LISTS,
    download_rirs_noises,
    parse_list_line,
    prepare_rirs_noises,
)
from speechpipe.recipes._download import safe_extract
from speechpipe.testing import serve_directory, write_rirs_noises

PRESENT = ["smallroom", "mediumroom", "real_rirs", "isotropic_noises", "pointsource_noises"]


@pytest.fixture
def corpus(tmp_path):
    return write_rirs_noises(tmp_path / "data")


def _info(path: str) -> dict:
    info = soundfile.info(path)
    return {"duration": info.frames / info.samplerate, "sample_rate": info.samplerate}


def test_prepare_reads_each_list_into_an_exact_manifest(corpus, tmp_path):
    out = prepare_rirs_noises(corpus, tmp_path / "m", progress=False)
    assert list(out) == PRESENT  # largeroom is absent from the fixture: "auto" skips it
    assert out["smallroom"] == manifest_path(tmp_path / "m", "rirs_noises", "smallroom")
    small = manifest_rows(out["smallroom"])
    path = str((corpus / "simulated_rirs/smallroom/Room001/Room001-00001.wav").resolve())
    assert small[0] == {"key": "smallroom-Room001-00001", "audio_path": path,
                        "room": "smallroom-Room001", **_info(path)}
    assert [r["key"] for r in small] == [f"smallroom-Room00{r}-0000{k}" for r in (1, 2)
                                         for k in (1, 2)]
    [iso] = manifest_rows(out["isotropic_noises"])
    assert iso["noise_type"] == "isotropic"
    assert iso["room"] == "RVB2014_type1_rir_largeroom1_near_angla"
    point = manifest_rows(out["pointsource_noises"])
    assert [(r["key"], r["bg_fg_type"]) for r in point] == [("noise1", "background"),
                                                            ("noise2", "foreground")]
    assert all(r["noise_type"] == "point-source" and r["duration"] > 0 for r in point)


def test_a_list_asked_for_and_absent_is_named(corpus):
    with pytest.raises(MissingDataError, match="part 'largeroom' not found") as err:
        prepare_rirs_noises(corpus, parts="largeroom", progress=False)
    assert err.value.source.endswith(LISTS["largeroom"])


def test_parse_list_line_names_the_line_of_a_malformed_entry():
    with pytest.raises(DataError, match=r"^rir_list:3: expected '--option value' pairs"):
        parse_list_line("--rir-id r1 RIRS_NOISES/a.wav extra", source="rir_list", line=3)
    with pytest.raises(DataError, match=r"^noise_list:2: the line has no --rir-id or"):
        parse_list_line("--noise-type isotropic a.wav", source="noise_list", line=2)
    with pytest.raises(DataError, match="expected '--option value', got 'rir-id'"):
        parse_list_line("rir-id r1 a.wav", source="rir_list", line=1)


def test_a_malformed_list_line_fails_prepare_naming_it(corpus):
    listing = corpus / LISTS["mediumroom"]
    listing.write_text(listing.read_text() + "--rir-id broken\n")
    with pytest.raises(DataError) as err:
        prepare_rirs_noises(corpus, parts="mediumroom", progress=False)
    assert (err.value.source, err.value.line) == (str(listing), 5)


def test_a_repeated_id_is_named(corpus):
    listing = corpus / LISTS["pointsource_noises"]
    first = listing.read_text().splitlines()[0]
    listing.write_text(listing.read_text() + first + "\n")
    with pytest.raises(DataError, match="the same id twice \\(first on line 1\\)") as err:
        prepare_rirs_noises(corpus, parts="pointsource_noises", progress=False)
    assert err.value.key == "noise1"


def test_a_listed_wav_that_is_absent_is_named_or_skipped(corpus):
    (corpus / "simulated_rirs/smallroom/Room002/Room002-00002.wav").unlink()
    with pytest.raises(MissingDataError, match="Room002-00002.wav is absent") as err:
        prepare_rirs_noises(corpus, parts="smallroom", progress=False)
    assert err.value.line == 4 and err.value.key == "smallroom-Room002-00002"
    rows = prepare_rirs_noises(corpus, parts="smallroom", on_mismatch="skip",
                               progress=False)["smallroom"]
    assert len(rows) == 3


def _zip(corpus, path):
    with zipfile.ZipFile(path, "w") as zf:
        for file in sorted(corpus.rglob("*")):
            zf.write(file, f"RIRS_NOISES/{file.relative_to(corpus)}")


def test_download_of_the_zip_from_a_local_mirror(tmp_path):
    srv = tmp_path / "srv"
    srv.mkdir()
    archive = srv / ARCHIVES["all"].name
    _zip(write_rirs_noises(tmp_path / "src"), archive)
    md5 = "md5:" + hashlib.md5(archive.read_bytes()).hexdigest()
    with serve_directory(str(srv)) as url:
        got = download_rirs_noises(tmp_path / "data", base_url=url, checksums={"all": md5},
                                   progress=False)
    assert got == tmp_path / "data" / "RIRS_NOISES" and (got / ".completed").is_file()
    assert list(prepare_rirs_noises(got, progress=False)) == PRESENT
    assert ARCHIVES["all"].checksum == "md5:e6f48e257286e05de56413b4779d8ffb"  # OpenSLR's


@pytest.mark.parametrize("name", ["../evil.wav", "/abs/evil.wav", "RIRS_NOISES/../../x"])
def test_a_zip_member_escaping_the_target_is_refused(tmp_path, name):
    path = tmp_path / "evil.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("RIRS_NOISES/ok.txt", "fine")
        zf.writestr(name, "evil")
    with pytest.raises(DataError, match="refusing to extract") as err:
        safe_extract(path, tmp_path / "out", progress=False)
    assert err.value.member == name
    assert not (tmp_path / "out" / "RIRS_NOISES" / "ok.txt").exists()  # checked before writing
    assert not (tmp_path / "evil.wav").exists()


def test_a_zip_symlink_is_refused(tmp_path):
    path = tmp_path / "link.zip"
    with zipfile.ZipFile(path, "w") as zf:
        info = zipfile.ZipInfo("RIRS_NOISES/link")
        info.external_attr = (0o120777 << 16)
        zf.writestr(info, "/etc/passwd")
    with pytest.raises(DataError, match="symbolic link"):
        safe_extract(path, tmp_path / "out", progress=False)


def test_a_corrupt_zip_is_named(tmp_path):
    path = tmp_path / "broken.zip"
    _zip(write_rirs_noises(tmp_path / "src"), path)
    data = bytearray(path.read_bytes())
    data[40:4000] = b"\0" * 3960  # the first members' data and headers
    path.write_bytes(bytes(data))
    with pytest.raises(DataError, match="cannot extract") as err:
        safe_extract(path, tmp_path / "out", progress=False)
    assert err.value.source == str(path)


def test_prepared_responses_are_a_source_for_reverberate(corpus):
    rirs = augment_source(prepare_rirs_noises(corpus, parts="smallroom",
                                              progress=False)["smallroom"])
    rng = np.random.default_rng(0)
    clean = [{"key": f"u{i}", "audio": rng.standard_normal(8000).astype(np.float32) * 0.1,
              "sample_rate": 16000} for i in range(4)]
    out = list(IterableWrapper(clean).reverberate(rirs, seed=0))
    for before, after in zip(clean, out):
        assert after["augment"][0]["keys"][0].startswith("smallroom-Room")
        assert after["audio"].shape == before["audio"].shape
        assert np.sum(after["audio"].astype(np.float64) ** 2) == pytest.approx(
            np.sum(before["audio"].astype(np.float64) ** 2), rel=1e-4)


def test_the_recipe_is_registered():
    assert get_recipe("rirs_noises").prepare_rirs_noises is prepare_rirs_noises
