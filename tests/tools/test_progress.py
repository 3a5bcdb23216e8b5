"""speechpipe.progress: a tqdm bar on a terminal, plain lines elsewhere (issue 18, case 9:
progress bars wrote runs of '\\r' redraws into non-TTY logs)."""

from __future__ import annotations

import io

import pytest
from tqdm import tqdm

from speechpipe.progress import LineProgress, progress_bar


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_progress_is_whole_lines_without_carriage_returns(capsys):
    with progress_bar(total=3, desc="pack: write", unit="shard", interval=0) as bar:
        for _ in range(3):
            bar.update(1)
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = err.splitlines()
    assert [line.split(",")[0] for line in lines] == [
        "pack: write: 1/3 shard (33%)", "pack: write: 2/3 shard (67%)",
        "pack: write: 3/3 shard (100%)", "pack: write: 3/3 shard (100%)"]


def test_lines_come_at_most_once_per_interval_and_once_at_the_end(capsys):
    for _ in progress_bar(range(500), desc="measure", unit="chunk", interval=3600):
        pass
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("measure: 500/500 chunk (100%), ")


def test_a_count_without_total_and_a_resumed_count():
    out = io.StringIO()
    with LineProgress(desc="download", unit="B", initial=100, interval=3600, file=out) as bar:
        bar.update(28)
    assert out.getvalue().startswith("download: 128 B, ")


def test_on_a_terminal_it_is_tqdm_and_disabled_shows_nothing(capsys):
    terminal = _Terminal()
    bar = progress_bar(total=2, desc="x", file=terminal)
    assert isinstance(bar, tqdm)
    bar.close()
    with progress_bar(total=2, desc="x", disable=True) as quiet:
        quiet.update(2)
    assert capsys.readouterr().err == ""


def test_pack_writes_progress_lines_into_a_log(tmp_path, capsys):
    import kaldiio
    import numpy as np

    from speechpipe.pack import pack_data

    with kaldiio.WriteHelper(f"ark,scp:{tmp_path}/f.ark,{tmp_path}/feats.scp") as w:
        for i in range(4):
            w(f"utt{i}", np.zeros((5 + i, 2), np.float32))
    (tmp_path / "text").write_text("".join(f"utt{i} a\n" for i in range(4)))
    pack_data(str(tmp_path / "feats.scp"), str(tmp_path / "text"), str(tmp_path / "out"),
              utts_per_shard=2)
    err = capsys.readouterr().err
    assert "\r" not in err
    assert [line.split(",")[0] for line in err.splitlines()] == [
        "pack: measure: 2/2 chunk (100%)", "pack: write: 2/2 shard (100%)"]


def test_interval_must_be_seconds():
    with pytest.raises(ValueError, match="interval must be seconds >= 0"):
        LineProgress(interval=-1)


def test_prepare_measures_audio_with_progress_lines_in_a_log(tmp_path, capsys):
    import numpy as np
    import soundfile

    from speechpipe.recipes._prepare import measure_audio

    paths = []
    for i in range(3):
        paths.append(str(tmp_path / f"{i}.flac"))
        soundfile.write(paths[-1], np.zeros(160 * (i + 1), np.float32), 16000)
    assert measure_audio(paths, desc="measure audio") == [(160, 16000), (320, 16000),
                                                          (480, 16000)]
    err = capsys.readouterr().err
    assert "\r" not in err and err.startswith("measure audio: 3/3 files (100%), ")


def test_prepare_verify_writes_progress_lines_into_a_log(tmp_path, capsys):
    # Issue 32.8: prepare librispeech / kaldi_dir --verify wrote tqdm's '\r' runs into a log.
    import speechpipe as sp

    sp.recipes.librispeech.prepare_librispeech(sp.DEMO_CORPUS, str(tmp_path / "m"),
                                               verify=True)
    err = capsys.readouterr().err
    assert "\r" not in err
    verify = [line for line in err.splitlines() if line.startswith("verify")]
    assert len(verify) == 1 and verify[0].split(",")[0].endswith(": 36/36 files (100%)"), err
