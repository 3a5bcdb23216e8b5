"""build_loader(..., telemetry=...): the loop's waits, the stages' CPU time from the workers, and a
verdict that names the stage to fix (issue 33)."""

from __future__ import annotations

import time

import pytest
from torch.utils.data import IterDataPipe

import speechpipe as sp
from speechpipe.sample import sample_duration

BUDGET = sp.PaddedArea(budget=20.0, length=sample_duration)


@pytest.fixture(scope="module")
def rows():
    recipe = sp.get_recipe("librispeech")
    return list(recipe.prepare_librispeech(sp.DEMO_CORPUS, None, progress=False)["dev-clean"])


def burn(sample):
    """An augmentation that spends 15 ms of CPU per utterance."""
    end = time.thread_time() + 0.015
    while time.thread_time() < end:
        pass
    return sample


def demo_pipe(rows, *, augment=None):
    pipe = sp.IterableWrapper(rows).shuffle_samples(seed=0)
    pipe = pipe.load_audio(field="audio_path")  # decodes each FLAC file
    if augment is not None:
        pipe = pipe.map(augment)
    pipe = pipe.block_batch(BUDGET, seed=0, shuffle_window=1)  # streams
    return pipe.collate(collate_fn=sp.PadCollate())


def train(loader, step_seconds: float, passes: int = 1) -> None:
    for _ in range(passes):
        for _batch in loader:
            time.sleep(step_seconds)  # the training step, away from the CPU


def by_name(stages: dict) -> dict:
    return {path.split(":", 1)[1]: entry for path, entry in stages.items()}


def stage_of(verdict: str) -> str:
    return verdict.split("; ")[1].split(" takes ")[0]


def test_a_slow_decode_is_named(rows):
    loader = sp.build_loader(demo_pipe(rows), num_workers=1, seed=0, telemetry=True)
    train(loader, 0.0, passes=2)
    verdict = loader.telemetry.verdict()
    assert stage_of(verdict) == "load_audio", loader.telemetry.report()
    assert "DecodeCollate or features on the device" in verdict
    stages = loader.telemetry.stages()
    assert by_name(stages)["load_audio"]["items"] == 72  # 36 utterances, two passes
    assert set(loader.telemetry.per_worker()) == {0}


def test_a_slow_augmentation_is_named(rows):
    loader = sp.build_loader(demo_pipe(rows, augment=burn), num_workers=2, seed=0,
                             telemetry=True)
    train(loader, 0.0)
    telemetry = loader.telemetry
    verdict = telemetry.verdict()
    assert stage_of(verdict) == "map(burn)", telemetry.report()
    assert by_name(telemetry.stages())["map(burn)"]["cpu"] >= 36 * 0.015 * 0.9
    assert set(telemetry.per_worker()) == {0, 1}  # both workers' figures came back
    assert verdict.startswith("data-bound in ")


def test_too_few_workers_asks_for_more_and_a_fast_pipeline_for_nothing(rows):
    # Invariant: one worker spends 15 ms per utterance (~50-150 ms a batch) while the step
    # takes 5 ms: the loop waits at nearly every step, and the verdict asks for more workers.
    slow = sp.build_loader(demo_pipe(rows, augment=burn), num_workers=1, seed=0,
                           telemetry=True)
    train(slow, 0.005)
    snap = slow.telemetry.snapshot()
    assert snap["data_bound_steps"] > 0.5, slow.telemetry.report()
    assert "more worker" in slow.telemetry.verdict()
    # the same data with a step far longer than a batch's preparation: no wait to speak of
    fast = sp.build_loader(demo_pipe(rows), num_workers=1, seed=0, telemetry=True)
    train(fast, 0.25)
    assert fast.telemetry.verdict().endswith("the loop rarely waits: nothing to do"), \
        fast.telemetry.report()
    assert fast.telemetry.snapshot()["first_batch_seconds"] > 0


def test_main_process_telemetry_callback_and_report(rows):
    seen = []
    telemetry = sp.Telemetry(every=2, callback=seen.append)
    loader = sp.build_loader(demo_pipe(rows), seed=0, telemetry=telemetry)
    batches = sum(1 for _ in loader)
    assert loader.telemetry is telemetry
    assert telemetry.steps == batches - 1  # the first batch is timed apart
    assert len(seen) == (batches - 1) // 2 and "wait_share" in seen[0]
    report = telemetry.report()
    assert report.splitlines()[0].startswith("data-bound in ")
    assert "not measured (no DataLoader workers)" in report
    assert by_name(telemetry.stages())["load_audio"]["items"] == 36


def pipes_held(pipe) -> list:
    out, node = [], pipe
    while node is not None:
        held = [(k, v) for k, v in node.__dict__.items() if isinstance(v, IterDataPipe)]
        out.append([(k, id(v), type(v).__name__) for k, v in held])
        node = held[0][1] if held else None
    return out


def test_probes_leave_the_graph_and_the_state_as_they_were(rows):
    # Invariant: the probes are out of the pipeline after a pass, and a state taken with
    # telemetry on resumes a loader without it (the stages keep their paths).
    pipe = demo_pipe(rows)
    children = pipes_held(pipe)
    loader = sp.build_loader(pipe, seed=0, telemetry=True)
    iterator = iter(loader)
    first = [next(iterator)["key"] for _ in range(2)]
    state = loader.state_dict()
    rest = [b["key"] for b in iterator]
    assert pipes_held(pipe) == children  # the same pipes, no probe left in front of one
    other = sp.build_loader(demo_pipe(rows), seed=0)
    other.load_state_dict(state)
    assert [b["key"] for b in other] == rest
    assert first


def test_bad_telemetry_arguments_are_named():
    with pytest.raises(TypeError, match="telemetry must be a bool or a Telemetry, got 'yes'"):
        sp.build_loader(sp.IterableWrapper([1]).shuffle_samples(), telemetry="yes")
    with pytest.raises(ValueError, match="every must be an int >= 0, got -1"):
        sp.Telemetry(every=-1)
    with pytest.raises(TypeError, match="callback must be callable when every > 0"):
        sp.Telemetry(every=5)
    with pytest.raises(ValueError, match=r"data_bound_share must be in \(0, 1\), got 2"):
        sp.Telemetry(data_bound_share=2)


def test_the_waits_split_into_waiting_on_data_and_receiving_ready_batches():
    telemetry = sp.Telemetry()
    telemetry.record_first_batch(2.0)
    for wait, step, ready in [(0.002, 0.098, 3), (0.003, 0.097, 1), (0.05, 0.05, 0),
                              (0.003, 0.097, 2)]:
        telemetry.record_step(wait, step, ready)
    telemetry.record_first_batch(1.0)  # the next pass's first batch: not a step
    snap = telemetry.snapshot()
    assert snap["wait_share"] == pytest.approx(0.058 / 0.4)
    assert snap["starved_share"] == pytest.approx(0.05 / 0.4)  # no batch was ready
    assert snap["receive_share"] == pytest.approx(0.008 / 0.4)  # a ready batch taken
    assert snap["first_batch_seconds"] == 2.0
    assert snap["passes"] == 2 and snap["pass_start_seconds"] == pytest.approx(3.0)
    report = telemetry.report().splitlines()
    assert report[2] == ("  of which 12.5 % with no batch ready (waiting on data) and 2.0 % "
                         "receiving ready batches")
    assert report[3] == ("first batch after 2.00 s; 2 passes started in 3.00 s in all (not in "
                         "the waits above)")


def test_a_loader_ahead_of_the_loop_only_receives(rows):
    # Invariant: one worker prepares the demo corpus's batches far faster than a 150 ms step:
    # after the first of a pass, a batch is always ready, and the loop's waits are receipts.
    loader = sp.build_loader(demo_pipe(rows), num_workers=1, seed=0, telemetry=True,
                             persistent_workers=True)
    assert loader.telemetry.persistent_workers
    train(loader, 0.15, passes=2)
    snap = loader.telemetry.snapshot()
    assert snap["passes"] == 2 and snap["steps"] > 4
    assert snap["starved_share"] < 0.5 * snap["wait_share"], loader.telemetry.report()
    assert snap["receive_share"] + snap["starved_share"] == pytest.approx(snap["wait_share"])


def test_the_verdict_names_slow_epoch_boundaries():
    # Invariant: ten passes of 10 steps of 100 ms, each pass after the first waiting 0.5 s
    # for its first batch (a fresh set of workers filling a bucket buffer): a third of the
    # loop's time, which the steps' waits do not show.
    telemetry = sp.Telemetry()
    telemetry.num_workers = 2
    telemetry.workers = {0: {"0:load_audio": {"items": 10, "cpu": 1.0, "wall": 1.0}}}
    for _ in range(10):
        telemetry.record_first_batch(0.5)
        for _ in range(10):
            telemetry.record_step(0.001, 0.1, 2)
    verdict = telemetry.verdict()
    assert verdict.startswith("data-bound in 0 % of steps; load_audio takes 100 % of the "), \
        verdict
    assert verdict.endswith("; each pass after the first waited 0.50 s for its first batch (31 % "
                            "of the loop's time): try persistent_workers=True or a smaller "
                            "bucket buffer (filled before the first batch)"), verdict
    telemetry.persistent_workers = True  # then only the buffer is left to try
    assert telemetry.verdict().endswith("(31 % of the loop's time): try a smaller bucket buffer "
                                        "(filled before the first batch)")
    one_pass = sp.Telemetry()  # the first pass's start alone is no boundary
    one_pass.workers = telemetry.workers
    one_pass.record_first_batch(5.0)
    one_pass.record_step(0.001, 0.1, 2)
    assert one_pass.verdict().endswith("the loop rarely waits: nothing to do")


def test_counting_the_ready_batches_is_not_timed_as_a_wait(monkeypatch):
    # Invariant: the loop's wait is the time inside next() only; the probe that counts the
    # ready batches before it (here made to take 30 ms) is neither a wait nor a step.
    import speechpipe.loader as loader_module

    def slow_count(iterator):
        time.sleep(0.03)
        return 1

    monkeypatch.setattr(loader_module, "_ready_batches", slow_count)
    rows = [{"key": f"u{i}", "x": i} for i in range(12)]
    loader = sp.build_loader(sp.IterableWrapper(rows).shuffle_samples(seed=0), seed=0,
                             telemetry=True)
    assert len(list(loader)) == 12
    telemetry = loader.telemetry
    assert telemetry.steps == 11
    assert sorted(telemetry.waits)[5] < 0.015, telemetry.waits  # the median; each was >= 30 ms
    assert telemetry.step_seconds < 0.3, telemetry.step_seconds  # nor in the steps (11 x 30 ms)
