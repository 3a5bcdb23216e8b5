"""shuffle_samples: a global, seeded, split and exactly resumable shuffle of manifest rows
(issue 17: the recipes' road must resume).

Invariant: over all processes, every sample comes out once per epoch; the order depends only
on (seed, epoch); a state restores the next sample; keys find held samples again.
"""

from __future__ import annotations

import pickle

import pytest
import torch

import speechpipe  # noqa: F401  (registers the pipes)
from speechpipe.errors import DataError
from speechpipe.loader import build_loader
from speechpipe.pipes._core import IterableWrapper
from speechpipe.pipes.order import SampleShufflerIterDataPipe
from speechpipe import PaddedArea

ROWS = [{"key": f"u{i:02d}", "text": f"t{i}", "num_frames": i + 1} for i in range(23)]


def _keep(sample: dict) -> bool:
    return True


def keys(pipe) -> list[str]:
    return [s["key"] for s in pipe]


def test_same_seed_and_epoch_same_order_and_epochs_differ():
    a, b = IterableWrapper(ROWS).shuffle_samples(seed=3), IterableWrapper(ROWS).shuffle_samples(seed=3)
    assert keys(a) == keys(b)
    assert sorted(keys(a)) == sorted(r["key"] for r in ROWS)
    assert keys(a) != keys(a.set_epoch(1))
    assert keys(a.set_epoch(0)) != keys(IterableWrapper(ROWS).shuffle_samples(seed=4))


@pytest.mark.parametrize("workers", [2, 3])
def test_workers_share_the_epoch_without_overlap(workers):
    pipe = IterableWrapper(ROWS).shuffle_samples(seed=1)
    loader = torch.utils.data.DataLoader(pipe, batch_size=None, num_workers=workers)
    out = [s["key"] for s in loader]
    assert sorted(out) == sorted(r["key"] for r in ROWS)  # each once


def test_split_false_gives_every_process_everything():
    pipe = IterableWrapper(ROWS).shuffle_samples(seed=1, split=False)
    loader = torch.utils.data.DataLoader(pipe, batch_size=None, num_workers=2)
    assert len([s for s in loader]) == 2 * len(ROWS)


def _tagged(sample: dict) -> dict:
    return {**sample, "worker": torch.utils.data.get_worker_info().id}


@pytest.mark.parametrize("per_process", [False, True])
def test_per_process_gives_every_worker_everything_in_an_order_of_its_own(per_process):
    # A noise source (augment_source) is read whole by every worker: with one order shared by
    # all of them, each worker put the same noise at the same places of its stream.
    pipe = IterableWrapper(ROWS).shuffle_samples(seed=1, split=False, per_process=per_process)
    loader = torch.utils.data.DataLoader(pipe.map(_tagged), batch_size=None, num_workers=2)
    out = [(s["worker"], s["key"]) for s in loader]
    orders = [[k for w, k in out if w == worker] for worker in (0, 1)]
    assert all(sorted(o) == sorted(r["key"] for r in ROWS) for o in orders)  # each whole
    assert (orders[0] != orders[1]) is per_process
    speechpipe.set_epoch(pipe, 0)  # the next pass would be the next epoch (issue 32.12)
    again = [(s["worker"], s["key"]) for s in loader]  # seeded: the same orders again
    assert again == out
    assert keys(pipe) == keys(IterableWrapper(ROWS).shuffle_samples(seed=1, split=False))


def test_len_is_exact_with_a_sized_source_and_refused_without():
    assert len(IterableWrapper(ROWS).shuffle_samples()) == len(ROWS)
    unsized = IterableWrapper(ROWS).filter(_keep).shuffle_samples()
    with pytest.raises(TypeError, match="no len"):
        len(unsized)


def test_a_state_resumes_at_the_next_sample():
    pipe = IterableWrapper(ROWS).shuffle_samples(seed=2)
    full = keys(pipe)
    it = iter(pipe.set_epoch(0))
    head = [next(it)["key"] for _ in range(7)]
    state = pipe.state_dict()
    it.close()
    again = IterableWrapper(ROWS).shuffle_samples(seed=2)
    again.load_state_dict(state)
    assert head + keys(again) == full


def test_a_state_from_another_source_is_refused_naming_the_counts():
    pipe = IterableWrapper(ROWS).shuffle_samples(seed=2)
    it = iter(pipe)
    next(it)
    state = pipe.state_dict()
    it.close()
    other = IterableWrapper(ROWS[:-1]).shuffle_samples(seed=2)
    other.load_state_dict(state)
    with pytest.raises(DataError, match="22 samples.*23"):
        keys(other)


def test_a_repeated_key_is_named():
    with pytest.raises(DataError, match="same key twice") as info:
        keys(IterableWrapper(ROWS + [{"key": "u05"}]).shuffle_samples())
    assert info.value.key == "u05"


def test_an_item_without_a_key_is_named():
    with pytest.raises(DataError, match="string 'key'.*item 1"):
        keys(IterableWrapper([{"key": "a"}, {"text": "b"}]).shuffle_samples())
    with pytest.raises(DataError, match="item 0 is str"):
        keys(IterableWrapper(["a"]).shuffle_samples())


def test_split_samples_keeps_the_order_and_shares_it_between_workers():
    assert keys(IterableWrapper(ROWS).split_samples()) == [r["key"] for r in ROWS]
    loader = torch.utils.data.DataLoader(IterableWrapper(ROWS).split_samples(), batch_size=None,
                                         num_workers=2)
    out = [s["key"] for s in loader]
    assert sorted(out) == sorted(r["key"] for r in ROWS)
    assert out[:4] == ["u00", "u01", "u02", "u03"]  # worker 0 takes u00, worker 1 u01, ...


def test_split_samples_resumes_at_the_next_sample():
    pipe = IterableWrapper(ROWS).split_samples()
    it = iter(pipe)
    [next(it) for _ in range(5)]
    state = pipe.state_dict()
    it.close()
    again = IterableWrapper(ROWS).split_samples()
    again.load_state_dict(state)
    assert keys(again) == [r["key"] for r in ROWS[5:]]


def test_bad_arguments_are_named():
    with pytest.raises(TypeError, match="seed"):
        IterableWrapper(ROWS).shuffle_samples(seed="1")
    with pytest.raises(TypeError, match="split"):
        IterableWrapper(ROWS).shuffle_samples(split=1)
    with pytest.raises(ValueError, match="per_process=True needs split=False"):
        IterableWrapper(ROWS).shuffle_samples(per_process=True)


def test_pickle_round_trip_gives_the_same_order_and_drops_a_pass_read():
    pipe = IterableWrapper(ROWS).shuffle_samples(seed=5)
    pipe._prepared = (list(ROWS), {})  # as if a restore had read the source
    copy = pickle.loads(pickle.dumps(pipe))
    assert copy._prepared is None
    assert keys(copy) == keys(IterableWrapper(ROWS).shuffle_samples(seed=5))
    assert isinstance(copy, SampleShufflerIterDataPipe)


def test_under_build_loader_a_checkpoint_can_be_taken():
    pipe = IterableWrapper(ROWS).shuffle_samples(seed=0).block_batch(PaddedArea(50), seed=0)
    loader = build_loader(pipe, num_workers=2, snapshot_every=1)
    it = iter(loader)
    next(it)
    assert loader.state_dict()["epoch"] == 0  # no TypeError: the pipeline is resumable
    del it
