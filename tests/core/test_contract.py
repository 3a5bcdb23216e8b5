"""The resume contract (issue 31): a buffering stage is its algorithm plus a few protocol lines.

Invariants:
- a stage written on :class:`speechpipe.Buffering` (``hold`` + ``run``) resumes exactly under
  ``build_loader``: the first k batches, then a new loader that loaded the state, give the
  uninterrupted run's batches; its held samples are named by identity in the state;
- ``build_loader`` refuses, by the stage's name, any stage of the resumable part of a pipeline
  that neither keeps a state nor declares ``holds_nothing``;
- every pipe class speechpipe registers is one or the other (or lives where no resume reaches:
  below a source, or after the loader), and the ones on tiny in-memory samples pickle and give
  the same output after a pickle round-trip.
"""

from __future__ import annotations

import inspect
import pickle

import numpy as np
import pytest

import speechpipe as sp
from speechpipe.testing import cut_and_resume
from speechpipe.pipes._core import Resumable, SampleSource, holds_nothing
from speechpipe.pipes._core._base import IterDataPipe, registered_iter_names


class GrouperByNIterDataPipe(sp.Buffering):
    """The docs' example, as printed there (docs/guide/resuming.md)."""

    def __init__(self, source_datapipe, n):
        self.source_datapipe, self.n = source_datapipe, n

    def hold(self):
        return {"group": []}

    def run(self, held, source):
        group = held["group"]
        for sample in source:
            group.append(sample)
            if len(group) == self.n:
                out = group[:]
                group.clear()
                yield out
        if group:
            out = group[:]
            group.clear()
            yield out


def _protocol_lines() -> int:
    # Invariant: what the stage writes besides its algorithm is at most about five lines: the
    # base class in its bases, ``hold`` (two lines) and ``run``'s signature
    source = inspect.getsource(GrouperByNIterDataPipe)
    return sum(1 for line in source.splitlines()
               if "sp.Buffering" in line or "def hold" in line or "return {\"group\"" in line
               or "def run" in line)


ROWS = [{"key": f"u{i:02d}", "text": "x" * (1 + i % 7)} for i in range(23)]


def _pipe():
    return GrouperByNIterDataPipe(sp.IterableWrapper(ROWS).shuffle_samples(seed=3), 4)


def _keys(batch):
    return [s["key"] for s in batch]


def test_the_group_by_n_example_groups():
    groups = [_keys(g) for g in _pipe()]
    assert [len(g) for g in groups] == [4, 4, 4, 4, 4, 3]
    assert sorted(k for g in groups for k in g) == sorted(r["key"] for r in ROWS)
    assert _protocol_lines() <= 5


@pytest.mark.parametrize("k", [0, 1, 3, 5, 6])
def test_a_buffering_stage_resumes_exactly(k):
    def make():
        return sp.build_loader(_pipe(), snapshot_every=1)

    whole, resumed = cut_and_resume(make, k, _keys)
    assert resumed == whole


def test_its_state_names_held_samples_by_identity_not_value():
    pipe = _pipe()
    it = iter(pipe)
    next(it)
    # a state taken mid-group: the held samples by (source, key), nothing of their values
    source_rows = iter(pipe.source_datapipe)  # noqa: F841  (the stage holds its own pass)
    state = pipe.state_dict()
    held = state["held"]["@dict"]["group"]
    assert held == [] or all(set(entry) == {"@sample"} for entry in held)
    assert "x" not in repr(state)  # no text of any sample in the state


def test_it_resumes_after_its_input_ended():
    def make():
        return sp.build_loader(_pipe(), snapshot_every=1)

    whole, resumed = cut_and_resume(make, 6, _keys)  # the state after the last group
    assert resumed == whole


class HoarderIterDataPipe(IterDataPipe):
    """A stage that keeps items in its generator and says nothing of it."""

    def __init__(self, source_datapipe):
        self.source_datapipe = source_datapipe

    def __iter__(self):
        pool = list(self.source_datapipe)
        yield from reversed(pool)


def test_build_loader_refuses_a_stage_that_neither_keeps_a_state_nor_holds_nothing():
    pipe = HoarderIterDataPipe(sp.IterableWrapper(ROWS).shuffle_samples(seed=0))
    with pytest.raises(TypeError, match="HoarderIterDataPipe .*neither keeps a resumable state"):
        sp.build_loader(pipe)
    sp.build_loader(pipe, resumable=False)  # training without saving the position is allowed


def test_a_stage_that_declares_holding_nothing_is_accepted():
    class Upper(IterDataPipe):
        holds_nothing = True

        def __init__(self, source_datapipe):
            self.source_datapipe = source_datapipe

        def __iter__(self):
            for sample in self.source_datapipe:
                yield {**sample, "text": sample["text"].upper()}

    loader = sp.build_loader(Upper(sp.IterableWrapper(ROWS).shuffle_samples(seed=0)))
    assert len(list(loader)) == len(ROWS)


# --------------------------------------------------------------------------- every pipe

#: Registered pipes that are never in the resumable part of a pipeline: they read what a
#: source is built from (below a source), or run after the loader.
OUTSIDE_RESUME = {
    "list_shards": "lists paths: below a source",
    "parse_manifest": "parses a manifest file: below a source",
    "read_manifest_files": "reads manifest files (or their mapped tables): below a source",
    "parse_scp": "parses a Kaldi table: below a source",
    "read_shards": "reads a shard stream: below a source (sharded_shuffle reads its own)",
    "parse_lhotse": "parses a lhotse manifest: below a source",
    "parse_lhotse_shar": "reads Shar directories: below a source",
    "parse_hf_dataset": "reads Hugging Face datasets: below a source",
    "load_segments": "cuts segments of recordings read whole: below a source",
    "equalize_steps": "runs in the main process, after the DataLoader",
    "zip_by_name": "several sources: their positions are not one state (refused by name)",
    "mix_by_weight": "several sources: their positions are not one state (refused by name)",
    "sample_with_replacement": "draws forever from a source (refused by name)",
}


def _registered() -> dict[str, type]:
    out = {}
    for name in sorted(registered_iter_names()):
        cls = IterDataPipe.functions[name].args[0]
        if cls.__module__.startswith("speechpipe."):
            out[name] = cls
    return out


@pytest.mark.parametrize("name", sorted(_registered()))
def test_every_registered_pipe_keeps_a_state_or_holds_nothing(name):
    cls = _registered()[name]
    if name in OUTSIDE_RESUME:
        assert not issubclass(cls, Resumable) and not getattr(cls, "holds_nothing", False)
        return
    declared = issubclass(cls, (Resumable, SampleSource)) or "holds_nothing" in vars(cls)
    assert declared, f"{cls.__name__} ({name}) declares neither"


def test_the_allow_list_covers_every_registered_pipe():
    assert len(_registered()) >= 40
    assert set(OUTSIDE_RESUME) <= set(_registered())


SAMPLES = [{"key": f"s{i}", "audio": np.full(800 + 160 * i, 0.1, np.float32),
            "sample_rate": 16000, "text": "a b c"[: 1 + i % 5]} for i in range(6)]

#: Pipes applied to tiny in-memory samples: their output after a pickle round-trip of the
#: pipeline equals the output before it, and seeded ones give the same output twice.
ON_SAMPLES = {
    "resample": lambda p: p.resample(8000),
    "downmix": lambda p: p.downmix(),
    "select_channel": lambda p: p.select_channel(0),
    "perturb_volume": lambda p: p.perturb_volume(seed=1),
    "perturb_speed": lambda p: p.perturb_speed(seed=1),
    "compute_features": lambda p: p.compute_features("fbank", num_mel_bins=23),
    "spec_augment": lambda p: p.compute_features("fbank", num_mel_bins=23).spec_augment(seed=1),
    "normalize_text": lambda p: p.normalize_text(),
    "tokenize": lambda p: p.tokenize(sp.CharTokenizer.build(["a b c"])),
    "filter_by_duration": lambda p: p.filter_by_duration(max_duration=0.1),
    "shuffle_samples": lambda p: p.shuffle_samples(seed=2),
    "split_samples": lambda p: p.split_samples(),
    "bucket_by_length": lambda p: p.shuffle_samples(seed=2).bucket_by_length(
        budget=sp.SampleCount(2), num_buckets=2, buffer_size=4, seed=1),
    "block_batch": lambda p: p.shuffle_samples(seed=2).block_batch(sp.SampleCount(2), seed=1),
    "prefetch_in_thread": lambda p: p.prefetch_in_thread(2),
    "map_in_threads": lambda p: p.map_in_threads(dict, num_threads=2),
}


def _summary(item):
    if isinstance(item, list):
        return [_summary(x) for x in item]
    out = {}
    for k, v in item.items():
        out[k] = v.tolist() if hasattr(v, "tolist") else v
    return out


@pytest.mark.parametrize("name", sorted(ON_SAMPLES))
def test_a_pipe_pickles_and_its_seeded_output_repeats(name):
    pipe = ON_SAMPLES[name](sp.IterableWrapper(SAMPLES))
    again = pickle.loads(pickle.dumps(pipe))  # as a DataLoader worker gets it
    sp.set_epoch(pipe, 0)
    first = [_summary(x) for x in pipe]
    sp.set_epoch(again, 0)
    assert [_summary(x) for x in again] == first
    sp.set_epoch(pipe, 0)
    assert [_summary(x) for x in pipe] == first  # the same (seed, epoch): the same output


#: Pipes whose resume is exact above a source (draws in sequence restart on resume: they say so
#: with a ResumeWarning, tested in test_resume; they are left out here).
RESUMED = ["resample", "downmix", "select_channel", "compute_features", "normalize_text",
           "tokenize", "filter_by_duration", "bucket_by_length", "block_batch",
           "prefetch_in_thread", "map_in_threads"]


@pytest.mark.parametrize("name", RESUMED)
@pytest.mark.parametrize("k", [1, 3])
def test_a_pipe_above_a_source_resumes_exactly(name, k):
    def make():
        source = sp.IterableWrapper(SAMPLES).shuffle_samples(seed=5)
        if name in ("shuffle_samples", "bucket_by_length", "block_batch"):
            pipe = ON_SAMPLES[name](sp.IterableWrapper(SAMPLES))
        else:
            pipe = ON_SAMPLES[name](source)
        return sp.build_loader(pipe, snapshot_every=1)

    whole, resumed = cut_and_resume(make, k, _summary)
    assert resumed == whole
