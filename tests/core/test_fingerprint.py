"""A loader state knows what it belongs to (issue 29, first slice).

Invariant: ``Loader.load_state_dict(state)`` either resumes the loader the state was saved
from, or raises :class:`speechpipe.ResumeError` listing each difference (stage, field, saved ->
current) -- before anything is restored or fetched again, whatever ``snapshot_every`` is; never
torchdata's bare ``AssertionError``, never a silent divergence. A change accepted with
``allow_changes`` takes effect from the next epoch, with a ``ResumeWarning``.
"""

from __future__ import annotations

import os
import sys
import warnings

import numpy as np
import pytest

import speechpipe as sp
from speechpipe.pipes._core import describe_differences, differences, fingerprint
from speechpipe.pipes.collate import PadCollate

sys.path.insert(0, os.path.dirname(__file__))
from test_resume import write_corpus  # noqa: E402

KEYS = 48


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(str(tmp_path_factory.mktemp("corpus")), n=KEYS, per_shard=8)


def stream(paths, *, batch_len=120, seed=1, buckets=True, threads=1):
    """sharded_shuffle -> decode -> [bucket_by_length] -> block_batch -> collate."""
    samples = sp.IterableWrapper(paths).sharded_shuffle(buffer_size=6, seed=seed, index=True)
    samples = samples.decode().prefetch_in_thread(threads)
    if buckets:
        samples = samples.bucket_by_length(8, seed=2)
    return (samples.block_batch(sp.PaddedArea(batch_len), shuffle_window=2, seed=3)
            .collate(collate_fn=PadCollate()))


def manifest(rows, *, seed=6):
    """shuffle_samples over manifest rows -> load -> block_batch -> collate."""
    return (sp.IterableWrapper(rows).shuffle_samples(seed=seed).map(_with_feats)
            .block_batch(sp.PaddedArea(150), shuffle_window=2, seed=3)
            .collate(collate_fn=PadCollate()))


def _with_feats(row: dict) -> dict:
    return {**row, "feats": np.full((row["frames"], 2), 1.0, np.float32)}


def rows(n=60):
    rng = np.random.default_rng(7)
    return [{"key": f"m{i:03d}", "frames": int(rng.integers(3, 40))} for i in range(n)]


def keys(batches) -> list[str]:
    return [k for batch in batches for k in batch["key"]]


def saved_mid_epoch(pipe, *, workers=2, steps=4, **options) -> dict:
    """``loader.state_dict()`` after ``steps`` batches of epoch 0, at the default
    ``snapshot_every`` (100: the state is restored by fetching those batches again)."""
    loader = sp.build_loader(pipe, num_workers=workers, **options)
    it = iter(loader)
    for _ in range(steps):
        next(it)
    state = loader.state_dict()
    del it
    return state


# ------------------------------------------------------------------------------ refusals


@pytest.mark.parametrize("now", [1, 0])
def test_a_state_saved_with_2_workers_is_refused_by_another_number(corpus, now):
    # issue 29: 2 -> 1 died at the first next() with torchdata's bare AssertionError
    # (assert self._num_workers == ...), 2 -> 0 with "State doesn't contain key '_num_yielded'"
    state = saved_mid_epoch(stream(corpus))
    loader = sp.build_loader(stream(corpus), num_workers=now)
    with pytest.raises(sp.ResumeError, match=rf"loader num_workers: 2 -> {now}\n") as caught:
        loader.load_state_dict(state)
    assert caught.value.differences == [("loader", "num_workers", 2, now)]
    assert "allow_changes=('num_workers',)" in str(caught.value)


def test_a_state_without_a_fingerprint_is_still_refused_by_its_shape(corpus):
    # a state saved before fingerprints: the DataLoader's own state says how many workers
    state = saved_mid_epoch(stream(corpus))
    del state["fingerprint"]
    loader = sp.build_loader(stream(corpus), num_workers=0)
    with pytest.warns(sp.ResumeWarning, match="no fingerprint"), \
            pytest.raises(sp.ResumeError, match="loader num_workers: 2 -> 0"):
        loader.load_state_dict(state)


def test_another_budget_is_refused_before_any_batch_is_fetched_again(corpus):
    # issue 29: at snapshot_every=100 the state was restored by re-fetching its 4 batches
    # under batch_len=60: keys lost and duplicated, no error. The check runs in
    # load_state_dict, before iter() (where the re-fetch happens).
    state = saved_mid_epoch(stream(corpus))
    assert state["dataloader"]["_steps_since_snapshot"] == 4  # restored by re-fetching
    loader = sp.build_loader(stream(corpus, batch_len=60), num_workers=2)
    with pytest.raises(sp.ResumeError,
                       match=r"\d:BlockBatcherIterDataPipe constraint\.budget: 120 -> 60"):
        loader.load_state_dict(state)


def test_another_seed_is_refused(corpus):
    state = saved_mid_epoch(stream(corpus))
    loader = sp.build_loader(stream(corpus, seed=5), num_workers=2)
    with pytest.raises(sp.ResumeError, match=r"\d:ShardedShufflerIterDataPipe seed: 1 -> 5"):
        loader.load_state_dict(state)


def test_another_loader_seed_is_refused(corpus):
    state = saved_mid_epoch(stream(corpus), seed=0)
    loader = sp.build_loader(stream(corpus), num_workers=2, seed=9)
    with pytest.raises(sp.ResumeError, match=r"loader seed: 0 -> 9"):
        loader.load_state_dict(state)


def test_another_shard_list_is_refused_naming_the_shards(corpus):
    # issue 29: a shard list without its last 2 shards lost 13 keys and duplicated 4
    state = saved_mid_epoch(stream(corpus))
    loader = sp.build_loader(stream(corpus[:-2]), num_workers=2)
    with pytest.raises(sp.ResumeError) as caught:
        loader.load_state_dict(state)
    gone = ", ".join(repr(p) for p in corpus[-2:])
    assert f"IterDataPipe iterable: 6 items -> 4 items (only saved: {gone})" in str(caught.value)


def test_another_manifest_is_refused_by_its_digest():
    state = saved_mid_epoch(manifest(rows()))
    loader = sp.build_loader(manifest(rows()[:-1]), num_workers=2)
    with pytest.raises(sp.ResumeError,
                       match=r"iterable: 60 items \(digest \w{8}\) -> 59 items \(digest \w{8}\)"):
        loader.load_state_dict(state)


def test_a_manifest_with_another_seed_is_refused():
    state = saved_mid_epoch(manifest(rows()), workers=0)
    loader = sp.build_loader(manifest(rows(), seed=2), num_workers=0)
    with pytest.raises(sp.ResumeError, match=r"SampleShufflerIterDataPipe seed: 6 -> 2"):
        loader.load_state_dict(state)


def test_another_pipeline_is_refused_naming_the_stage(corpus):
    state = saved_mid_epoch(stream(corpus))
    loader = sp.build_loader(stream(corpus, buckets=False), num_workers=2)
    with pytest.raises(sp.ResumeError,
                       match=r"pipeline: stage \d:LengthBucketerIterDataPipe only in the saved "
                             r"state\n") as caught:
        loader.load_state_dict(state)
    assert len(caught.value.differences) == 1  # the stages around it still match
    assert "allow_changes=('stages',)" in str(caught.value)


def test_another_batching_view_is_refused():
    data = {f"v{i:02d}": {"key": f"v{i:02d}", "feats": np.ones((i % 7 + 1, 2), np.float32)}
            for i in range(40)}

    def pipe(batch_len):
        view = sp.BatchView({k: len(s["feats"]) for k, s in data.items()}, budget=batch_len,
                            seed=0)
        return sp.SequenceWrapper(data).batch_by_view(view).collate(collate_fn=PadCollate())

    state = saved_mid_epoch(pipe(12), workers=0, steps=2)
    with pytest.raises(sp.ResumeError, match=r"ViewLoaderIterDataPipe view: 'BatchView\("):
        sp.build_loader(pipe(6)).load_state_dict(state)


def test_every_difference_is_listed_in_one_error(corpus):
    state = saved_mid_epoch(stream(corpus))
    loader = sp.build_loader(stream(corpus, batch_len=60, seed=5), num_workers=1)
    with pytest.raises(sp.ResumeError) as caught:
        loader.load_state_dict(state)
    found = {(field, saved, current) for _, field, saved, current in caught.value.differences}
    assert found == {("num_workers", 2, 1), ("constraint.budget", 120, 60), ("seed", 1, 5)}
    assert str(caught.value).count("\n  - ") == 3
    assert "allow_changes=('budget', 'num_workers', 'seed')" in str(caught.value)


def test_a_state_saved_between_epochs_is_checked_too(corpus):
    loader = sp.build_loader(stream(corpus), num_workers=0)
    list(loader)
    state = loader.state_dict()
    assert state["dataloader"] is None and state["epoch"] == 1
    with pytest.raises(sp.ResumeError, match="constraint.budget: 120 -> 60"):
        sp.build_loader(stream(corpus, batch_len=60)).load_state_dict(state)


def test_a_resume_error_survives_pickling():
    import pickle

    error = sp.ResumeError("another loader", [("loader", "num_workers", 2, 0)])
    again = pickle.loads(pickle.dumps(error))
    assert str(again) == "another loader" and again.differences == error.differences


# ------------------------------------------------------------------------------ allowed


def test_an_allowed_budget_takes_effect_from_the_next_epoch(corpus):
    state = saved_mid_epoch(stream(corpus))
    loader = sp.build_loader(stream(corpus, batch_len=60), num_workers=2)
    with pytest.warns(sp.ResumeWarning,
                      match=r"constraint\.budget: 120 -> 60\. They take effect from epoch 1, "
                            r"which starts now; the rest of epoch 0 after the saved step is "
                            "skipped"):
        loader.load_state_dict(state, allow_changes=("budget",))
    assert loader.epoch == 1
    resumed = keys(loader)
    fresh = sp.build_loader(stream(corpus, batch_len=60), num_workers=2).set_epoch(1)
    assert resumed == keys(fresh)  # epoch 1 of the new settings, whole
    assert sorted(resumed) == sorted(f"u{i:04d}" for i in range(KEYS))


def test_allowed_workers_at_an_epoch_boundary_start_that_epoch(corpus):
    loader = sp.build_loader(stream(corpus), num_workers=2)
    list(loader)
    state = loader.state_dict()
    again = sp.build_loader(stream(corpus), num_workers=0)
    with pytest.raises(sp.ResumeError, match="num_workers: 2 -> 0"):
        again.load_state_dict(state)
    with pytest.warns(sp.ResumeWarning, match=r"from epoch 1, which starts now$"):
        again.load_state_dict(state, allow_changes=("num_workers",))
    assert again.epoch == 1
    assert keys(again) == keys(sp.build_loader(stream(corpus)).set_epoch(1))


def test_allowing_one_change_does_not_allow_another(corpus):
    state = saved_mid_epoch(stream(corpus))
    loader = sp.build_loader(stream(corpus, batch_len=60, seed=5), num_workers=2)
    with pytest.raises(sp.ResumeError, match=r"1 difference in") as caught:
        loader.load_state_dict(state, allow_changes=("constraint.budget",))
    assert [d[1] for d in caught.value.differences] == ["seed"]


def test_allow_changes_must_be_a_tuple_of_names(corpus):
    loader = sp.build_loader(stream(corpus))
    with pytest.raises(TypeError, match=r"allow_changes must be a tuple of field names, e\.g\. "
                                        r"\('budget',\), got 'budget'"):
        loader.load_state_dict({"epoch": 0, "dataloader": None}, allow_changes="budget")


def test_an_unchanged_loader_resumes_exactly_without_a_warning(corpus):
    full = keys(sp.build_loader(stream(corpus), num_workers=2))
    state = saved_mid_epoch(stream(corpus), steps=3)
    loader = sp.build_loader(stream(corpus, threads=4), num_workers=2)  # not a deciding field
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader.load_state_dict(state)
    head = keys(_first_batches(stream(corpus), 3))
    assert head + keys(loader) == full


def _first_batches(pipe, n):
    it = iter(sp.build_loader(pipe, num_workers=2))
    return [next(it) for _ in range(n)]


# ------------------------------------------------------------------------------ the record


def test_the_fingerprint_does_not_change_over_passes(corpus):
    # counts (stats, diagnostics, buffers), the epoch and estimated boundaries are not settings
    pipe = stream(corpus)
    pipe_with_estimates = (sp.IterableWrapper(corpus).sharded_shuffle(buffer_size=6, index=True)
                           .decode().bucket_by_length(8, num_buckets=3)
                           .block_batch(sp.PaddedArea(120)))
    for p in (pipe, pipe_with_estimates):
        before = fingerprint(p)
        for epoch in range(2):
            sp.set_epoch(p, epoch)
            list(p)
        assert differences(before, fingerprint(p)) == []


def test_settings_are_read_from_declared_fields_and_reprs_with_addresses_are_left_out():
    class Opaque:
        def __call__(self, item):
            return item

    fast = sp.IterableWrapper(["a"]).prefetch_in_thread(2).map_in_threads(str, num_threads=2)
    slow = sp.IterableWrapper(["a"]).prefetch_in_thread(9).map_in_threads(str, num_threads=5)
    assert differences(fingerprint(fast), fingerprint(slow)) == []  # threads decide nothing
    other = sp.IterableWrapper(["a"]).prefetch_in_thread(2).map_in_threads(repr)
    assert describe_differences(differences(fingerprint(fast), fingerprint(other))) == [
        "0:ThreadMapperIterDataPipe fn: 'str' -> 'repr'"]
    a, b = sp.IterableWrapper(["a"]).map(Opaque()), sp.IterableWrapper(["a"]).map(Opaque())
    assert differences(fingerprint(a), fingerprint(b)) == []  # '<... at 0x...>' is not kept


def test_a_local_path_given_relative_or_absolute_is_the_same_source(tmp_path, monkeypatch):
    # test_readme: a manifest saved as 'out/m.jsonl.gz' and resumed as its absolute path was
    # refused as another source list
    monkeypatch.chdir(tmp_path)
    relative = fingerprint(sp.IterableWrapper(["out/m.jsonl.gz"]).shuffle_samples())
    absolute = fingerprint(sp.IterableWrapper([str(tmp_path / "out" / "m.jsonl.gz")])
                           .shuffle_samples())
    assert differences(relative, absolute) == []
    urls = [fingerprint(sp.IterableWrapper([u]).shuffle_samples())
            for u in ("s3://b/out/m.jsonl.gz", "s3://b/m.jsonl.gz")]
    assert [d[1] for d in differences(*urls)] == ["iterable"]


# ------------------------------------------------------------------------------ the docs page


def test_the_resume_page_runs_and_says_what_it_shows(tmp_path):
    """docs/resume.md's python blocks, top to bottom, in a fresh interpreter in an empty
    folder: the resumed batches equal the unbroken run's, the refusal it quotes is the one
    raised, and the allowed change starts epoch 1 with each utterance once."""
    import re
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(sp.__file__)))
    with open(os.path.join(root, "docs", "resume.md"), encoding="utf-8") as f:
        page = f.read()
    script = tmp_path / "page.py"
    script.write_text("\n".join(re.findall(r"```python\n(.*?)```", page, re.S)))
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ, PYTHONPATH=root)
    out = subprocess.run([sys.executable, str(script)], cwd=work, env=env, capture_output=True,
                         text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    quoted = re.search(r"prints\n\n```text\n(.*?)```", page, re.S).group(1)
    lines = out.stdout.splitlines()
    assert lines[:2] == ["0", "True"]
    assert quoted in out.stdout
    assert "They take effect from epoch 1, which starts now" in out.stdout
    # the allowed change's section, before the topology section's lines
    ours = [line for line in lines
            if not line.startswith(("rank 0", "recipes' road", "map-style road"))]
    assert ours[-2:] == ["1", "True"]
    assert "recipes' road: True" in lines  # the recipes' road resumed on another topology
    assert "map-style road: True" in lines  # ViewSampler over streams, 2x2 -> 1x0


def test_a_fingerprint_holds_no_credentials_and_a_resigned_url_is_the_same_file():
    import json

    def pipe(url, secret):
        options = sp.ShardReadOptions(remote=sp.RemoteOptions(
            storage_options={"key": "AKIA", "secret": secret}))
        return sp.IterableWrapper([url]).sharded_shuffle(read_options=options)

    a = fingerprint(pipe("https://me:hunter2@host:8080/a.tar?X-Amz-Signature=s1#f", "hush"))
    b = fingerprint(pipe("https://host:8080/a.tar?X-Amz-Signature=s2", "other"))
    text = json.dumps(a)
    for secret in ("hunter2", "me:", "Signature", "hush", "AKIA"):
        assert secret not in text
    assert "https://host:8080/a.tar" in text
    assert differences(a, b) == []
    c = fingerprint(pipe("https://host:8080/b.tar", "hush"))
    assert describe_differences(differences(a, c)) == [
        "1:IterableWrapperIterDataPipe iterable: ['https://host:8080/a.tar'] -> "
        "['https://host:8080/b.tar']"]


def test_a_state_at_an_epoch_start_replaces_a_position_loaded_before(corpus):
    # a second load_state_dict (a state saved between epochs, or an accepted change) left
    # the first one's mid-epoch position in the DataLoader: the next pass resumed it
    mid = saved_mid_epoch(stream(corpus), workers=0)
    loader = sp.build_loader(stream(corpus))
    list(loader)
    boundary = loader.state_dict()
    again = sp.build_loader(stream(corpus))
    again.load_state_dict(mid)
    again.load_state_dict(boundary)
    assert again.epoch == 1
    assert keys(again) == keys(sp.build_loader(stream(corpus)).set_epoch(1))


def test_a_public_counter_a_pass_changes_is_taken_before_the_first_pass():
    # without workers the stages run in the loader's process: a public attribute a pass
    # changes (a stage's own counter) must not make the state refuse a freshly built loader
    from torch.utils.data import IterDataPipe

    class Counting(IterDataPipe):
        holds_nothing = True  # it counts, item by item

        def __init__(self, source):
            self.source = source
            self.count = 0

        def __iter__(self):
            for item in self.source:
                self.count += 1
                yield item

    def pipe():
        return (Counting(sp.IterableWrapper(rows()).shuffle_samples(seed=6)).map(_with_feats)
                .block_batch(sp.PaddedArea(150), shuffle_window=2, seed=3)
                .collate(collate_fn=PadCollate()))

    state = saved_mid_epoch(pipe(), workers=0, steps=3)
    assert any(fields.get("count") == 0 for _, fields in state["fingerprint"]["stages"])
    sp.build_loader(pipe()).load_state_dict(state)  # no ResumeError
