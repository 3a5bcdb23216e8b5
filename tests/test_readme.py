"""The README's pipeline examples run as written, on real files made here."""

from __future__ import annotations

import pathlib
import re

import kaldiio
import numpy as np
import soundfile
import torch
import webdataset

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def _blocks():
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def _block(marker: str) -> str:
    """The README python block containing ``marker``."""
    (block,) = [b for b in _blocks() if marker in b]
    return block


def test_readme_shows_the_two_commands_first():
    text = README.read_text()
    first_block = re.search(r"```sh\n(.*?)```", text, re.S).group(1)
    assert [line.split()[:2] for line in first_block.splitlines()] == [
        ["make", "demo"], ["make", "test"]]
    assert text.index("make demo") < text.index("```python")


def test_readme_kaldi_pipeline_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data/train").mkdir(parents=True)
    rng = np.random.default_rng(0)
    mats = {f"utt{i}": rng.standard_normal((50 + 7 * i, 80)).astype(np.float32) for i in range(20)}
    with kaldiio.WriteHelper("ark,scp:data/train/raw.1.ark,data/train/feats.scp") as w:
        for key, mat in mats.items():
            w(key, mat)
    (tmp_path / "data/train/text").write_text("".join(f"{k} TEXT {k}\n" for k in mats))
    namespace: dict = {}
    exec(compile(_blocks()[0], "README.md", "exec"), namespace)
    batches = list(namespace["pipe"])
    assert sum(len(b["key"]) for b in batches) == 20
    for b in batches:
        assert b["feats"].shape[-1] == 80 and b["feats_len"].dtype == torch.int64
        for key, text, n, padded in zip(b["key"], b["text"], b["feats_len"], b["feats"]):
            assert text == f"TEXT {key}"
            assert torch.equal(padded[: int(n)], torch.from_numpy(mats[key]))


def test_readme_shard_pipeline_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(1)
    expected = {}
    for group in ("10_1000", "1000_2000"):
        (tmp_path / "shards" / group).mkdir(parents=True)
        with webdataset.TarWriter(f"shards/{group}/data-00000.tar") as sink:
            for i in range(5):
                key = f"{group}-u{i}"
                audio = (rng.standard_normal(800 + 100 * i) * 0.1).astype(np.float32)
                path = tmp_path / "x.flac"
                soundfile.write(path, audio, 16000, subtype="PCM_16")
                sink.write({"__key__": key, "flac": path.read_bytes(), "txt": key.upper()})
                expected[key] = soundfile.read(path, dtype="float32")[0]
    namespace: dict = {}
    first = _blocks()[0].splitlines()  # the second example reuses the first one's imports
    exec("\n".join(line for line in first if line.startswith(("import ", "from "))), namespace)
    exec(compile(_blocks()[1], "README.md", "exec"), namespace)
    got = {}
    for b in namespace["pipe"]:
        for key, text, n, audio in zip(b["key"], b["text"], b["audio_len"], b["audio"]):
            assert text == key.upper()
            got[key] = audio[: int(n)].numpy()
    assert sorted(got) == sorted(expected)
    for key in expected:
        assert np.array_equal(got[key], expected[key])


def test_readme_batching_examples_run_on_the_demo_corpus(monkeypatch, capsys):
    monkeypatch.chdir(README.parent)
    namespace: dict = {}
    exec(compile(_blocks()[2], "README.md", "exec"), namespace)
    exec(compile(_blocks()[3], "README.md", "exec"), namespace)
    out = capsys.readouterr().out
    assert "block_batch:" in out and "padding efficiency" in out
    assert out.strip().endswith("2 True")
    assert namespace["pipe"].datapipe.stats.over_budget == 0


def test_readme_large_corpus_pipeline_runs(tmp_path, monkeypatch):
    from speechpipe.pack import pack_data
    from speechpipe.pipes.tokenizers import SentencePieceTokenizer

    monkeypatch.chdir(tmp_path)
    (tmp_path / "data/train").mkdir(parents=True)
    rng = np.random.default_rng(2)
    mats = {f"utt{i:02d}": rng.standard_normal((int(n), 80)).astype(np.float32)
            for i, n in enumerate(rng.integers(50, 1800, size=30))}
    with kaldiio.WriteHelper("ark,scp:data/train/raw.1.ark,data/train/feats.scp") as w:
        for key, mat in mats.items():
            w(key, mat)
    words = ["speech", "pipe", "shard", "batch", "token", "audio"]
    texts = {k: " ".join(words[(i + j) % 6] for j in range(4)) for i, k in enumerate(mats)}
    (tmp_path / "data/train/text").write_text("".join(f"{k} {t}\n" for k, t in texts.items()))
    pack_data(["data/train/feats.scp"], ["data/train/text"], "shards",
              filter_group=["10:1000", "1000:2000"], utts_per_shard=8, progress=False)
    tok = SentencePieceTokenizer.build([t.upper() for t in texts.values()], model_type="char")
    tok.save("bpe500.model")
    namespace: dict = {}
    first = _blocks()[0].splitlines()
    exec("\n".join(line for line in first if line.startswith(("import ", "from "))), namespace)
    exec(compile(_block("index=True"), "README.md", "exec"), namespace)
    pipe = namespace["pipe"]
    seen = {}
    for batch in pipe:
        for key, n, feats, m, tokens in zip(batch["key"], batch["feats_len"], batch["feats"],
                                            batch["tokens_len"], batch["tokens"]):
            assert torch.equal(feats[: int(n)], torch.from_numpy(mats[key]))
            seen[key] = tok.decode(tokens[: int(m)].tolist())
    assert seen == {k: t.upper() for k, t in texts.items()}
    sharded = pipe.datapipe
    while type(sharded).__name__ != "ShardedShufflerIterDataPipe":
        sharded = sharded.source_datapipe
    assert len(sharded) == 30  # exact, from the index


def test_readme_recipe_example_runs(tmp_path, monkeypatch):
    import shutil

    import speechpipe
    from speechpipe.demo import DEMO_CORPUS
    from speechpipe.pipes.tokenizers import SentencePieceTokenizer
    from speechpipe.recipes.librispeech import prepare_librispeech

    monkeypatch.chdir(tmp_path)
    shutil.copytree(f"{DEMO_CORPUS}/dev-clean", "LibriSpeech/train-clean-100")
    prepare_librispeech("LibriSpeech", "OUT", parts=["train-clean-100"])
    texts = [line.split(" ", 1)[1] for p in pathlib.Path("LibriSpeech").rglob("*.trans.txt")
             for line in p.read_text().splitlines()]
    SentencePieceTokenizer.build(texts, model_type="char").save("bpe500.model")
    code = _block("librispeech_train").replace("range(30)", "range(2)")  # two epochs suffice
    code = code.replace("        ...", "        batches.append(batch)")
    namespace: dict = {"speechpipe": speechpipe, "batches": []}
    exec(compile(code, "README.md", "exec"), namespace)
    batches = namespace["batches"]
    assert batches and all(b["feats"].shape[-1] == 80 for b in batches)
    # The demo utterances all last 1-20 s: every one is kept, once per epoch.
    assert sum(len(b["key"]) for b in batches) == 2 * len(texts)
    assert all("tokens" in b and b["tokens_len"].min() > 0 for b in batches)


def test_readme_build_loader_example_runs_and_resumes(tmp_path, monkeypatch):
    """The build_loader block runs on the README's shard pipeline, and its checkpoint resumes:
    a new loader given the saved state yields the batches that followed step 1 of epoch 2."""
    from speechpipe.loader import build_loader

    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(3)
    with webdataset.ShardWriter(str(tmp_path / "data-%03d.tar"), maxcount=10) as writer:
        for i in range(40):
            writer.write({"__key__": f"u{i:02d}",
                          "feats.npy": rng.standard_normal((int(rng.integers(20, 200)), 8))
                          .astype(np.float32)})
    namespace: dict = {}
    first = _blocks()[0].splitlines()
    exec("\n".join(line for line in first if line.startswith(("import ", "from "))), namespace)
    exec("pipe = (IterableWrapper(sorted(__import__('glob').glob('data-*.tar')))"
         ".sharded_shuffle(buffer_size=16).decode().bucket_by_length(16)"
         ".block_batch(batch_len=1500).collate(collate_fn=PadCollate()))", namespace)
    exec(compile(_block("build_loader("), "README.md", "exec"), namespace)
    loader = namespace["loader"]
    state = torch.load("checkpoint.pt")["loader"]
    loader.set_epoch(2)
    expected = [b["key"] for b in loader][2:]
    again = build_loader(namespace["pipe"], num_workers=2, seed=0)
    again.load_state_dict(state)
    assert [b["key"] for b in again] == expected and expected
