"""The README runs as written: every ```python block, in order, in one fresh interpreter.

:func:`readme_run` runs the blocks exactly as printed -- concatenated in order, no text
rewritten, nothing prepared beforehand -- in a subprocess (``sys.executable``, the repository
root as working directory, as a reader runs them after ``make demo``), with ``out/`` (the
README's git-ignored output folder) removed first so that the run starts from a fresh clone's
state. The tests below then check that the run succeeded and that what each block promises
is what came out: they read the files the blocks wrote and the lines they printed.
"""

from __future__ import annotations

import ast
import gzip
import json
import pathlib
import re
import shutil
import subprocess
import sys
import time

import kaldiio
import numpy as np
import pytest
import torch

import speechpipe as sp

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
OUT = ROOT / "out"
CORPUS = ROOT / "speechpipe" / "demo_data" / "LibriSpeech"
TIMEOUT = 300  # seconds; the run takes well under a minute on an idle 2-core machine


def python_blocks() -> list[str]:
    """The README's ```python blocks (fences at the start of a line), in order."""
    return re.findall(r"^```python\n(.*?)^```$", README.read_text(encoding="utf-8"), re.S | re.M)


def demo_transcripts() -> dict[str, str]:
    out = {}
    for path in sorted(CORPUS.rglob("*.trans.txt")):
        for line in path.read_text(encoding="utf-8").splitlines():
            key, text = line.split(" ", 1)
            out[key] = text
    return out


@pytest.fixture(scope="module")
def readme_run():
    """Run every python block of README.md, in order, as one script; its stdout lines."""
    shutil.rmtree(OUT, ignore_errors=True)
    script = "".join(python_blocks())
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                            text=True, timeout=TIMEOUT)
    seconds = time.monotonic() - started
    assert result.returncode == 0, (
        f"the README's python blocks failed (exit {result.returncode}):\n{result.stderr}")
    print(f"README run: {seconds:.1f} s")  # shown with pytest -s
    assert "Warning" not in result.stderr, result.stderr  # a reader would see it
    return result.stdout.splitlines()


def _line(lines: list[str], pattern: str) -> re.Match:
    """The first printed line matching ``pattern`` (a regex, matched at the start)."""
    for line in lines:
        found = re.match(pattern, line)
        if found:
            return found
    raise AssertionError(f"no printed line matches {pattern!r}; printed:\n" + "\n".join(lines))


def test_readme_shows_the_two_commands_first():
    text = README.read_text()
    first_block = re.search(r"```sh\n(.*?)```", text, re.S).group(1)
    assert [line.split()[:2] for line in first_block.splitlines()] == [
        ["make", "demo"], ["make", "test"]]
    assert text.index("make demo") < text.index("```python")


def test_readme_uses_the_public_face_only():
    """Blocks import speechpipe as sp (and nothing private of it), and every sp.<name> they
    use is public: in speechpipe.__all__ (or sp.recipes.<corpus>.<public name>)."""
    code = "".join(python_blocks())
    assert re.findall(r"^[ \t]*(?:import|from)[ \t]+speechpipe\S*.*$", code, re.M) == [
        "import speechpipe as sp", "import speechpipe as sp"]  # the first block and the DDP one
    assert "speechpipe." not in code.replace("speechpipe/demo_data", "")
    for name in set(re.findall(r"\bsp\.(\w+)", code)):
        assert name in sp.__all__, name
    for corpus in set(re.findall(r"\bsp\.recipes\.(\w+)", code)):
        assert corpus in sp.recipes.RECIPES, corpus
    for name in set(re.findall(r"\blibrispeech\.(\w+)", code)):
        assert name in sp.recipes.librispeech.__all__, name


def test_readme_runs_as_written(readme_run):
    assert readme_run, "the blocks printed nothing"


def test_ten_line_pipeline_gives_padded_fbank_batches(readme_run):
    shape = _line(readme_run, r"torch\.Size\(\[(\d+), (\d+), (\d+)\]\) \[([\d, ]+)\]")
    n, longest, dim = map(int, shape.groups()[:3])
    lengths = [int(x) for x in shape.group(4).split(",")]
    assert (n, dim) == (8, 80) and len(lengths) == 8 and max(lengths) == longest


def test_kaldi_dir_block_writes_a_kaldi_dir_and_reads_it_back(readme_run):
    data = OUT / "data" / "train"
    transcripts = demo_transcripts()
    feats = kaldiio.load_scp(str(data / "feats.scp"))
    assert list(feats) == sorted(transcripts)  # sorted, as Kaldi wants
    text = dict(line.split(" ", 1) for line in (data / "text").read_text().splitlines())
    assert text == transcripts
    frames = sp.read_data_len(data / "utt2num_frames")
    assert frames == {k: feats[k].shape[0] for k in feats}
    assert all(feats[k].shape[1] == 80 and feats[k].dtype == np.float32 for k in feats)
    # The features are speechpipe's fbank of the demo audio.
    key = "1001-100101-0000"
    sample = next(iter(sp.IterableWrapper([{"key": key, "path": str(
        CORPUS / "dev-clean/1001/100101" / f"{key}.flac")}]).load_audio(field="path")
        .compute_features("fbank", num_mel_bins=80)))
    np.testing.assert_array_equal(np.asarray(sample["feats"]), feats[key])
    shapes = _line(readme_run, r"\[\((\d+), \d+, 80\)")  # the streamed batches
    batches = ast.literal_eval(shapes.string)  # a printed list of shape tuples
    assert sum(b[0] for b in batches) == 36 and all(b[0] <= 8 for b in batches)


def test_length_aware_batching_keeps_the_budget(readme_run):
    assert _line(readme_run, r"block_batch: (\d+) batches, 36 samples")
    assert _line(readme_run, r"  largest batch cost (\d+); batches over budget 0")
    cost = int(_line(readme_run, r"  largest batch cost (\d+);").group(1))
    assert cost <= 3000


def test_batch_view_resumes_without_reading_skipped_batches(readme_run):
    assert "2 True" in readme_run


def test_recipe_block_trains_checkpoints_and_resumes(readme_run):
    manifest = OUT / "manifests" / "librispeech_samples_dev-clean.jsonl.gz"
    with gzip.open(manifest, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    assert [r["key"] for r in rows] == sorted(demo_transcripts())
    assert round(sum(r["duration"] for r in rows)) == 174  # the README's "174 s"
    tokenizer = sp.load_tokenizer(OUT / "bpe60.model")
    text = rows[0]["text"]
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert "2" in readme_run  # loader.epoch after two passes, printed alone
    report = _line(readme_run, r"tokenize: (\d+) sample\(s\), (\d+) token\(s\)")
    assert int(report.group(1)) == 36 and int(report.group(2)) > 36  # summed over the workers
    state = torch.load(OUT / "checkpoint.pt")["loader"]
    assert state["epoch"] == 2 and state["dataloader"] is not None  # mid-epoch 2
    assert "True" in readme_run  # the resumed loader gave the batches that followed
    # The recipe's batches: fbank 80, tokens, within 30 padded seconds; and the checkpoint
    # resumes epoch 2 after its second batch, on a loader built as the README builds it.
    train = sp.recipes.librispeech.librispeech_train(
        {"dev-clean": str(manifest)}, ["dev-clean"], budget_seconds=30, seed=0,
        tokenizer=tokenizer)
    loader = sp.build_loader(train, num_workers=2, seed=0)
    loader.set_epoch(2)
    batches = list(loader)
    assert sum(len(b["key"]) for b in batches) == 36
    for b in batches:
        assert b["feats"].shape[-1] == 80 and b["tokens_len"].min() > 0
        assert len(b["key"]) * float(b["duration"].max()) <= 30
    resumed = sp.build_loader(train, num_workers=2, seed=0)
    resumed.load_state_dict(torch.load(OUT / "checkpoint.pt")["loader"])
    rest = [b["key"] for b in resumed]
    assert len(batches) > 4 and rest == [b["key"] for b in batches][2:]


def test_noise_block_mixes_noise_and_reverberates_in_the_train_builder(readme_run):
    line = next(line for line in readme_run if line.startswith("[") and "'kind'" in line)
    augment = ast.literal_eval(line)
    assert augment and {e["kind"] for e in augment} <= {"noise", "reverb"}
    for entry in augment:
        if entry["kind"] == "noise":
            assert entry["keys"][0].startswith("noise-free-sound-")
            assert 5 <= entry["snr_db"] <= 15
        else:
            assert entry["keys"] == ["room"]
    manifest = OUT / "manifests" / "musan_samples_noise.jsonl.gz"
    with gzip.open(manifest, "rt", encoding="utf-8") as f:
        assert len(f.readlines()) == 3
def test_remote_block_reads_compressed_shards_and_their_index_from_a_bucket(readme_run):
    # issue 22: .tar.zst shards and their index through fsspec (a memory:// "bucket")
    assert readme_run.count("36 36") == 2  # this block's line and the shard block's
    names = sorted(p.name for p in (OUT / "shards_zst").iterdir())
    assert names[-1] == "index.jsonl" and all(n.endswith(".tar.zst") for n in names[:-1])
    index = [json.loads(line) for line in
             (OUT / "shards_zst" / "index.jsonl").read_text().splitlines()][1:]
    assert sum(e["count"] for e in index) == 36


def test_remote_audio_block_loads_an_audio_path_from_the_bucket(readme_run):
    # issue 22: a manifest row whose audio_path is a URL, through eval_pipeline(remote=)
    assert "['u1'] (1, 48, 80)" in readme_run


def test_shard_block_packs_every_utterance_and_reads_them_back(readme_run):
    assert _line(readme_run, r"pack: 36 utterances \(feats, lengths in frames\) in 5 shard")
    assert "36 36" in readme_run  # len() from the index, and every utterance through the loader
    groups = {p.parent.name: [json.loads(line) for line in p.read_text().splitlines()]
              for p in (OUT / "shards").glob("*/index.jsonl")}
    assert sorted(groups) == ["100_800", "800_2000"]
    feats = kaldiio.load_scp(str(OUT / "data/train/feats.scp"))
    transcripts = demo_transcripts()
    shards = sorted(str(p) for p in (OUT / "shards").glob("*/data-*.tar"))
    seen = {}
    for sample in sp.IterableWrapper(shards).sharded_shuffle(buffer_size=1).decode():
        np.testing.assert_array_equal(sample["feats"], feats[sample["key"]])
        seen[sample["key"]] = sample["text"]
    assert seen == transcripts


def test_ddp_block_takes_the_planned_steps(readme_run):
    reports = [line for line in readme_run if line.startswith("equalize_steps (plan)")]
    assert len(reports) == 2  # one per epoch, world size 1
    for report in reports:
        steps, batches = map(int, re.search(r"(\d+) steps, (\d+) batches", report).groups())
        assert steps == batches > 0
    assert _line(readme_run, r"  planned steps: \d+")


def test_channels_block_keeps_then_downmixes_the_stereo_shard(readme_run):
    assert _line(readme_run, r"\(8000, 2\) \(8000,\) 0\.25$")
def test_lhotse_and_datasets_corpora_train_and_a_nodes_loader_resumes(readme_run):
    lhotse = pytest.importorskip("lhotse")
    cuts = lhotse.CutSet.from_file(OUT / "lhotse" / "cuts.jsonl.gz")  # lhotse reads it
    assert sorted(cut.id for cut in cuts) == sorted(demo_transcripts())
    at = readme_run.index("36")  # the lhotse corpus's utterances, all in batches
    assert readme_run[at + 1] == "True"  # the torchdata.nodes loader resumed exactly


def test_device_road_block_batches_undecoded_shards_and_computes_fbank_after(readme_run):
    # pack -> durations_from_index -> DecodeCollate in two workers -> fbank on the device
    found = _line(readme_run, r"\((\d+), 80\) (.*)$")
    assert found.groups() == ("15", "SCROOGE SIGNED IT")  # as the block says
