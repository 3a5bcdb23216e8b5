"""The streaming road: sharded_shuffle over tar shards and Kaldi arks, index length, ETA.

Every shard is made here: tars with speechpipe's ShardWriter and webdataset.TarWriter, arks
with kaldiio.WriteHelper / save_ark; remote shards come from a real HTTP server on 127.0.0.1.

Invariants:
- each epoch yields every sample of every shard exactly once (under on_error="raise");
- the shard order is a function of (seed, epoch) only, the same on every rank and worker, and
  the processes read disjoint sets of shards whose union is all of them;
- the output is a function of (seed, epoch, rank, worker): same inputs, same samples in the
  same order;
- no more than buffer_size samples are read ahead of those yielded;
- a bad shard raises an error naming it, or under "skip" is counted and warned about.
"""

from __future__ import annotations

import collections
import os
import pickle
import random
import warnings

import kaldiio
import numpy as np
import pytest
import torch
import webdataset as wds

import speechpipe
from speechpipe.diagnostics import SkippedInputWarning
from speechpipe.errors import DataError, MissingDataError, UnsafeInputError
from speechpipe.index import ShardEntry, ShardIndex
from speechpipe.pipes.order import _streaming as sharding
from speechpipe.pipes._core import IterableWrapper
from speechpipe.pipes.order import shuffle_shards, split_shards
from speechpipe.pipes.order import shuffle_buffer
from speechpipe.pipes.order import EpochPlan, EpochProgress, PlannedShard
from speechpipe.pipes.shards import ShardWriter
from speechpipe.pipes.order import read_shard, ShardedShuffler
from speechpipe.pipes.kaldi import kaldi_arks
from speechpipe.seeding import Position
from speechpipe.testing import serve_directory

NUM_SHARDS = 6
PER_SHARD = 5


# --------------------------------------------------------------------------------------------
# fixtures
# --------------------------------------------------------------------------------------------


def write_shards(folder, num_shards=NUM_SHARDS, per_shard=PER_SHARD) -> list[str]:
    """Shards data-00000.tar ... of samples s<shard>_<i> with a txt field (file order = i)."""
    folder.mkdir(parents=True, exist_ok=True)
    with ShardWriter(str(folder / "data-%05d.tar"), maxcount=per_shard) as writer:
        for shard in range(num_shards):
            for i in range(per_shard):
                writer.write({"key": f"s{shard}_{i}", "txt": f"shard {shard} sample {i}"})
    return writer.paths


@pytest.fixture
def shards(tmp_path):
    return write_shards(tmp_path / "shards")


def write_index(paths) -> ShardIndex:
    """index.jsonl beside the shards, with counts read from the shards themselves."""
    entries = []
    for path in paths:
        keys = [s["key"] for s in read_shard(path)]
        entries.append(ShardEntry(os.path.basename(path), len(keys), os.path.getsize(path),
                                  tuple(keys), tuple(10.0 for _ in keys)))
    index = ShardIndex(os.path.dirname(paths[0]), entries)
    index.write()
    return index


def keys_of(pipe):
    return [s["key"] for s in pipe]


def shard_order(samples) -> list[str]:
    """The shards in the order their first sample came out (buffer_size=1: reading order)."""
    order = []
    for s in samples:
        if s["source"] not in order:
            order.append(s["source"])
    return order


def all_keys(num_shards=NUM_SHARDS, per_shard=PER_SHARD):
    return sorted(f"s{shard}_{i}" for shard in range(num_shards) for i in range(per_shard))


# --------------------------------------------------------------------------------------------
# functional: every sample once, two levels of order
# --------------------------------------------------------------------------------------------


def test_every_sample_exactly_once_per_epoch(shards):
    pipe = IterableWrapper(shards).sharded_shuffle(buffer_size=7, seed=3)
    for epoch in range(3):
        keys = keys_of(pipe.set_epoch(epoch))
        assert sorted(keys) == all_keys()  # sorted() would hide duplicates, so also:
        assert len(set(keys)) == len(keys)


def test_fields_stay_raw_bytes_for_decode_to_handle(shards):
    sample = next(iter(IterableWrapper(shards).sharded_shuffle(buffer_size=1)))
    assert isinstance(sample["txt"], bytes)
    decoded = next(iter(IterableWrapper(shards).sharded_shuffle(buffer_size=1).decode()))
    assert decoded["text"].startswith("shard ")


def test_shard_order_changes_across_epochs_and_repeats_for_the_same_seed_and_epoch(shards):
    pipe = IterableWrapper(shards).sharded_shuffle(buffer_size=1, seed=0)
    orders = [shard_order(pipe.set_epoch(e)) for e in range(4)]
    assert all(sorted(o) == sorted(shards) for o in orders)
    assert len({tuple(o) for o in orders}) > 1
    again = IterableWrapper(shards).sharded_shuffle(buffer_size=1, seed=0).set_epoch(2)
    assert shard_order(again) == orders[2]
    other_seed = IterableWrapper(shards).sharded_shuffle(buffer_size=1, seed=1)
    assert [shard_order(other_seed.set_epoch(e)) for e in range(4)] != orders


def test_shard_order_is_the_documented_shuffle_of_the_list(shards):
    pipe = IterableWrapper(shards).sharded_shuffle(buffer_size=1, seed=5).set_epoch(3)
    assert shard_order(pipe) == shuffle_shards(shards, 5, 3)


def test_buffer_size_one_keeps_each_shard_in_file_order(shards):
    samples = list(IterableWrapper(shards).sharded_shuffle(buffer_size=1, seed=2))
    for shard in shards:
        keys = [s["key"] for s in samples if s["source"] == shard]
        assert keys == sorted(keys, key=lambda k: int(k.split("_")[1]))
    # whole shards, one after the other
    sources = [s["source"] for s in samples]
    assert all(len(set(sources[i:i + PER_SHARD])) == 1 for i in range(0, len(sources), PER_SHARD))


def test_a_larger_buffer_changes_the_order_within_shards(shards):
    samples = list(IterableWrapper(shards).sharded_shuffle(buffer_size=8, seed=2))
    reordered = 0
    for shard in shards:
        indices = [int(s["key"].split("_")[1]) for s in samples if s["source"] == shard]
        reordered += indices != sorted(indices)
    assert reordered >= 1


def test_same_seed_and_epoch_give_the_same_samples_in_the_same_order(shards):
    def run(seed, epoch):
        return keys_of(IterableWrapper(shards).sharded_shuffle(buffer_size=6, seed=seed)
                       .set_epoch(epoch))

    assert run(4, 1) == run(4, 1)
    assert run(4, 1) != run(4, 2)
    assert run(4, 1) != run(5, 1)


def test_speechpipe_set_epoch_reaches_the_pipe(shards):
    pipe = IterableWrapper(shards).sharded_shuffle(buffer_size=4).decode()
    speechpipe.set_epoch(pipe, 6)
    direct = IterableWrapper(shards).sharded_shuffle(buffer_size=4).set_epoch(6)
    assert keys_of(pipe) == keys_of(direct)


def test_webdataset_tarwriter_shards_are_read(tmp_path):
    paths = []
    for shard in range(3):
        path = str(tmp_path / f"wds-{shard}.tar")
        with wds.TarWriter(path) as sink:
            for i in range(4):
                sink.write({"__key__": f"w{shard}_{i}", "txt": f"t{i}", "cls": i})
        paths.append(path)
    samples = list(IterableWrapper(paths).sharded_shuffle(buffer_size=3))
    assert sorted(s["key"] for s in samples) == sorted(
        f"w{shard}_{i}" for shard in range(3) for i in range(4))
    assert {s["txt"] for s in samples} == {b"t0", b"t1", b"t2", b"t3"}


def test_a_list_of_names_and_list_shards_both_feed_it(tmp_path, shards):
    pattern = os.path.join(os.path.dirname(shards[0]), "data-0000{0..5}.tar")
    from_pattern = IterableWrapper([pattern]).list_shards().sharded_shuffle(buffer_size=3)
    assert keys_of(from_pattern) == keys_of(ShardedShuffler(shards, buffer_size=3))


def test_empty_shard_list_yields_nothing():
    pipe = IterableWrapper([]).sharded_shuffle(index=ShardIndex("/", []))
    assert list(pipe) == [] and len(pipe) == 0


# --------------------------------------------------------------------------------------------
# the buffer bound
# --------------------------------------------------------------------------------------------


def test_shuffle_buffer_reads_at_most_buffer_size_ahead():
    reads = 0

    def recording(n):
        nonlocal reads
        for i in range(n):
            reads += 1
            yield i

    for size in (1, 3, 10):
        reads = 0
        out = []
        for item in shuffle_buffer(recording(50), size, random.Random(size)):
            # items read but not yet handed out, including this one
            assert reads - len(out) <= size
            out.append(item)
        assert sorted(out) == list(range(50))


def test_the_pipe_holds_at_most_buffer_size_samples(shards, monkeypatch):
    reads = 0
    real = sharding.read_shard

    def recording_read_shard(name, **kwargs):
        nonlocal reads
        for sample in real(name, **kwargs):
            reads += 1
            yield sample

    monkeypatch.setattr(sharding, "read_shard", recording_read_shard)
    for size in (1, 4, 12):
        reads = 0
        yielded = 0
        for _ in IterableWrapper(shards).sharded_shuffle(buffer_size=size, seed=1):
            assert reads - yielded <= size
            yielded += 1
        assert yielded == reads == NUM_SHARDS * PER_SHARD


# --------------------------------------------------------------------------------------------
# splitting across workers and ranks
# --------------------------------------------------------------------------------------------


def test_split_shards_gives_disjoint_parts_covering_every_shard():
    names = [f"n{i}" for i in range(11)]
    parts = [split_shards(names, Position(rank=r, world_size=2, worker=w, num_workers=3))
             for r in range(2) for w in range(3)]
    assert sorted(n for part in parts for n in part) == sorted(names)
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    assert split_shards(names, Position()) == names


def test_every_rank_and_worker_computes_the_same_shard_order(shards, monkeypatch):
    seen = {}
    for rank in range(2):
        for worker in range(2):
            position = Position(rank=rank, world_size=2, worker=worker, num_workers=2)
            monkeypatch.setattr(sharding, "process_position", lambda p=position: p)
            pipe = IterableWrapper(shards).sharded_shuffle(buffer_size=1, seed=9).set_epoch(1)
            seen[(rank, worker)] = shard_order(pipe)
    expected = shuffle_shards(shards, 9, 1)
    for (rank, worker), order in seen.items():  # no index: round robin by rank, then worker
        assert order == expected[rank::2][worker::2]
    assert sorted(s for order in seen.values() for s in order) == sorted(shards)


def _keys_and_worker(sample):
    info = torch.utils.data.get_worker_info()
    return sample["key"], sample["source"], info.id


def test_dataloader_workers_read_disjoint_shards_and_lose_nothing(tmp_path):
    paths = write_shards(tmp_path / "dl", num_shards=5, per_shard=4)

    def run():
        pipe = IterableWrapper(paths).sharded_shuffle(buffer_size=3, seed=1)
        loader = torch.utils.data.DataLoader(pipe.map(_keys_and_worker), batch_size=None,
                                             num_workers=2)
        return list(loader)

    first = run()
    keys = [k for k, _, _ in first]
    assert collections.Counter(keys) == collections.Counter(all_keys(5, 4))
    by_worker = collections.defaultdict(set)
    for _, source, worker in first:
        by_worker[worker].add(source)
    assert set(by_worker) == {0, 1}
    assert not by_worker[0] & by_worker[1]
    assert first == run()  # deterministic across runs


# --------------------------------------------------------------------------------------------
# remote shards
# --------------------------------------------------------------------------------------------


def test_remote_shards_read_identically_to_local_ones(shards):
    folder = os.path.dirname(shards[0])
    local = [(s["key"], s["txt"]) for s in
             IterableWrapper(shards).sharded_shuffle(buffer_size=5, seed=8).set_epoch(2)]
    with serve_directory(folder) as base:
        urls = [f"{base}/{os.path.basename(p)}" for p in shards]
        remote_samples = list(IterableWrapper(urls).sharded_shuffle(buffer_size=5, seed=8)
                              .set_epoch(2))
    assert [(s["key"], s["txt"]) for s in remote_samples] == local
    assert all(s["source"].startswith(base) for s in remote_samples)


def test_a_transfer_cut_short_raises_naming_the_url(shards):
    folder = os.path.dirname(shards[0])
    with serve_directory(folder) as base:
        url = f"{base}/__truncate__/{os.path.basename(shards[0])}"
        with pytest.raises(DataError) as exc_info:
            list(IterableWrapper([url]).sharded_shuffle(buffer_size=2))
    assert url in str(exc_info.value)


def test_pipe_commands_need_allow_pipes_even_under_skip(shards):
    name = f"pipe:cat {shards[0]}"
    with pytest.raises(UnsafeInputError, match="allow_pipes"):
        list(IterableWrapper([name]).sharded_shuffle(on_error="skip"))
    samples = list(IterableWrapper([name]).sharded_shuffle(buffer_size=1, allow_pipes=True))
    assert [s["key"] for s in samples] == [f"s0_{i}" for i in range(PER_SHARD)]


# --------------------------------------------------------------------------------------------
# bad shards
# --------------------------------------------------------------------------------------------


def truncate(path, keep=0.5):
    """Cut a file to a fraction of its content (for a tar: of its members, not the padding
    after the end-of-archive marker, which tar writers add up to a 10 KiB record)."""
    with open(path, "rb") as f:
        data = f.read()
    end = len(data.rstrip(b"\0")) if path.endswith(".tar") else len(data)
    with open(path, "wb") as f:
        f.write(data[:int(end * keep)])


def test_a_truncated_shard_raises_naming_it(shards):
    truncate(shards[2])
    with pytest.raises(DataError) as exc_info:
        list(IterableWrapper(shards).sharded_shuffle(buffer_size=3))
    assert shards[2] in str(exc_info.value)
    assert "truncated shard" in str(exc_info.value)


def test_a_truncated_shard_is_skipped_and_counted_under_skip(shards):
    truncate(shards[2])
    pipe = IterableWrapper(shards).sharded_shuffle(buffer_size=3, on_error="skip")
    with pytest.warns(SkippedInputWarning, match="sharded_shuffle skipped 1"):
        keys = keys_of(pipe)
    assert pipe.diagnostics.total == 1
    assert list(pipe.diagnostics.counts) == ["truncated shard (rest of the shard skipped)"]
    assert shards[2] in pipe.diagnostics.examples[list(pipe.diagnostics.counts)[0]][0]
    others = [k for k in all_keys() if not k.startswith("s2_")]
    assert sorted(k for k in keys if not k.startswith("s2_")) == others
    assert len(keys) == len(set(keys))
    # counts cover the current pass only
    with pytest.warns(SkippedInputWarning):
        list(pipe)
    assert pipe.diagnostics.total == 1


def test_a_skipped_truncated_shard_counts_the_utterances_and_seconds_it_loses(shards):
    # Issue 18, case 3: "skipped 1 item" while the rest of the shard was lost, and len()
    # still counting it. Index lengths are 10 frames (0.1 s) per utterance.
    write_index(shards)
    truncate(shards[2])
    pipe = IterableWrapper(shards).sharded_shuffle(buffer_size=3, index=True, on_error="skip")
    assert len(pipe) == 30
    with pytest.warns(SkippedInputWarning, match=r"losing \d utterance\(s\)"):
        keys = keys_of(pipe)
    lost = 30 - len(keys)
    assert 0 < lost <= 5
    d = pipe.diagnostics
    assert (d.total, d.lost, round(d.lost_seconds, 6), d.planned) == (1, lost, lost / 10, 30)
    report = d.report()
    assert f"skipped shard {shards[2]}: {lost} utterances, {lost / 10:.1f} s" in report
    assert f"came out short: {30 - lost} of the 30 utterances planned (len())" in report


def test_a_skipped_shard_without_an_index_says_its_loss_is_unknown(shards):
    truncate(shards[2])
    pipe = IterableWrapper(shards).sharded_shuffle(buffer_size=3, on_error="skip")
    with pytest.warns(SkippedInputWarning):
        keys_of(pipe)
    assert pipe.diagnostics.lost == 0
    assert "utterances lost unknown (no index)" in pipe.diagnostics.report()


def test_a_missing_shard_raises_naming_it_and_is_counted_under_skip(shards):
    missing = shards[0].replace("data-00000", "data-99999")
    with pytest.raises(MissingDataError) as exc_info:
        list(IterableWrapper([missing] + shards).sharded_shuffle())
    assert missing in str(exc_info.value)
    pipe = IterableWrapper([missing] + shards).sharded_shuffle(on_error="skip")
    with pytest.warns(SkippedInputWarning):
        assert sorted(keys_of(pipe)) == all_keys()
    assert pipe.diagnostics.counts == {"missing shard": 1}


def test_a_corrupt_shard_raises_naming_it(shards):
    with open(shards[1], "r+b") as f:
        f.seek(100)
        f.write(b"garbage!")
    with pytest.raises(DataError) as exc_info:
        list(IterableWrapper(shards).sharded_shuffle())
    assert shards[1] in str(exc_info.value) and "checksum" in str(exc_info.value)


def test_non_string_names_are_a_type_error(shards):
    with pytest.raises(TypeError, match="shard names"):
        list(IterableWrapper([1, 2]).sharded_shuffle())


@pytest.mark.parametrize("kwargs, match", [
    ({"buffer_size": 0}, "buffer_size must be an int >= 1, got 0"),
    ({"format": "zip"}, "format must be one of"),
    ({"index": "index.jsonl"}, "index must be None, True or a ShardIndex"),
    ({"on_error": "ignore"}, "on_error must be one of"),
    ({"seed": 1.5}, "seed must be an int"),
])
def test_constructor_validates_arguments(shards, kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        IterableWrapper(shards).sharded_shuffle(**kwargs)


def test_one_pattern_string_is_refused_with_a_hint():
    with pytest.raises(TypeError, match="list_shards"):
        ShardedShuffler("data/*.tar")


# --------------------------------------------------------------------------------------------
# partial epochs, pickling
# --------------------------------------------------------------------------------------------


def test_a_partial_epoch_closes_its_shard_and_a_restart_begins_again(shards):
    pipe = IterableWrapper(shards).sharded_shuffle(buffer_size=2, seed=4)
    it = iter(pipe)
    head = [next(it)["key"] for _ in range(3)]
    del it  # the generator closes its stream (ResourceWarning is an error in this suite)
    assert keys_of(pipe.set_epoch(0))[:3] == head


def test_pickled_pipe_gives_the_same_output(shards):
    pipe = IterableWrapper(shards).sharded_shuffle(buffer_size=4, seed=2).set_epoch(3)
    clone = pickle.loads(pickle.dumps(pipe))
    assert keys_of(clone) == keys_of(pipe)


# --------------------------------------------------------------------------------------------
# Kaldi arks
# --------------------------------------------------------------------------------------------


def write_kaldi_dir(folder, num_arks=4, per_ark=3, seed=0, **helper_kwargs):
    """A data dir with feats.scp over num_arks arks (written with kaldiio.WriteHelper)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    lines = []
    for a in range(num_arks):
        ark, scp = folder / f"raw_fbank.{a}.ark", folder / f"raw_fbank.{a}.scp"
        with kaldiio.WriteHelper(f"ark,scp:{ark},{scp}", **helper_kwargs) as writer:
            for i in range(per_ark):
                frames = int(rng.integers(2, 9))
                writer(f"utt{a}_{i}", rng.standard_normal((frames, 5)).astype(np.float32))
        lines.append(scp.read_text())
    (folder / "feats.scp").write_text("".join(lines))
    return folder


def test_kaldi_arks_lists_each_ark_once_in_first_appearance_order(tmp_path):
    d = write_kaldi_dir(tmp_path / "train")
    lines = (d / "feats.scp").read_text().splitlines()
    (d / "feats.scp").write_text("\n".join(lines[3:] + lines[:3]) + "\n")
    arks = kaldi_arks(d)
    assert [os.path.basename(a) for a in arks] == [f"raw_fbank.{a}.ark" for a in (1, 2, 3, 0)]
    assert kaldi_arks(d / "feats.scp") == arks


def test_a_kaldi_dir_streams_every_utterance_once_with_kaldiio_arrays(tmp_path):
    d = write_kaldi_dir(tmp_path / "train")
    expected = kaldiio.load_scp(str(d / "feats.scp"))
    pipe = IterableWrapper(kaldi_arks(d)).sharded_shuffle(buffer_size=5, format="ark")
    samples = list(pipe)
    assert sorted(s["key"] for s in samples) == sorted(expected.keys())
    for s in samples:
        assert s["feats"].dtype == np.float32
        np.testing.assert_array_equal(s["feats"], expected[s["key"]])
        assert s["source"].endswith(".ark")
    assert set(samples[0]) == {"key", "feats", "source"}


def test_the_ark_list_order_is_shuffled_per_epoch(tmp_path):
    d = write_kaldi_dir(tmp_path / "train", num_arks=5, per_ark=2)
    pipe = IterableWrapper(kaldi_arks(d)).sharded_shuffle(buffer_size=1, format="ark", seed=0)
    orders = [shard_order(pipe.set_epoch(e)) for e in range(4)]
    assert len({tuple(o) for o in orders}) > 1
    assert shard_order(pipe.set_epoch(1)) == orders[1]
    assert orders[1] == shuffle_shards(kaldi_arks(d), 0, 1)


def test_compressed_and_double_and_text_arks_read_like_kaldiio(tmp_path):
    rng = np.random.default_rng(3)
    mats = {f"u{i}": rng.standard_normal((4 + i, 3)) for i in range(3)}
    arks = []
    for name, kwargs in [("cm", {"compression_method": 2}), ("dm", {}), ("txt", {"text": True})]:
        ark = str(tmp_path / f"{name}.ark")
        data = mats if name != "cm" else {k: v.astype(np.float32) for k, v in mats.items()}
        kaldiio.save_ark(ark, data, **kwargs)
        arks.append(ark)
    for ark in arks:
        got = {s["key"]: s["feats"] for s in
               IterableWrapper([ark]).sharded_shuffle(buffer_size=1, format="ark")}
        want = dict(kaldiio.load_ark(ark))
        assert got.keys() == want.keys()
        for key in want:
            np.testing.assert_allclose(got[key], want[key].astype(np.float32), rtol=1e-6)


def test_remote_arks_read_identically_to_local_ones(tmp_path):
    d = write_kaldi_dir(tmp_path / "train")
    arks = kaldi_arks(d)
    local = [(s["key"], s["feats"].tobytes()) for s in
             IterableWrapper(arks).sharded_shuffle(buffer_size=3, format="ark")]
    with serve_directory(str(d)) as base:
        urls = [f"{base}/{os.path.basename(a)}" for a in arks]
        remote = [(s["key"], s["feats"].tobytes()) for s in
                  IterableWrapper(urls).sharded_shuffle(buffer_size=3, format="ark")]
    assert remote == local


def test_a_truncated_ark_raises_naming_the_ark_and_key(tmp_path):
    d = write_kaldi_dir(tmp_path / "train", num_arks=2)
    arks = kaldi_arks(d)
    truncate(arks[1], keep=0.7)
    with pytest.raises(DataError) as exc_info:
        list(IterableWrapper(arks).sharded_shuffle(format="ark"))
    message = str(exc_info.value)
    assert arks[1] in message and "truncated ark" in message and "(key 'utt1_" in message


def test_a_truncated_ark_is_skipped_and_counted_under_skip(tmp_path):
    d = write_kaldi_dir(tmp_path / "train", num_arks=3)
    arks = kaldi_arks(d)
    truncate(arks[0], keep=0.5)
    pipe = IterableWrapper(arks).sharded_shuffle(format="ark", on_error="skip")
    with pytest.warns(SkippedInputWarning):
        keys = keys_of(pipe)
    assert pipe.diagnostics.counts == {"truncated shard (rest of the shard skipped)": 1}
    assert {k for k in keys if not k.startswith("utt0_")} == {
        f"utt{a}_{i}" for a in (1, 2) for i in range(3)}


def test_a_pickled_object_in_an_ark_is_refused(tmp_path):
    ark = str(tmp_path / "pkl.ark")
    kaldiio.save_ark(ark, {"u1": np.zeros((2, 2), np.float32)}, write_function="pickle")
    with pytest.raises(UnsafeInputError) as exc_info:
        list(IterableWrapper([ark]).sharded_shuffle(format="ark"))
    assert ark in str(exc_info.value) and "(key 'u1')" in str(exc_info.value)


def test_a_file_that_is_not_an_ark_is_named(tmp_path):
    path = str(tmp_path / "notes.ark")
    with open(path, "wb") as f:
        f.write(b"x" * 5000)
    with pytest.raises(DataError, match="not a Kaldi ark") as exc_info:
        list(IterableWrapper([path]).sharded_shuffle(format="ark"))
    assert path in str(exc_info.value)


@pytest.mark.parametrize("value, match", [
    ("raw.ark:12[0:3]", "a range"),
    ("compute-fbank scp:wav.scp ark:- |", "a command cannot be streamed"),
    ("feats.mat", "expected an ark reference"),
])
def test_kaldi_arks_refuses_values_that_cannot_be_streamed(tmp_path, value, match):
    scp = tmp_path / "feats.scp"
    scp.write_text(f"u1 raw.ark:5\nu2 {value}\n")
    with pytest.raises(DataError, match=match) as exc_info:
        kaldi_arks(scp)
    assert f"{scp}:2" in str(exc_info.value) and "(key 'u2')" in str(exc_info.value)


def test_kaldi_arks_without_feats_scp_is_missing_data(tmp_path):
    with pytest.raises(MissingDataError, match="feats.scp"):
        kaldi_arks(tmp_path)


# --------------------------------------------------------------------------------------------
# len and the epoch plan from the index
# --------------------------------------------------------------------------------------------


@pytest.fixture
def uneven_shards(tmp_path):
    """Shards of 1..6 samples, so that a wrong split shows in the counts."""
    folder = tmp_path / "uneven"
    folder.mkdir()
    paths = []
    for shard in range(6):
        path = str(folder / f"data-{shard:05d}.tar")
        with ShardWriter(path) as writer:
            for i in range(shard + 1):
                writer.write({"key": f"s{shard}_{i}", "txt": "x"})
        paths.append(path)
    return paths


def test_len_is_exact_with_an_index(uneven_shards):
    write_index(uneven_shards)
    for index in (True, ShardIndex.read(os.path.dirname(uneven_shards[0]))):
        pipe = IterableWrapper(uneven_shards).sharded_shuffle(buffer_size=4, index=index)
        for epoch in range(2):
            pipe.set_epoch(epoch)
            assert len(pipe) == len(keys_of(pipe)) == 21


def test_len_without_an_index_is_a_type_error_saying_to_pass_one(shards):
    with pytest.raises(TypeError, match="pass index=True"):
        len(IterableWrapper(shards).sharded_shuffle())


def test_len_counts_this_process_shards_only(uneven_shards, monkeypatch):
    write_index(uneven_shards)
    pipe = IterableWrapper(uneven_shards).sharded_shuffle(index=True, seed=1).set_epoch(2)
    order = shuffle_shards(uneven_shards, 1, 2)
    total = 0
    for worker in range(2):
        position = Position(worker=worker, num_workers=2)
        monkeypatch.setattr(sharding, "process_position", lambda p=position: p)
        mine = order[worker::2]
        expected = sum(int(os.path.basename(p)[5:10]) + 1 for p in mine)
        assert len(pipe) == expected == len(keys_of(pipe))
        total += len(pipe)
    assert total == 21


def test_len_of_a_dataloader_is_the_total_over_workers(uneven_shards):
    write_index(uneven_shards)
    pipe = IterableWrapper(uneven_shards).sharded_shuffle(index=True)
    loader = torch.utils.data.DataLoader(pipe, batch_size=None, num_workers=2)
    assert len(loader) == 21


def test_the_index_is_read_lazily_not_in_the_constructor(uneven_shards):
    pipe = IterableWrapper(uneven_shards).sharded_shuffle(index=True)  # no index.jsonl yet
    with pytest.raises(MissingDataError, match="no shard index"):
        len(pipe)
    write_index(uneven_shards)
    assert len(pipe) == 21
    os.remove(os.path.join(os.path.dirname(uneven_shards[0]), "index.jsonl"))
    assert len(pipe) == 21  # read once, then kept


def test_a_shard_missing_from_the_index_is_named(uneven_shards):
    index = write_index(uneven_shards[:-1])
    pipe = IterableWrapper(uneven_shards).sharded_shuffle(index=index)
    with pytest.raises(DataError, match="not in the index") as exc_info:
        len(pipe)
    assert uneven_shards[-1] in str(exc_info.value)


def test_an_index_matches_remote_shards_by_their_path(uneven_shards):
    index = write_index(uneven_shards)
    folder = os.path.dirname(uneven_shards[0])
    with serve_directory(folder) as base:
        urls = [f"{base}/{os.path.basename(p)}" for p in uneven_shards]
        pipe = IterableWrapper(urls).sharded_shuffle(index=index)
        assert len(pipe) == len(keys_of(pipe)) == 21
        # index=True reads the index.jsonl served beside them (issue 22)
        assert len(IterableWrapper(urls).sharded_shuffle(index=True)) == 21
        with pytest.raises(ValueError, match="index=True reads the index.jsonl beside the"):
            len(IterableWrapper(["pipe:cat x.tar"]).sharded_shuffle(index=True,
                                                                     allow_pipes=True))


def test_epoch_plan_lists_this_process_shards_with_counts_and_bytes(uneven_shards):
    write_index(uneven_shards)
    pipe = IterableWrapper(uneven_shards).sharded_shuffle(buffer_size=1, index=True, seed=3)
    plan = pipe.set_epoch(1).epoch_plan()
    assert plan.epoch == 1 and plan.names == shuffle_shards(uneven_shards, 3, 1)
    assert plan.names == shard_order(pipe)
    assert [s.bytes for s in plan.shards] == [os.path.getsize(n) for n in plan.names]
    assert plan.total_count == 21
    other = pipe.epoch_plan(epoch=2, position=Position(rank=1, world_size=2))
    lengths = {p: 10.0 * (i + 1) for i, p in enumerate(uneven_shards)}  # as write_index
    assert other.names == split_shards(shuffle_shards(uneven_shards, 3, 2),
                                       Position(rank=1, world_size=2), weights=lengths)
    assert other.total_count in (10, 11)  # with an index the ranks are balanced by length
    no_index = IterableWrapper(uneven_shards).sharded_shuffle(seed=3).set_epoch(1).epoch_plan()
    assert no_index.names == plan.names and no_index.total_count is None


def test_epoch_plans_give_every_process_plan_and_sample_order_its_reading_order(
        uneven_shards, monkeypatch):
    write_index(uneven_shards)
    pipe = IterableWrapper(uneven_shards).sharded_shuffle(buffer_size=4, index=True, seed=2)
    plans = pipe.set_epoch(1).epoch_plans(world_size=2, num_workers=2)
    assert [[p.position for p in rank] for rank in plans] == [
        [Position(rank=r, world_size=2, worker=w, num_workers=2) for w in range(2)]
        for r in range(2)]
    assert sorted(n for rank in plans for p in rank for n in p.names) == sorted(uneven_shards)
    for rank in plans:
        for plan in rank:
            assert plan == pipe.epoch_plan(position=plan.position)
            assert [len(s.lengths) for s in plan.shards] == [s.count for s in plan.shards]
            keys = [s["key"] for name in plan.names for s in read_shard(name)]
            monkeypatch.setattr(sharding, "process_position", lambda p=plan.position: p)
            assert list(pipe.sample_order(plan, keys)) == keys_of(pipe.set_epoch(1))


# --------------------------------------------------------------------------------------------
# EpochProgress
# --------------------------------------------------------------------------------------------


def synthetic_plan():
    return EpochPlan(0, Position(), (PlannedShard("a", 100, 1_000), PlannedShard("b", 50, 4_000),
                                     PlannedShard("c", 150, 1_000)))


def test_progress_counts_are_exact():
    progress = EpochProgress(synthetic_plan())
    assert progress.total_samples == 300 and progress.total_bytes == 6_000
    assert progress.remaining_samples(0) == 300
    assert progress.remaining_samples(120) == 180
    assert progress.remaining_samples(300) == 0
    assert progress.fraction_done(75) == 0.25
    with pytest.raises(ValueError, match="plan holds 300"):
        progress.remaining_samples(301)


def test_progress_eta_extrapolates_the_rate_by_samples_or_bytes():
    progress = EpochProgress(synthetic_plan())
    assert progress.remaining_seconds(0, elapsed=5.0) is None
    assert progress.remaining_seconds(100, elapsed=20.0) == pytest.approx(40.0)  # 5 samples/s
    # 1500 bytes in 30 s -> 50 B/s; 4500 bytes to go
    assert progress.remaining_seconds(120, 30.0, consumed_bytes=1_500) == pytest.approx(90.0)
    assert progress.remaining_seconds(300, elapsed=60.0) == 0.0


def test_progress_remaining_shards_is_within_the_buffer_bound():
    progress = EpochProgress(synthetic_plan(), buffer_size=30)
    # 90 yielded: the reader stands between 90 and 120, i.e. in shard a or b
    assert progress.remaining_shards(90) == (2, 3)
    assert progress.remaining_shards(100) == (2, 2)
    assert progress.remaining_shards(140) == (1, 2)
    assert progress.remaining_shards(300) == (0, 0)
    assert EpochProgress(synthetic_plan()).remaining_shards(90) == (3, 3)


def test_progress_remaining_shards_brackets_the_real_reader(uneven_shards, monkeypatch):
    write_index(uneven_shards)
    reads = 0
    real = sharding.read_shard

    def recording_read_shard(name, **kwargs):
        nonlocal reads
        for sample in real(name, **kwargs):
            reads += 1
            yield sample

    monkeypatch.setattr(sharding, "read_shard", recording_read_shard)
    pipe = IterableWrapper(uneven_shards).sharded_shuffle(buffer_size=4, index=True, seed=2)
    plan = pipe.epoch_plan()
    ends = np.cumsum([s.count for s in plan.shards])
    progress = EpochProgress(plan, buffer_size=4)
    brackets = set()
    for consumed, _ in enumerate(pipe, start=1):
        unfinished = int(np.sum(ends > reads))  # shards the reader has not read to the end
        fewest, most = progress.remaining_shards(consumed)
        assert fewest <= unfinished <= most
        brackets.add(most - fewest)
    assert consumed == 21 and max(brackets) >= 1  # the bound was not always trivially tight


def test_progress_needs_counts():
    with pytest.raises(ValueError, match="index"):
        EpochProgress([PlannedShard("a")])


def test_no_skip_warning_without_skips(shards):
    with warnings.catch_warnings():
        warnings.simplefilter("error", SkippedInputWarning)
        list(IterableWrapper(shards).sharded_shuffle(on_error="skip"))


# --------------------------------------------------------------------------------------------
# few shards for many processes (issue 18, case 8)
# --------------------------------------------------------------------------------------------


@pytest.fixture
def two_shards(tmp_path):
    """Two shards of 7 and 4 samples, with an index (lengths 10 frames each)."""
    folder = tmp_path / "two"
    folder.mkdir()
    with ShardWriter(str(folder / "data-%05d.tar"), maxcount=7) as writer:
        for i in range(11):
            writer.write({"key": f"k{i:02d}", "txt": str(i)})
    write_index(writer.paths)
    return writer.paths


def _at(monkeypatch, rank, world, worker=0, workers=1):
    position = Position(rank=rank, world_size=world, worker=worker, num_workers=workers)
    monkeypatch.setattr(sharding, "process_position", lambda: position)


def test_a_whole_shard_split_that_drops_much_is_warned_at_start_with_the_figures(
        two_shards, monkeypatch):
    _at(monkeypatch, 0, 2, 0, 2)
    pipe = IterableWrapper(two_shards).sharded_shuffle(buffer_size=1, index=True)
    with pytest.warns(sharding.UnevenSplitWarning) as caught:
        keys_of(pipe)
    message = str(caught[0].message)
    assert "2 shard(s) for 2 rank(s) x 2 worker(s): whole shards give the ranks" in message
    assert "drop about 3 utterances (27% of the audio) per epoch" in message
    assert "2 of 4 workers read no shard" in message
    assert "ShardSplit(level='sample')" in message and "--utts-per-shard" in message
    _at(monkeypatch, 1, 2, 1, 2)  # one warning per epoch: from rank 0's first worker only
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        keys_of(IterableWrapper(two_shards).sharded_shuffle(buffer_size=1, index=True))


def test_a_sample_level_split_gives_every_sample_once_with_exact_lengths(
        two_shards, monkeypatch):
    split = sharding.ShardSplit(level="sample")
    seen, per_rank_len = {}, {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no uneven-split warning
        for rank in range(2):
            _at(monkeypatch, rank, 2)
            per_rank_len[rank] = len(IterableWrapper(two_shards).sharded_shuffle(
                index=True, split=split))
            for worker in range(2):
                _at(monkeypatch, rank, 2, worker, 2)
                pipe = IterableWrapper(two_shards).sharded_shuffle(buffer_size=3, index=True,
                                                                   split=split)
                seen[(rank, worker)] = keys_of(pipe)
                assert len(pipe) == len(seen[(rank, worker)])
    everything = [k for keys in seen.values() for k in keys]
    assert sorted(everything) == [f"k{i:02d}" for i in range(11)]  # none lost, none twice
    assert sorted(len(keys) for keys in seen.values()) == [2, 3, 3, 3]
    for rank in range(2):  # a rank's share does not depend on its workers
        assert per_rank_len[rank] == len(seen[(rank, 0)]) + len(seen[(rank, 1)])


def test_a_sample_level_split_resumes_exactly(two_shards, monkeypatch):
    from speechpipe.loader import build_loader

    _at(monkeypatch, 1, 2)
    split = sharding.ShardSplit(level="sample")

    def loader():
        return build_loader(IterableWrapper(two_shards).sharded_shuffle(
            buffer_size=2, index=True, split=split, seed=4).map(lambda s: s["key"]), seed=4)

    full = list(loader())
    assert len(full) == 5
    first = loader()
    it = iter(first)
    head = [next(it) for _ in range(3)]
    state = first.state_dict()
    again = loader()
    again.load_state_dict(state)
    assert head + list(again) == full


def test_a_sample_level_split_refuses_equalize():
    with pytest.raises(ValueError, match="equalize applies to whole shards"):
        sharding.ShardSplit(level="sample", equalize="drop")
    with pytest.raises(ValueError, match="level must be one of"):
        sharding.ShardSplit(level="rank")


def test_shards_balanced_by_length_but_not_by_count_are_not_warned_about():
    # Budget batches see audio, not utterance counts: 10 short + 1 long shard of equal length.
    a = sharding.assign_shards(["short", "long"], world_size=2)
    assert sharding.uneven_split(a, {"short": 10, "long": 1},
                                 {"short": 100.0, "long": 100.0}) is None
    assert "drop about 9 utterances (82%)" in sharding.uneven_split(a, {"short": 10, "long": 1})


def test_under_a_sample_level_split_each_process_counts_its_share_of_a_lost_shard(
        two_shards, monkeypatch):
    truncate(two_shards[0])
    yielded = lost = 0
    for rank in range(2):
        _at(monkeypatch, rank, 2)
        pipe = IterableWrapper(two_shards).sharded_shuffle(
            index=True, split=sharding.ShardSplit(level="sample"), on_error="skip")
        with pytest.warns(SkippedInputWarning):
            yielded += len(keys_of(pipe))
        lost += pipe.diagnostics.lost
        assert pipe.diagnostics.planned == len(pipe)
    assert 0 < lost and yielded + lost == 11  # each lost utterance counted once, by its owner


def test_the_eta_of_an_epoch_that_came_out_short_counts_without_the_lost(shards):
    # Issue 18, case 3: after a skipped shard, the progress never reached its total.
    write_index(shards)
    truncate(shards[2])
    pipe = IterableWrapper(shards).sharded_shuffle(buffer_size=3, index=True, on_error="skip")
    progress = EpochProgress(pipe.epoch_plan())
    with pytest.warns(SkippedInputWarning):
        came = len(keys_of(pipe))
    assert progress.remaining_samples(came) == pipe.diagnostics.lost > 0
    progress.record_lost(pipe.diagnostics.lost)
    assert progress.remaining_samples(came) == 0 and progress.fraction_done(came) == 1.0
    assert progress.remaining_seconds(came, elapsed=2.0) == 0.0
