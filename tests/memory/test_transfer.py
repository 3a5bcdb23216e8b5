"""Reused shared memory for worker batches (speechpipe.memory._transfer), with real DataLoader workers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import speechpipe  # noqa: F401  (registers the pipes)
from speechpipe.memory import _transfer as transfer
from speechpipe.loader import build_loader
from speechpipe.pipes._core import IterableWrapper
from speechpipe.pipes.collate import PadCollate

ROWS = 16 * 24  # utterances; batches of 16


def _rows(n: int = ROWS, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    # 80-dim rows of 300-900 frames: a padded batch of 16 is 1.5-4.6 MB, well over MIN_BYTES
    return [{"key": f"k{i}", "feats": np.full((int(rng.integers(300, 900)), 80), i, np.float32)}
            for i in range(n)]


def _with_stats(batch: dict) -> dict:
    """Runs in the worker after collation: the pool's counts so far, as tensors."""
    stats = transfer._pool.stats if transfer._pool is not None else transfer.PoolStats()
    return {**batch, "reused": torch.tensor(stats.reused),
            "fallbacks": torch.tensor(stats.fallbacks), "created": torch.tensor(stats.created)}


def _loader(pipe, **options):
    """These pipelines batch with torch's ``batch``: loaders without resume (transfers are
    what these tests are about)."""
    return build_loader(pipe, resumable=False, **options)


def _pipe(rows: list[dict], stats: bool = False):
    pipe = (IterableWrapper(rows, deepcopy=False).sharding_filter().batch(16)
            .collate(collate_fn=PadCollate(fields=("key", "feats"))))
    return pipe.map(_with_stats).map(_with_pid) if stats else pipe


def _check(batch: dict, rows: list[dict]) -> None:
    """Every row holds its utterance's value up to its length and zeros after."""
    for r, key in enumerate(batch["key"]):
        i = int(key[1:])
        n = len(rows[i]["feats"])
        assert int(batch["feats_len"][r]) == n
        row = batch["feats"][r]
        assert bool((row[:n] == i).all()), f"batch row {r} ({key}) was overwritten"
        assert bool((row[n:] == 0).all())


def test_batches_held_by_the_main_process_are_never_overwritten():
    """The main process keeps every batch of two epochs; workers keep collating. Each batch
    still holds its own numbers at the end: no slot was reused under a live batch (the pool
    runs out and falls back to fresh segments instead)."""
    rows = _rows()
    loader = _loader(_pipe(rows, stats=True), num_workers=2, seed=0, persistent_workers=True)
    held = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        held.extend(loader)
    assert len(held) == 2 * ROWS // 16
    for batch in held:
        _check(batch, rows)
    assert max(int(b["fallbacks"]) for b in held) > 0  # the pool was exhausted, and said so


@pytest.mark.parametrize("window", [1, 3, 8])
def test_batches_released_late_are_intact_and_their_slots_reused(window):
    """A sliding window of held batches (a training step that keeps a few batches alive):
    every batch is intact when it leaves the window, and slots are reused."""
    rows = _rows()
    loader = _loader(_pipe(rows, stats=True), num_workers=2, seed=0)
    window_batches: list[dict] = []
    last = None
    for batch in loader:
        window_batches.append(batch)
        if len(window_batches) > window:
            _check(window_batches.pop(0), rows)
        last = batch
    for batch in window_batches:
        _check(batch, rows)
    assert int(last["reused"]) > 0
    assert int(last["created"]) <= transfer.SLOTS


def test_the_same_batches_with_and_without_reuse():
    rows = _rows()
    runs = []
    for reuse in (False, True):
        loader = _loader(_pipe(rows), num_workers=2, seed=0, reuse_shared_memory=reuse)
        runs.append([(b["key"], b["feats"].clone(), b["feats_len"].clone()) for b in loader])
    assert len(runs[0]) == len(runs[1]) == ROWS // 16
    for (k0, f0, n0), (k1, f1, n1) in zip(*runs):
        assert k0 == k1 and torch.equal(f0, f1) and torch.equal(n0, n1)


def test_spawned_workers_reuse_slots_too():
    rows = _rows(16 * 8)
    loader = _loader(_pipe(rows, stats=True), num_workers=1, seed=0,
                          multiprocessing_context="spawn")
    batches = []
    for batch in loader:
        _check(batch, rows)
        batches.append(int(batch["reused"]))
    assert batches[-1] > 0


def test_without_workers_or_when_turned_off_there_is_no_pool():
    rows = _rows(32)
    assert _loader(_pipe(rows), num_workers=0, seed=0).dataset._transfer is None
    off = _loader(_pipe(rows, stats=True), num_workers=1, seed=0, reuse_shared_memory=False)
    assert off.dataset._transfer is None
    assert [int(b["reused"]) for b in off] == [0, 0]
    with pytest.raises(TypeError, match="reuse_shared_memory"):
        _loader(_pipe(rows), num_workers=1, reuse_shared_memory="yes")


def test_a_slot_taken_again_is_not_freed_by_an_older_batch():
    """The main process clears a slot's flag only if it still holds that batch's tag."""
    key, table, _ = transfer.new_table(1)
    try:
        flags = table.numpy()
        storage = torch.empty(10).untyped_storage()
        flags[0, 3] = 111
        batch = {"x": torch.empty(0).set_(storage, 0, (10,))}
        transfer._rebuild(batch, key, 0, [(3, 111, ("x",))])
        del batch
        del storage
        flags[0, 3] = 222  # (cannot happen while 111 is live; stands for a stale entry)
        transfer.release_now()
        assert flags[0, 3] == 222
        storage = torch.empty(10).untyped_storage()
        flags[0, 4] = 333
        batch = {"x": torch.empty(0).set_(storage, 0, (10,))}
        transfer._rebuild(batch, key, 0, [(4, 333, ("x",))])
        del batch
        transfer.release_now()
        assert flags[0, 4] == 333  # still held here
        del storage
        transfer.release_now()
        assert flags[0, 4] == 0
    finally:
        transfer.forget_table(key)


def test_a_batch_unpickled_where_no_loader_was_built_is_returned_as_is():
    batch = {"x": torch.ones(3)}
    assert transfer._rebuild(batch, "not-a-table", 0, [(0, 1, ("x",))]) is batch


def test_no_slot_is_made_when_dev_shm_is_nearly_full(monkeypatch):
    """The pool leaves /dev/shm's room to torch's own segments: with little free space it
    makes no slot and every batch falls back (still intact)."""
    monkeypatch.setattr(transfer, "_shm_free", lambda: 1 << 20)  # inherited by forked workers
    rows = _rows(16 * 6)
    loader = _loader(_pipe(rows, stats=True), num_workers=1, seed=0,
                          multiprocessing_context="fork")
    batches = list(loader)
    for batch in batches:
        _check(batch, rows)
    assert int(batches[-1]["created"]) == 0 and int(batches[-1]["fallbacks"]) == len(batches)


def test_slots_flagged_by_an_earlier_worker_are_used_by_the_next_one():
    """Workers are new processes each epoch (not persistent): a flag still holding an earlier
    worker's tag (its batch never reached the main process) does not block the slot, whose
    memory the new worker allocates afresh; batches stay intact."""
    rows = _rows(16 * 8)
    loader = _loader(_pipe(rows, stats=True), num_workers=1, seed=0)
    table = loader.dataset._transfer[1].numpy()
    table[0, :] = (1 << 32) | 7  # tags of a process that is not this loader's worker
    batches = list(loader)
    for batch in batches:
        _check(batch, rows)
    assert int(batches[-1]["created"]) > 0 and int(batches[-1]["fallbacks"]) == 0


def _count_fd_transfers(monkeypatch) -> list:
    """Counts the file descriptors the main process receives from workers (torch passes one
    per shared storage: a connection to the worker's resource sharer each time)."""
    from multiprocessing import resource_sharer

    calls = []
    original = resource_sharer.DupFd.detach

    def counting(self):
        calls.append(1)
        return original(self)

    monkeypatch.setattr(resource_sharer.DupFd, "detach", counting)
    return calls


def test_a_slot_crosses_once_and_small_tensors_travel_inline(monkeypatch):
    """Per batch torch would pass one descriptor per tensor (feats, feats_len and the three
    counts here); with the pool only a slot's first batch carries its segment, later ones
    name it, and small tensors come as bytes. The batches are the same."""
    calls = _count_fd_transfers(monkeypatch)
    rows = _rows(16 * 12)
    count = 0
    for batch in _loader(_pipe(rows, stats=True), num_workers=1, seed=0):
        _check(batch, rows)  # (and let go of it: its slot is reused)
        assert batch["feats_len"].dtype == torch.int64 and batch["reused"].ndim == 0
        count += 1
        created, reused = int(batch["created"]), int(batch["reused"])
    assert count == 12 and reused > 0
    assert 0 < len(calls) <= created < count


def test_segments_are_sent_again_to_a_new_pass_of_fresh_workers(monkeypatch):
    """Workers that are not persistent are new processes each pass: the main process lets go
    of the last pass's segments and the new workers send theirs; persistent workers send
    each segment once over both passes."""
    rows = _rows(16 * 6)
    for persistent in (False, True):
        calls = _count_fd_transfers(monkeypatch)
        loader = _loader(_pipe(rows, stats=True), num_workers=1, seed=0,
                              persistent_workers=persistent)
        key = loader.dataset._transfer[0]
        per_pass = []
        for epoch in range(2):
            loader.set_epoch(epoch)
            before = len(calls)
            for batch in loader:
                _check(batch, rows)
            per_pass.append(len(calls) - before)
            kept = {gen for name, (gen, _) in transfer._maps.items() if name[0] == key}
            if persistent:  # kept for the next pass, all of the one worker
                assert kept and all(gen >> 32 == _worker_pid(batch) for gen in kept)
            else:  # the pass's worker has exited: its segments are let go at the pass's end
                assert not kept
            _check(batch, rows)  # the last batch is still intact: it holds its own segment
        if persistent:
            assert per_pass[0] > 0 and per_pass[1] == 0
        else:
            assert per_pass[0] > 0 and per_pass[1] > 0


def _worker_pid(batch: dict) -> int:
    return int(batch["pid"]) & 0x7FFFFFFF


def _with_pid(batch: dict) -> dict:
    import os
    return {**batch, "pid": torch.tensor(os.getpid())}


def _as_tuple(batch: dict) -> tuple:
    return (batch["feats"], {"n": batch["feats_len"], "half": batch["feats_len"].to(
        torch.bfloat16), "none": torch.empty(0, 3)}, batch["key"])


def test_nested_and_tuple_batches_and_dtypes_numpy_lacks_arrive_intact():
    """A batch may be a tuple holding a dict; a bfloat16 tensor (numpy has no such dtype)
    goes as torch sends it; an empty tensor travels inline."""
    rows = _rows(16 * 4)
    pipe = _pipe(rows).map(_as_tuple)
    seen = 0
    for feats, extra, keys in _loader(pipe, num_workers=2, seed=0):
        _check({"key": keys, "feats": feats, "feats_len": extra["n"]}, rows)
        assert extra["half"].dtype == torch.bfloat16
        assert torch.equal(extra["half"], extra["n"].to(torch.bfloat16))
        assert extra["none"].shape == (0, 3)
        seen += len(keys)
    assert seen == len(rows)


def _with_lazy_views(batch: dict) -> dict:
    """Small tensors whose conjugate or negative bit is set (views torch resolves lazily):
    ``.numpy()`` refuses both, so the inline path must resolve them first."""
    z = torch.complex(batch["feats_len"].float(), torch.ones(len(batch["key"])))
    return {**batch, "conj": z.conj(), "neg": z.conj().imag, "lengths": z.real}


def test_small_tensors_with_the_conjugate_or_negative_bit_travel_inline_resolved():
    rows = _rows(16 * 4)
    pipe = _pipe(rows).map(_with_lazy_views)
    seen = 0
    for batch in _loader(pipe, num_workers=2, seed=0):
        _check(batch, rows)
        n = len(batch["key"])
        assert torch.equal(batch["lengths"], batch["feats_len"].float())
        assert torch.equal(batch["neg"], -torch.ones(n))
        assert torch.equal(batch["conj"].resolve_conj(), torch.complex(
            batch["feats_len"].float(), -torch.ones(n)))
        seen += n
    assert seen == len(rows)
