"""speechpipe.stats: numbers equal a direct computation, shard indexes are read, the PNG is a
valid PNG of the asked size, and the ``speechpipe stats`` command."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest
import soundfile

from speechpipe.cli.stats import add_command as add_stats_command
from speechpipe.errors import DataError, MissingDataError
from speechpipe.index import ShardEntry, ShardIndex
from speechpipe.pipes.sources import write_manifest
from speechpipe.recipes.librispeech import prepare_librispeech
from speechpipe.stats import (
    PERCENTILES,
    corpus_stats,
    length_histogram,
    padding_efficiency,
    read_durations,
    text_histogram,
    write_histogram_png,
)
from speechpipe.testing import sample_durations

FIXTURE = Path(__file__).parents[1] / "fixtures" / "librispeech" / "LibriSpeech"


def _greedy(durations, budget):
    """Direct computation: one sorted buffer packed greedily while n × longest <= budget."""
    batches, batch = [], []
    for d in sorted(durations):
        if batch and (len(batch) + 1) * d > budget:
            batches.append(batch)
            batch = []
        batch.append(d)
    batches.append(batch)
    real = sum(durations)
    padded = sum(len(b) * max(b) for b in batches)
    return real / padded, len(batches)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    out = tmp_path_factory.mktemp("m")
    return prepare_librispeech(FIXTURE, out, parts="dev-clean", progress=False)["dev-clean"]


def test_stats_of_a_manifest_equal_a_direct_computation(manifest):
    durations = [soundfile.info(str(p)).duration
                 for p in sorted((FIXTURE / "dev-clean").rglob("*.flac"))]
    stats = corpus_stats(manifest, budget=4.0)
    assert stats.utterances == 3
    assert stats.seconds == pytest.approx(sum(durations), abs=1e-9)
    assert stats.hours == pytest.approx(sum(durations) / 3600)
    for q in PERCENTILES:
        assert stats.percentiles[q] == pytest.approx(np.percentile(durations, q))
    efficiency, batches = _greedy(durations, 4.0)
    assert stats.padding_efficiency == pytest.approx(efficiency)
    assert stats.batches == batches
    assert "utterances          3" in stats.report()


def test_padding_efficiency_on_realistic_durations_equals_the_direct_computation():
    durations = [float(d) for d in sample_durations("librispeech-train-clean-100", 500)]
    stats = padding_efficiency(durations, 200.0, buffer_size=500)
    efficiency, batches = _greedy(durations, 200.0)
    assert stats.efficiency == pytest.approx(efficiency) and stats.batches == batches
    small = padding_efficiency(durations, 200.0, buffer_size=20)
    assert small.efficiency < stats.efficiency  # smaller sorted buffers pad more


def test_durations_from_shard_index_folder_and_pattern(tmp_path):
    folder = tmp_path / "shards"
    folder.mkdir()
    entries = [ShardEntry(f"data-{i:05d}.tar", 2, 10, (f"a{i}", f"b{i}"), (100 + i, 250))
               for i in range(3)]
    ShardIndex(str(folder), entries, "frames").write()
    for e in entries:
        (folder / e.name).write_bytes(b"")
    assert read_durations(folder) == pytest.approx([1.0, 2.5, 1.01, 2.5, 1.02, 2.5])
    pattern = str(folder / "data-{00001..00002}.tar")
    assert read_durations(pattern) == pytest.approx([1.01, 2.5, 1.02, 2.5])
    stats = corpus_stats([str(folder)], budget=5.0)
    assert stats.utterances == 6 and stats.seconds == pytest.approx(10.53)


def test_samples_and_seconds_units_of_an_index(tmp_path):
    ShardIndex(str(tmp_path), [ShardEntry("d.tar", 1, 1, ("a",), (8000,))], "samples").write()
    assert read_durations(tmp_path, sample_rate=16000) == [0.5]


def test_manifest_line_without_duration_is_named(tmp_path):
    path = tmp_path / "m.jsonl"
    write_manifest(path, [{"key": "u1", "duration": 1.0}, {"key": "u2"}])
    with pytest.raises(DataError, match=rf"{path}:2 \(key 'u2'\): manifest line has no "
                                        "'duration'"):
        read_durations(path)


def test_absent_input_is_a_missing_data_error(tmp_path):
    with pytest.raises(MissingDataError, match="no such manifest"):
        read_durations(tmp_path / "nope.jsonl.gz")
    with pytest.raises(MissingDataError, match="no shard index here"):
        read_durations(tmp_path)


def test_histogram_counts_every_utterance():
    counts, edges = length_histogram([1.0, 1.2, 3.0, 5.0], bins=4)
    assert counts == [2, 0, 1, 1] and edges == [1.0, 2.0, 3.0, 4.0, 5.0]


def saved_figures(monkeypatch) -> list:
    """The matplotlib figures saved from now on (to read what a PNG shows)."""
    import matplotlib.figure

    figures = []
    real = matplotlib.figure.Figure.savefig

    def keep(fig, *args, **kwargs):
        figures.append(fig)
        return real(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", keep)
    return figures


def test_the_histogram_png_has_titles_marks_a_log_axis_and_a_readable_font(tmp_path,
                                                                         monkeypatch):
    # Issue 18, case 9: three x labels, no axis titles, no marks, a linear y axis, a 3x5 font.
    figures = saved_figures(monkeypatch)
    durations = sample_durations("ljspeech", 300).tolist()
    counts, edges = length_histogram(durations, bins=30)
    marks = {q: float(np.percentile(durations, q)) for q in PERCENTILES}
    path = write_histogram_png(tmp_path / "h.png", counts, edges, log_y=True,
                               percentiles=marks, budget=9.0, width=640, height=320)
    assert Path(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image
    assert matplotlib.image.imread(path).shape[:2] == (320, 640)
    (ax,) = figures[0].axes
    assert ax.get_xlabel() == "utterance duration (s)"
    assert ax.get_ylabel() == "utterances (log scale)" and ax.get_yscale() == "log"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[1:] == [f"median {marks[50]:.1f} s", f"p95 {marks[95]:.1f} s",
                          f"p99 {marks[99]:.1f} s", "budget 9 s: longer ones batch alone"]
    assert min(t.get_fontsize() for t in ax.get_xticklabels()) >= 10
    assert len(ax.get_xticks()) >= 5


def test_without_matplotlib_the_report_keeps_the_text_histogram(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # as if not installed
    stats = corpus_stats([{"key": str(i), "duration": 1.0 + i % 7} for i in range(70)],
                         png=tmp_path / "h.png")
    assert stats.png is None and not (tmp_path / "h.png").exists()
    report = stats.report()
    assert "no PNG: the histogram PNG needs matplotlib: pip install 'speechpipe[plot]'" in report
    assert "duration (s)" in report and "|" + "#" * 50 + " 10" in report


def test_the_text_histogram_log_scale_keeps_a_tail_of_one_visible():
    linear = text_histogram([1000, 0, 1], [0, 1, 2, 3], width=40).splitlines()
    logged = text_histogram([1000, 0, 1], [0, 1, 2, 3], width=40, log_y=True).splitlines()
    assert linear[3].endswith("|." + " " * 39 + " 1")  # below one character: a dot
    assert logged[3].count("#") == 4 and "log scale" in logged[0]
    merged = text_histogram([1] * 40, [float(i) for i in range(41)], max_rows=20)
    assert len(merged.splitlines()) == 21 and merged.splitlines()[1].endswith(" 2")


def test_the_summary_counts_speakers_rates_channels_empty_and_out_of_range():
    samples = ([{"key": f"a{i}", "duration": 2.0, "speaker": "s1", "sample_rate": 16000,
                 "channels": 1, "text": "yes"} for i in range(5)]
               + [{"key": "b", "duration": 0.05, "speaker": "s2", "sample_rate": 8000,
                   "channels": 2, "text": " "},
                  {"key": "c", "duration": 40.0, "speaker": "s2", "sample_rate": 16000,
                   "channels": 1, "text": "long"}])
    stats = corpus_stats(samples, budget=30.0)
    assert (stats.speakers, stats.sample_rates, stats.channels) == (
        2, {16000: 6, 8000: 1}, {1: 6, 2: 1})
    assert (stats.empty_texts, stats.undersize, stats.oversize) == (1, 1, 1)
    report = stats.report()
    for line in ("speakers            2", "sample rates        16000 Hz: 6, 8000 Hz: 1",
                 "channels            1: 6, 2: 1", "empty transcripts   1",
                 "undersize           1 shorter than 0.1 s",
                 "oversize            1 longer than 30 s", "percentiles (s)     min 0.05"):
        assert line in report
    from_index = corpus_stats([{"key": "x", "duration": 1.0}])
    assert "speakers            not recorded" in from_index.report()


def test_stats_command_prints_the_report_and_writes_the_png(manifest, tmp_path, capsys):
    parser = argparse.ArgumentParser(prog="speechpipe")
    add_stats_command(parser.add_subparsers(dest="command"))
    png = tmp_path / "h.png"
    args = parser.parse_args(["stats", str(manifest), "--budget", "4", "--png", str(png)])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "utterances          3" in out and "padding efficiency" in out and str(png) in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    args = parser.parse_args(["stats", str(tmp_path / "nope.jsonl")])
    assert args.func(args) == 2
    assert "speechpipe stats: error: " in capsys.readouterr().err


def test_stats_command_has_help(capsys):
    parser = argparse.ArgumentParser(prog="speechpipe")
    add_stats_command(parser.add_subparsers(dest="command"))
    with pytest.raises(SystemExit) as info:
        parser.parse_args(["stats", "--help"])
    assert info.value.code == 0 and "--budget" in capsys.readouterr().out


def test_stats_notices_a_truncated_or_missing_shard(tmp_path):
    # Issue 18, case 3: stats read the index alone and said nothing of a shard cut short.
    entries = [ShardEntry(f"data-{i:05d}.tar", 2, 2048, (f"a{i}", f"b{i}"), (100, 250))
               for i in range(3)]
    ShardIndex(str(tmp_path), entries, "frames").write()
    (tmp_path / "data-00000.tar").write_bytes(b"\0" * 2048)
    (tmp_path / "data-00001.tar").write_bytes(b"\0" * 1000)
    stats = corpus_stats(tmp_path)
    assert stats.problems == [
        f"{tmp_path / 'data-00001.tar'}: 1000 of 2048 bytes, truncated (2 utterances)",
        f"{tmp_path / 'data-00002.tar'}: missing (2 utterances)",
    ]
    assert "warning: 2 shard(s) missing or shorter than their index says" in stats.report()
    (tmp_path / "data-00001.tar").write_bytes(b"\0" * 2048)
    (tmp_path / "data-00002.tar").write_bytes(b"\0" * 2048)
    assert corpus_stats(tmp_path).problems == []


def test_stats_shows_the_length_groups_of_a_pack_folder_one_by_one(tmp_path, capsys):
    # Issue 32, 9: stats of a pack folder gave the totals only.
    for group, lengths in (("100_300", [100, 200]), ("300_900", [300, 400, 800])):
        folder = tmp_path / "shards" / group
        folder.mkdir(parents=True)
        ShardIndex(str(folder), [ShardEntry("data-00000.tar", len(lengths), 0,
                                            tuple(f"{group}-{i}" for i in range(len(lengths))),
                                            tuple(lengths))]).write()
    stats = corpus_stats(str(tmp_path / "shards"))
    root = str(tmp_path / "shards")
    assert stats.groups == {f"{root}/100_300/": (2, 3.0, 1.0, 2.0),
                            f"{root}/300_900/": (3, 15.0, 3.0, 8.0)}
    report = stats.report(histogram=False)
    assert f"length group        {root}/100_300/: 2 utterances, 0.0008 h (3.0 s), 1.00-2.00 s" \
        in report
    assert f"length group        {root}/300_900/: 3 utterances" in report
    assert "length group" not in corpus_stats(str(tmp_path / "shards" / "100_300")).report()


def test_stats_on_a_folder_of_manifests_reads_every_manifest_in_it(tmp_path):
    # Issue 32.12: stats on prepare's output folder told the user to write a shard index.
    import speechpipe as sp
    from speechpipe.stats import corpus_stats

    sp.recipes.librispeech.prepare_librispeech(sp.DEMO_CORPUS, str(tmp_path / "m"),
                                               progress=False)
    stats = corpus_stats(str(tmp_path / "m"), None)
    assert stats.utterances == 36


def test_pack_names_a_manifest_folder_instead_of_a_raw_traceback(tmp_path):
    # Issue 32.12: pack --manifest DIR was a raw IsADirectoryError traceback.
    import speechpipe as sp
    from speechpipe.errors import DataError

    sp.recipes.librispeech.prepare_librispeech(sp.DEMO_CORPUS, str(tmp_path / "m"),
                                               progress=False)
    with pytest.raises(DataError, match=r"m: a folder, not a manifest: name its manifest "
                                        r"files \(it holds \['librispeech_samples_dev-clean"):
        sp.pack_data(None, None, str(tmp_path / "out"), manifests=[str(tmp_path / "m")],
                     progress=False)


def test_the_png_axis_follows_the_data_and_says_the_budget_as_a_batch_size(tmp_path,
                                                                          monkeypatch):
    # Issue 32.10: at the default budget (600 s) the durations were drawn on a 0-600 s axis,
    # every bar in the leftmost 5 %.
    figures = saved_figures(monkeypatch)
    durations = sample_durations("ljspeech", 300).tolist()
    counts, edges = length_histogram(durations, bins=30)
    marks = {q: float(np.percentile(durations, q)) for q in PERCENTILES}
    write_histogram_png(tmp_path / "h.png", counts, edges, percentiles=marks, budget=600.0)
    (ax,) = figures[0].axes
    assert ax.get_xlim() == pytest.approx((edges[0], edges[-1]))
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert not [label for label in labels if "budget" in label]  # no line off the data
    assert ax.get_title().endswith(f"budget 600 s ≈ {600 / marks[50]:.0f} median utterances "
                                   "per batch")


def test_the_text_histogram_says_how_its_bins_are_shown():
    # Issue 32.10: the report announced 40 bins and printed 20 rows.
    text = text_histogram([1] * 40, [float(i) for i in range(41)])
    assert text.splitlines()[0].endswith("utterances (40 bins, 2 per row)")
    assert len(text.splitlines()) == 21
    assert "per row" not in text_histogram([1] * 20, [float(i) for i in range(21)])
