"""The main job on the shipped demo corpus, and the ``speechpipe demo`` command."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import soundfile
import torch

from speechpipe.demo import DEMO_CORPUS, build_demo_pipe, run_demo
from speechpipe.recipes.librispeech import librispeech_samples
from speechpipe import SampleCount

CORPUS = pathlib.Path(DEMO_CORPUS)


def _expected():
    """Keys, transcripts and durations read directly from the corpus files."""
    keys, texts, seconds = [], {}, 0.0
    for trans in sorted(CORPUS.rglob("*.trans.txt")):
        for line in trans.read_text().splitlines():
            key, text = line.split(" ", 1)
            keys.append(key)
            texts[key] = text
            seconds += soundfile.info(str(trans.parent / f"{key}.flac")).duration
    return keys, texts, seconds


def test_demo_corpus_is_in_librispeech_layout_and_small():
    flacs = sorted(CORPUS.glob("dev-clean/*/*/*.flac"))
    assert len(flacs) >= 24
    for flac in flacs:
        spk, chapter, _ = flac.stem.split("-")
        assert flac.parent.name == chapter and flac.parent.parent.name == spk
        info = soundfile.info(str(flac))
        assert (info.samplerate, info.channels, info.format) == (16000, 1, "FLAC")
    assert sum(p.stat().st_size for p in CORPUS.rglob("*") if p.is_file()) < 3 * 2**20


def test_samples_match_the_transcripts_and_audio_files():
    keys, texts, _ = _expected()
    samples = list(librispeech_samples(CORPUS))
    assert [s["key"] for s in samples] == keys
    for s in samples:
        assert s["text"] == texts[s["key"]]
        audio, rate = soundfile.read(s["audio_path"], dtype="float32")
        assert rate == s["sample_rate"] == 16000
        assert torch.equal(torch.from_numpy(audio), torch.from_numpy(s["audio"]))


def test_run_demo_summary_counts_every_utterance_once():
    keys, _, seconds = _expected()
    summary = run_demo(budget=SampleCount(8), progress=False)
    assert summary.utterances == len(keys)
    assert summary.batches == -(-len(keys) // 8)
    budgeted = run_demo(progress=False)
    assert budgeted.utterances == len(keys)
    assert budgeted.padding_efficiency > summary.padding_efficiency
    assert abs(summary.audio_seconds - seconds) < 1e-3
    assert 0.0 < summary.padding_efficiency < 1.0
    assert f"utterances          {len(keys)}\n" in summary.report()


def test_budget_batches_stay_within_the_padded_seconds():
    for batch in build_demo_pipe(budget=20):
        padded_seconds = batch["audio"].shape[1] / 16000 * batch["audio"].shape[0]
        assert batch["audio"].shape[0] == 1 or padded_seconds <= 20


def test_batches_are_padded_with_true_lengths():
    for batch in build_demo_pipe(budget=SampleCount(5)):
        audio, lengths = batch["audio"], batch["audio_len"]
        assert audio.dtype == torch.float32 and audio.shape[0] == len(batch["key"])
        assert int(lengths.max()) == audio.shape[1]
        for row, n in zip(audio, lengths):
            assert torch.all(row[int(n):] == 0)


def _order(seed):
    return [k for batch in build_demo_pipe(seed=seed) for k in batch["key"]]


def test_same_seed_same_batches_other_seed_other_order():
    assert _order(3) == _order(3)
    assert _order(3) != _order(4)
    assert sorted(_order(3)) == sorted(_order(4))


def test_workers_read_each_utterance_exactly_once():
    keys, _, _ = _expected()
    pipe = build_demo_pipe(shard=True)
    loader = torch.utils.data.DataLoader(pipe, batch_size=None, num_workers=2)
    seen = [k for batch in loader for k in batch["key"]]
    assert sorted(seen) == sorted(keys)


def test_cli_demo_prints_the_summary():
    out = subprocess.run([sys.executable, "-m", "speechpipe.cli", "demo", "--no-progress"],
                         capture_output=True, text=True, check=True).stdout
    for word in ("utterances", "batches", "audio", "throughput", "padding efficiency"):
        assert word in out


def test_cli_demo_on_missing_corpus_says_what_is_missing(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "speechpipe.cli", "demo", "--corpus", str(tmp_path),
         "--no-progress"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert f"{tmp_path}/dev-clean: LibriSpeech part folder not found" in proc.stderr
