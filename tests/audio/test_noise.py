"""add_noise and reverberate (speechpipe.pipes.audio._noise), issue 21 part A.

Invariants: the SNR achieved (computed from the clean and the mixed signal) is the SNR drawn,
to float32 rounding (tolerance 0.01 dB); ``p`` is the share of utterances changed; the same
seed and epoch give the same mixtures, another epoch others; a pass cut anywhere and resumed
from ``state_dict`` in a new pipeline (held samples included, two DataLoader workers too)
repeats the uninterrupted pass; bad input raises a DataError naming the file or key.
"""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import soundfile

import speechpipe  # noqa: F401  (registers the pipes)
from speechpipe.errors import DataError
from speechpipe.loader import PipeDataset, build_loader
from speechpipe.pipes._core import IterableWrapper
from speechpipe.pipes.collate import PadCollate
from speechpipe.pipes.audio import AUGMENT, convolve_rir, snr_db
from speechpipe import PaddedArea

RATE = 16000
#: The SNR achieved equals the SNR drawn to this many dB (float32 rounding of the mixture).
SNR_TOLERANCE_DB = 0.01


def utterances(n: int = 24, seed: int = 0, channels: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        length = int(rng.integers(2000, 9000))
        shape = (length, channels) if channels else (length,)
        out.append({"key": f"u{i:02d}", "audio": rng.standard_normal(shape).astype(np.float32)
                    * 0.1, "sample_rate": RATE, "duration": length / RATE})
    return out


def write_noise(root, lengths=(30000, 700, 12000, 4000, 50000, 2500), rate=RATE) -> str:
    """Noise WAV files (real files) and a JSON-lines manifest naming them."""
    rng = np.random.default_rng(7)
    rows = []
    for i, length in enumerate(lengths):
        path = root / f"noise-{i}.wav"
        soundfile.write(path, (rng.standard_normal(length) * 0.05).astype(np.float32), rate)
        rows.append({"key": f"n{i}", "audio_path": str(path), "duration": length / rate})
    manifest = root / "noise.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(manifest)


def noise_pipe(manifest: str):
    return IterableWrapper([manifest]).open_files(mode="b").parse_manifest().load_audio()


def rirs(n: int = 5) -> list[dict]:
    rng = np.random.default_rng(3)
    out = []
    for i in range(n):
        rir = np.zeros(400 + 50 * i, np.float32)
        rir[10 + i] = 1.0
        rir[20 + i:] += (rng.standard_normal(rir.shape[0] - 20 - i) * 0.1
                         * np.exp(-np.arange(rir.shape[0] - 20 - i) / 80)).astype(np.float32)
        out.append({"key": f"r{i}", "audio": rir, "sample_rate": RATE})
    return out


@pytest.fixture()
def noise(tmp_path):
    return noise_pipe(write_noise(tmp_path))


def _mixed(pipe) -> list[tuple]:
    return [(s["key"], s["audio"].tobytes(), json.dumps(s[AUGMENT])) for s in pipe]


# ------------------------------------------------------------------------------ functional


@pytest.mark.parametrize("babble, channels", [(1, 0), (3, 0), (1, 2)])
def test_the_snr_achieved_is_the_snr_drawn(noise, babble, channels):
    clean = utterances(channels=channels)
    out = list(IterableWrapper(clean).add_noise(noise, snr_db=(-5.0, 20.0), babble=babble,
                                                 pool_size=4, seed=1))
    drawn = []
    for before, after in zip(clean, out):
        [entry] = after[AUGMENT]
        assert entry["kind"] == "noise" and len(entry["keys"]) == babble
        assert -5.0 <= entry["snr_db"] <= 20.0
        assert after["audio"].shape == before["audio"].shape
        assert after["audio"].dtype == np.float32
        assert abs(snr_db(before["audio"], after["audio"]) - entry["snr_db"]) < SNR_TOLERANCE_DB
        drawn.append(entry["snr_db"])
    assert max(drawn) - min(drawn) > 5.0  # drawn from the range, not one value


def test_noise_at_another_rate_is_resampled(tmp_path):
    pipe = noise_pipe(write_noise(tmp_path, lengths=(5000, 900), rate=8000))
    [out] = IterableWrapper(utterances(1)).add_noise(pipe, snr_db=(3.0, 3.0))
    assert out["sample_rate"] == RATE
    assert abs(snr_db(utterances(1)[0]["audio"], out["audio"]) - 3.0) < SNR_TOLERANCE_DB


def test_p_0_leaves_the_audio_untouched_and_p_1_always_mixes(noise):
    clean = utterances()
    kept = list(IterableWrapper(clean, deepcopy=False).add_noise(noise, p=0.0))
    assert all(a["audio"] is b["audio"] and a[AUGMENT] == [] for a, b in zip(kept, clean))
    mixed = list(IterableWrapper(clean).add_noise(noise, p=1.0))
    assert all(len(s[AUGMENT]) == 1 and not np.array_equal(s["audio"], c["audio"])
               for s, c in zip(mixed, clean))
    half = list(IterableWrapper(utterances(200)).add_noise(noise, p=0.5, seed=3))
    assert 70 < sum(bool(s[AUGMENT]) for s in half) < 130


def test_same_seed_same_mixtures_other_epoch_other_mixtures(noise):
    clean = utterances()
    first = _mixed(IterableWrapper(clean).add_noise(noise, seed=5))
    assert first == _mixed(IterableWrapper(clean).add_noise(noise, seed=5))
    other = IterableWrapper(clean).add_noise(noise, seed=5).set_epoch(1)
    assert _mixed(other) != first
    pipe = IterableWrapper(clean).reverberate(rirs(), seed=5)
    assert _mixed(pipe) == _mixed(pipe.set_epoch(0)) != _mixed(pipe.set_epoch(1))


def test_a_pickled_pipe_draws_the_same(noise):
    pipe = IterableWrapper(utterances()).add_noise(noise, seed=2).reverberate(rirs(), seed=2)
    assert _mixed(pickle.loads(pickle.dumps(pipe))) == _mixed(pipe)


def test_len_is_the_sources(noise):
    assert len(IterableWrapper(utterances(5)).add_noise(noise).reverberate(rirs())) == 5


def test_reverberation_is_aligned_on_the_peak_and_keeps_the_energy():
    audio = utterances(1)[0]["audio"]
    delta = np.zeros(300, np.float32)
    delta[37] = 0.5  # a pure delayed direct path: the output is the input
    np.testing.assert_allclose(convolve_rir(audio, delta), audio, atol=1e-6)
    for rir in rirs():
        out = convolve_rir(audio, rir["audio"])
        assert out.shape == audio.shape
        assert np.sum(out.astype(np.float64) ** 2) == pytest.approx(
            np.sum(audio.astype(np.float64) ** 2), rel=1e-5)
        # the direct path stays where the speech is: the output follows the input
        assert np.corrcoef(out, audio)[0, 1] > 0.5
    stereo = np.stack([audio, -audio], axis=1)
    out = convolve_rir(stereo, rirs()[1]["audio"])
    np.testing.assert_allclose(out[:, 0], -out[:, 1], atol=1e-6)


def test_reverberate_records_the_response_and_p_0_changes_nothing():
    clean = utterances()
    out = list(IterableWrapper(clean).reverberate(rirs(), seed=4))
    assert all(s[AUGMENT][0]["kind"] == "reverb" and s[AUGMENT][0]["keys"][0].startswith("r")
               for s in out)
    assert len({s[AUGMENT][0]["keys"][0] for s in out}) > 2
    kept = list(IterableWrapper(clean, deepcopy=False).reverberate(rirs(), p=0.0))
    assert all(a["audio"] is b["audio"] for a, b in zip(kept, clean))


def test_both_stages_record_in_order(noise):
    [s] = IterableWrapper(utterances(1)).reverberate(rirs()).add_noise(noise)
    assert [e["kind"] for e in s[AUGMENT]] == ["reverb", "noise"]


def test_the_pool_streams_the_source_and_never_holds_it_whole(tmp_path):
    reads = []

    def counted(row):
        reads.append(row["key"])
        return row

    source = noise_pipe(write_noise(tmp_path)).map(counted)
    it = iter(IterableWrapper(utterances(3)).add_noise(source, pool_size=2))
    next(it)
    assert len(reads) == 3  # the pool (2) and the replacement of the item drawn
    list(it)
    assert len(reads) == 5


# ------------------------------------------------------------------------------ resume


def _augmented_batches(noise_source, clean, *, history=4096, window=2):
    pipe = IterableWrapper(clean).shuffle_samples(seed=1)
    pipe = pipe.reverberate(rirs(), p=0.7, seed=2, pool_size=2, history=history)
    pipe = pipe.add_noise(noise_source, snr_db=(0.0, 10.0), p=0.8, babble=2, pool_size=3,
                          seed=3, history=history)
    pipe = pipe.bucket_by_length(8, seed=4).block_batch(PaddedArea(20000), shuffle_window=window,
                                                        seed=5)
    return pipe.collate(collate_fn=PadCollate())


def _summary(batch) -> tuple:
    return (tuple(batch["key"]), float(batch["audio"].double().sum()),
            json.dumps(batch[AUGMENT]))


@pytest.mark.parametrize("where, window", [("start", 2), ("middle", 2), ("ended", 64)])
def test_a_resumed_pass_draws_what_the_uninterrupted_one_drew(tmp_path, where, window):
    manifest, clean = write_noise(tmp_path), utterances(40)

    def make():
        return PipeDataset(_augmented_batches(noise_pipe(manifest), clean, window=window))

    full = [_summary(b) for b in make()]
    cut = len(full) // 2 if where == "middle" else 1
    dataset = make()
    it = iter(dataset)
    head = [_summary(next(it)) for _ in range(cut)]
    state = json.loads(json.dumps(dataset.state_dict()))  # plain data
    it.close()
    mine = [s for path, s in state["stages"].items() if "Noise" in path or "Rir" in path]
    # the cut is inside both passes, or after them ("ended": block_batch's window of 64 has
    # read every sample), with samples held above that a restore replays with the history
    assert all(s["ended"] is (where == "ended") and s["history"] for s in mine)
    again = make()
    again.load_state_dict(state)
    assert head + [_summary(b) for b in again] == full
    assert len(full) > cut + 1


def loader_run_and_resumes(loader, summary, cuts: tuple[int, ...], epochs: int = 2):
    """The uninterrupted run of ``loader()`` over ``epochs`` (``summary`` per batch) and, for
    each step of ``cuts``, what a new loader given the state saved after that step yields to
    the end. Invariant: ``resumed[step] == full[step:]``."""
    full, states = [], {}
    first = loader()
    for epoch in range(epochs):
        first.set_epoch(epoch)
        for batch in first:
            full.append(summary(batch))
            if len(full) in cuts:
                states[len(full)] = first.state_dict()
    assert set(states) == set(cuts), "a cut is past the end of the run"
    resumed = {}
    for step, state in states.items():
        again = loader()
        again.load_state_dict(state)
        out, start = [], again.epoch
        for epoch in range(start, epochs):
            if epoch > start:
                again.set_epoch(epoch)
            out.extend(summary(b) for b in again)
        resumed[step] = out
    return full, resumed


def test_a_resumed_loader_with_two_workers_repeats_the_uninterrupted_run(tmp_path):
    manifest, clean = write_noise(tmp_path), utterances(48)

    def loader():
        return build_loader(_augmented_batches(noise_pipe(manifest), clean), num_workers=2,
                            persistent_workers=True)

    full, resumed = loader_run_and_resumes(loader, _summary, (2, 5, 9))
    assert len(full) > 9 and full[: len(full) // 2] != full[len(full) // 2:]
    for step, out in resumed.items():
        assert out == full[step:], f"resumed after step {step} differs"


def test_a_history_shorter_than_what_is_held_above_is_named_on_resume(tmp_path):
    manifest, clean = write_noise(tmp_path), utterances(40)
    dataset = PipeDataset(_augmented_batches(noise_pipe(manifest), clean, history=1))
    it = iter(dataset)
    next(it)
    state = dataset.state_dict()
    it.close()
    again = PipeDataset(_augmented_batches(noise_pipe(manifest), clean, history=1))
    with pytest.raises(DataError, match="raise history="):
        again.load_state_dict(state)
        next(iter(again))


# ------------------------------------------------------------------------------ bad input


def test_an_empty_noise_source_is_named():
    with pytest.raises(DataError, match="add_noise: the source yielded nothing"):
        list(IterableWrapper(utterances(2)).add_noise([]))


def test_a_silent_noise_is_named_by_key():
    silent = [{"key": "quiet", "audio": np.zeros(800, np.float32), "sample_rate": RATE}]
    with pytest.raises(DataError, match="silent") as err:
        list(IterableWrapper(utterances(2)).add_noise(silent))
    assert err.value.key == "quiet"


def test_a_silent_response_is_named_by_key():
    silent = [{"key": "flat", "audio": np.zeros(80, np.float32), "sample_rate": RATE}]
    with pytest.raises(DataError, match="silent") as err:
        list(IterableWrapper(utterances(2)).reverberate(silent))
    assert err.value.key == "flat"


def test_a_silent_utterance_is_named_by_key(noise):
    rows = [{"key": "mute", "audio": np.zeros(4000, np.float32), "sample_rate": RATE}]
    with pytest.raises(DataError, match="utterance is silent") as err:
        list(IterableWrapper(rows).add_noise(noise))
    assert err.value.key == "mute"


def test_a_noise_file_that_does_not_decode_is_named(tmp_path):
    bad = tmp_path / "broken.wav"
    bad.write_bytes(b"RIFF not really a wav file")
    manifest = tmp_path / "bad.jsonl"
    manifest.write_text(json.dumps({"key": "broken", "audio_path": str(bad)}) + "\n")
    with pytest.raises(DataError) as err:
        list(IterableWrapper(utterances(2)).add_noise(noise_pipe(str(manifest))))
    assert "broken.wav" in str(err.value) and err.value.key == "broken"


def test_noise_without_audio_is_named_by_key():
    with pytest.raises(DataError, match="no 'audio'") as err:
        list(IterableWrapper(utterances(1)).add_noise([{"key": "n0", "sample_rate": RATE}]))
    assert err.value.key == "n0"


@pytest.mark.parametrize("kwargs, error", [
    ({"snr_db": (10.0, 0.0)}, ValueError), ({"snr_db": 5.0}, TypeError),
    ({"p": 1.5}, ValueError), ({"babble": 0}, ValueError),
    ({"babble": 4, "pool_size": 2}, ValueError), ({"pool_size": 0}, ValueError),
    ({"history": -1}, ValueError), ({"seed": "x"}, TypeError),
])
def test_bad_arguments_are_refused_in_the_constructor(kwargs, error):
    with pytest.raises(error):
        IterableWrapper([]).add_noise([{"key": "n"}], **kwargs)


def test_a_source_that_cannot_be_read_again_is_refused():
    with pytest.raises(TypeError, match="iterator"):
        IterableWrapper([]).reverberate(iter(rirs()))
    with pytest.raises(TypeError, match="re-iterable"):
        IterableWrapper([]).reverberate("rirs.jsonl")


# ------------------------------------------------------------------------------ train builder


@pytest.fixture(scope="module")
def demo_with_noise(tmp_path_factory):
    """The demo corpus's manifest, MUSAN's noise and RIRS_NOISES's small and medium rooms
    (fixtures in their official layouts), prepared by their recipes."""
    from speechpipe.demo import DEMO_CORPUS
    from speechpipe.recipes.librispeech import prepare_librispeech
    from speechpipe.recipes.musan import prepare_musan
    from speechpipe.recipes.rirs_noises import prepare_rirs_noises
    from speechpipe.testing import write_musan, write_rirs_noises

    root = tmp_path_factory.mktemp("augment")
    speech = prepare_librispeech(DEMO_CORPUS, root, parts=["dev-clean"], progress=False)
    noise = prepare_musan(write_musan(root / "src"), root, parts="noise", progress=False)
    rirs = prepare_rirs_noises(write_rirs_noises(root / "src"), root,
                               parts=["smallroom", "mediumroom"], progress=False)
    return speech, noise["noise"], rirs


def _train(demo_with_noise, **options):
    from speechpipe.recipes.librispeech import librispeech_train

    speech, noise, rirs = demo_with_noise
    options = {"noise_p": 0.8, "rir_p": 0.5, **options}
    return librispeech_train(speech, ["dev-clean"], seed=0, budget=12.0,
                             bucket_buffer=8, noise=noise, snr_db=(5.0, 15.0), rir=rirs,
                             **options)


def _train_summary(batch) -> tuple:
    return (tuple(batch["key"]), float(batch["feats"].double().sum()), json.dumps(batch[AUGMENT]))


def test_a_train_builder_with_noise_and_reverberation_resumes_exactly_on_two_workers(
        demo_with_noise):
    def loader():
        return build_loader(_train(demo_with_noise), num_workers=2, persistent_workers=True,
                            snapshot_every=2)

    full, resumed = loader_run_and_resumes(loader, _train_summary, (1, 3, 6))
    kinds = [e["kind"] for _, _, augment in full for s in json.loads(augment) for e in s]
    assert kinds.count("noise") > kinds.count("reverb") > 0
    assert len(full) > 6
    for step, out in resumed.items():
        assert out == full[step:], f"resumed after step {step} differs"


def test_the_builder_puts_reverberation_and_noise_before_the_features(demo_with_noise):
    from speechpipe.recipes import train_pipeline

    clean = [_train_summary(b) for b in _train(demo_with_noise, noise_p=0.0, rir_p=0.0)]
    noisy = [_train_summary(b) for b in _train(demo_with_noise, noise_p=1.0, rir_p=1.0)]
    assert [k for k, _, _ in clean] == [k for k, _, _ in noisy]  # the same order and batches
    assert all(a[1] != b[1] for a, b in zip(clean, noisy))  # features of changed audio
    assert all(json.loads(a) == [[]] * len(k) for k, _, a in clean)
    with pytest.raises(ValueError, match="perturbs nothing"):
        from speechpipe.recipes import FrontEnd, eval_pipeline
        eval_pipeline([[]], front_end=FrontEnd(noise=[{"key": "n"}]))
    with pytest.raises(ValueError, match="noise and rir need audio"):
        train_pipeline([[{"key": "u", "feats_path": "x", "duration": 1.0}]], input="feats",
                       features=None, noise=[{"key": "n"}])
