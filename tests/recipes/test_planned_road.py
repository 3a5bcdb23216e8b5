"""The recipes' planned road: ``train_pipeline(streams="auto" | V)`` (issue 29).

On the demo corpus (36 real FLAC utterances, prepared into a local manifest): the batches do
not depend on the number of DataLoader workers (speed perturbation, noise and reverberation
on); the plan's budget holds on the perturbed durations; ``on_error="skip"`` keeps a batch a
batch; a state from a pipeline with another budget, seed, streams or speed factors is refused
by name; the streaming road's refusal of another topology names the way out. The default
(``streams="auto"``) plans over the streams the corpus gives and takes the streaming road for
what the planned road cannot take, naming it in ``pipeline_report``; dither in the workers is
drawn per utterance and epoch; the duration filter's drops are counted once. The gloo-group
tests over ranks are in test_planned_road_ddp.py.
"""

from __future__ import annotations

import gzip
import json
import warnings

import pytest

import speechpipe as sp
from speechpipe.demo import DEMO_CORPUS
from speechpipe.errors import DataError, ResumeError
from speechpipe.pipes._core import graph_nodes
from speechpipe.recipes import semi_supervised_pipeline
from speechpipe.recipes._planned import RowPlanner
from speechpipe.recipes.librispeech import librispeech_train, prepare_librispeech
from speechpipe.testing import batch_digest

BUDGET = 20.0
SPEEDS = (0.9, 1.0, 1.1)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    out = prepare_librispeech(DEMO_CORPUS, tmp_path_factory.mktemp("planned"),
                              parts=["dev-clean"], progress=False)
    return str(out["dev-clean"])


def rows_of(path: str) -> list[dict]:
    with gzip.open(path, "rt") as f:
        return [json.loads(line) for line in f]


def write_rows(path, rows: list[dict]) -> str:
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return str(path)


def digest(batch: dict) -> str:
    return batch_digest(batch, 16)


def pipe(manifest: str, **options):
    settings = dict(budget=BUDGET, streams=4, speed_perturb=SPEEDS, seed=3)
    settings.update(options)
    return sp.train_pipeline(manifest, **settings)


def passes(loader, epochs: int = 2) -> list[list[str]]:
    return [[digest(b) for b in loader] for _ in range(epochs)]


@pytest.mark.timeout(300)
def test_workers_do_not_change_the_batches_with_speed_noise_and_reverb(manifest):
    options = dict(noise=[manifest], noise_p=0.5, snr_db=(5.0, 15.0), rir=[manifest], rir_p=0.3)
    runs = [passes(sp.build_loader(pipe(manifest, **options), num_workers=k, seed=0))
            for k in (0, 2)]
    assert runs[0] == runs[1]
    assert runs[0][0] != runs[0][1] and len(runs[0][0]) > 8
    # each utterance once per epoch, with its draws
    batches = list(pipe(manifest, **options))
    keys = [k for b in batches for k in b["key"]]
    assert sorted(keys) == sorted(r["key"] for r in rows_of(manifest))
    kinds = [a["kind"] for b in batches for aug in b["augment"] for a in aug]
    assert {"noise", "reverb"} <= set(kinds)


def test_the_budget_holds_on_the_perturbed_durations(manifest):
    batches = list(pipe(manifest, features=None))
    speeds = set()
    for b in batches:
        seconds = b["audio_len"].double() / b["sample_rate"].double()
        # n x longest, on the audio after perturbation (change_speed rounds up: 1 sample)
        assert len(seconds) * float(seconds.max()) <= BUDGET + len(seconds) / 16000
        speeds.update(b["speed"].tolist())
    assert speeds == set(SPEEDS)
    # planned on the durations before perturbation, some batch would be over the budget
    plain = {r["key"]: r["duration"] for r in rows_of(manifest)}
    slow = [b for b in batches if any(s < 1 for s in b["speed"].tolist())]
    assert any(len(b["key"]) * max(plain[k] for k in b["key"]) < BUDGET * 0.9 for b in slow)


def test_the_speed_factor_is_drawn_per_row_and_epoch(manifest):
    first = pipe(manifest, features=None)
    sp.set_epoch(first, 0)
    epoch0 = {k: s for b in first for k, s in zip(b["key"], b["speed"].tolist())}
    again = pipe(manifest, features=None)
    sp.set_epoch(again, 0)
    assert {k: s for b in again for k, s in zip(b["key"], b["speed"].tolist())} == epoch0
    sp.set_epoch(again, 1)
    assert {k: s for b in again for k, s in zip(b["key"], b["speed"].tolist())} != epoch0


def test_skip_keeps_a_batch_a_batch_and_counts_the_loss(manifest, tmp_path):
    rows = rows_of(manifest)
    broken = tmp_path / "broken.flac"
    with open(rows[5]["audio_path"], "rb") as f:
        broken.write_bytes(f.read()[:300])  # a truncated FLAC
    rows[5] = {**rows[5], "audio_path": str(broken)}
    path = write_rows(tmp_path / "m.jsonl", rows)
    good = [list(b["key"]) for b in pipe(write_rows(tmp_path / "g.jsonl", rows_of(manifest)),
                                         features=None)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        skipping = pipe(path, features=None, on_error="skip")
        got = [list(b["key"]) for b in skipping]
    assert len(got) == len(good)  # no batch lost: every rank keeps its steps
    assert got == [[k for k in b if k != rows[5]["key"]] for b in good]
    assert "1 item" in sp.pipeline_report(skipping) and rows[5]["key"] in sp.pipeline_report(
        skipping)


def test_a_batch_that_loses_every_sample_is_named(manifest, tmp_path):
    rows = [{**r, "audio_path": str(tmp_path / f"missing{i}.flac")}
            for i, r in enumerate(rows_of(manifest))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(DataError, match="every utterance of a planned batch"):
            list(pipe(write_rows(tmp_path / "m.jsonl", rows), features=None, on_error="skip"))


@pytest.mark.parametrize("change, field", [
    ({"budget": 25.0}, "budget"), ({"seed": 4}, "seed"), ({"streams": 8}, "streams"),
    ({"speed_perturb": (0.9, 1.1)}, "speed_factors")])
def test_a_state_from_another_planned_pipeline_is_refused_by_name(manifest, change, field):
    loader = sp.build_loader(pipe(manifest, features=None), seed=0)
    for step, _ in enumerate(loader):
        if step == 2:
            state = loader.state_dict()
            break
    other = sp.build_loader(pipe(manifest, features=None, **change), seed=0)
    with pytest.raises(ResumeError, match=field) as caught:
        other.load_state_dict(state)
    assert len(caught.value.differences) == 1


def test_a_state_resumes_with_other_workers_in_one_process(manifest):
    unbroken = passes(sp.build_loader(pipe(manifest, features=None), seed=0))
    loader = sp.build_loader(pipe(manifest, features=None), num_workers=2, seed=0)
    for step, _ in enumerate(loader):
        if step == 4:
            state = loader.state_dict()
            break
    assert state["batches"] == 5
    resumed = sp.build_loader(pipe(manifest, features=None), seed=0)
    resumed.load_state_dict(state)
    assert passes(resumed) == [unbroken[0][5:], unbroken[1]]


def test_streams_need_local_manifests_and_say_what_to_do(manifest):
    with pytest.raises(ValueError, match="sample lists: give streams=None"):
        sp.train_pipeline([rows_of(manifest)], streams=4)
    with pytest.raises(ValueError, match="a pipe of rows: give streams=None"):
        sp.train_pipeline(sp.IterableWrapper(rows_of(manifest)), streams=4)
    with pytest.raises(ValueError, match="shard=False"):
        sp.train_pipeline(manifest, streams=4, shard=False)
    with pytest.raises(ValueError, match="streams"):
        sp.train_pipeline(manifest, streams=0)
    with pytest.raises(ValueError, match="'auto', None or an int"):
        sp.train_pipeline(manifest, streams="many")
    with pytest.raises(ValueError, match="durations.*PaddedArea"):
        sp.train_pipeline(manifest, streams=4, budget=sp.PaddedArea(3000))
    with pytest.raises(ValueError, match="semi_supervised_pipeline"):
        semi_supervised_pipeline(manifest, manifest, streams=4)


def road_of(pipe) -> str:
    return sp.pipeline_report(pipe).splitlines()[0]


def test_the_default_plans_over_the_streams_the_corpus_gives(manifest):
    default = sp.train_pipeline(manifest, budget=BUDGET, features=None, seed=3)
    assert road_of(default).startswith("train_pipeline road: planned over ")
    assert "streams='auto': the planner's default for these rows" in road_of(default)
    [plan] = [n for n in graph_nodes(default) if isinstance(n, RowPlanner)]
    runs = [passes(sp.build_loader(default, num_workers=k, seed=0)) for k in (0, 2)]
    assert runs[0] == runs[1]
    given = sp.train_pipeline(manifest, budget=BUDGET, features=None, seed=3,
                              streams=plan.num_streams)
    assert passes(sp.build_loader(given, seed=0)) == runs[0]
    assert f"(streams={plan.num_streams}: given)" in road_of(given)
    streaming = sp.train_pipeline(manifest, budget=BUDGET, features=None, seed=3, streams=None)
    assert road_of(streaming).startswith("train_pipeline road: streaming (streams=None)")
    assert passes(sp.build_loader(streaming, seed=0)) != runs[0]


@pytest.mark.parametrize("inputs, options, why", [
    ("rows", {}, "sample lists"),
    ("pipe", {}, "a pipe of rows"),
    ("path", {"shard": False}, "shard=False"),
    ("path", {"budget": sp.PaddedArea(3000)}, "a budget not in seconds"),
    ("path", {"budget": sp.SampleCount(4)}, "a budget not in seconds"),
])
def test_auto_takes_the_streaming_road_for_what_it_cannot_plan_and_says_so(manifest, inputs,
                                                                          options, why):
    given = {"rows": [rows_of(manifest)], "pipe": sp.IterableWrapper(rows_of(manifest)),
             "path": manifest}[inputs]
    settings = {"budget": BUDGET, "features": None, **options}
    auto = sp.train_pipeline(given, **settings)
    assert road_of(auto) == (
        f"train_pipeline road: streaming (streams='auto': the planned road cannot take {why}); "
        "batches depend on the number of ranks and workers, a checkpoint resumes on the same "
        "topology")
    assert not any(isinstance(n, RowPlanner) for n in graph_nodes(auto))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PaddedArea(3000): frames, over budget as audio
        keys = sorted(k for b in auto for k in b["key"])
    assert keys == sorted(r["key"] for r in rows_of(manifest))
    with pytest.raises(ValueError, match="streams=None"):  # a number of streams refuses them
        sp.train_pipeline(given, streams=4, **settings)


def test_object_storage_manifests_take_the_streaming_road_by_default():
    url = "s3://bucket/m.jsonl"  # nothing is read to choose the road
    assert "the planned road cannot take object-storage manifests" in road_of(
        sp.train_pipeline(url, budget=BUDGET, features=None))
    with pytest.raises(ValueError, match="object-storage manifests: give streams=None"):
        sp.train_pipeline(url, budget=BUDGET, features=None, streams=4)


def test_semi_supervised_takes_the_streaming_road_by_default(manifest):
    both = semi_supervised_pipeline(manifest, manifest, budget=BUDGET, features=None)
    lines = sp.pipeline_report(both).splitlines()
    assert [line for line in lines if "road" in line] == [
        "train_pipeline road: streaming (streams=None); batches depend on the number of ranks "
        "and workers, a checkpoint resumes on the same topology"] * 2
    steps = list(both)
    assert sorted(k for s in steps for k in s["sup"]["key"]) == sorted(
        r["key"] for r in rows_of(manifest))
    assert "streams=None" in road_of(semi_supervised_pipeline(manifest, manifest,
                                                              streams="auto", features=None))


def test_dither_is_drawn_per_utterance_and_epoch_whatever_the_workers(manifest):
    dithered = dict(feature_options={"dither": 1.0}, speed_perturb=None)
    runs = [passes(sp.build_loader(pipe(manifest, **dithered), num_workers=k, seed=0))
            for k in (0, 2)]
    assert runs[0] == runs[1]
    plain = passes(sp.build_loader(pipe(manifest, speed_perturb=None), seed=0))
    assert runs[0][0] != plain[0]  # the dither is there ...
    first = pipe(manifest, **dithered)
    sp.set_epoch(first, 0)
    feats0 = {k: f[:n] for b in first for k, f, n in zip(b["key"], b["feats"], b["feats_len"])}
    sp.set_epoch(first, 1)
    feats1 = {k: f[:n] for b in first for k, f, n in zip(b["key"], b["feats"], b["feats_len"])}
    assert all(not (feats0[k] == feats1[k]).all() for k in feats0)  # ... new at each epoch
    again = pipe(manifest, **dithered)
    sp.set_epoch(again, 0)
    for b in again:  # and each utterance's own: the same in any batch, in any process
        for k, f, n in zip(b["key"], b["feats"], b["feats_len"]):
            assert (f[:n] == feats0[k]).all()


def test_drops_before_the_plan_are_counted_once_whatever_the_workers(manifest):
    short = sum(r["duration"] < 3.0 for r in rows_of(manifest))
    assert short > 0
    for workers in (0, 2):
        pipeline = pipe(manifest, features=None, min_duration=3.0)
        loader = sp.build_loader(pipeline, num_workers=workers, seed=0)
        for _ in range(2):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for _ in loader:
                    pass
            assert f"filter_by_duration skipped {short} item(s)" in sp.pipeline_report(
                pipeline), workers


def test_recipe_builders_take_streams(manifest):
    batches = list(librispeech_train([manifest], streams=2, features=None, budget=BUDGET))
    assert sorted(k for b in batches for k in b["key"]) == sorted(
        r["key"] for r in rows_of(manifest) if 1.0 <= r["duration"] <= 20.0)


def test_the_streaming_roads_refusal_of_another_topology_names_the_way_out(manifest):
    streaming = dict(budget=BUDGET, features=None, streams=None)
    loader = sp.build_loader(sp.train_pipeline(manifest, **streaming),
                             num_workers=2, seed=0, snapshot_every=1)
    for step, _ in enumerate(loader):
        if step == 2:
            state = loader.state_dict()
            break
    other = sp.build_loader(sp.train_pipeline(manifest, **streaming), seed=0)
    with pytest.raises(ResumeError, match="num_workers") as caught:
        other.load_state_dict(state)
    assert "streams=8" in str(caught.value) and "plan_batches" in str(caught.value)
    assert "docs/resume.md" in str(caught.value)


def test_a_state_of_the_streaming_road_is_refused_by_the_planned_one(manifest):
    loader = sp.build_loader(sp.train_pipeline(manifest, budget=BUDGET, features=None,
                                               streams=None), seed=0)
    for step, _ in enumerate(loader):
        if step == 1:
            state = loader.state_dict()
            break
    planned = sp.build_loader(pipe(manifest, features=None, speed_perturb=None), seed=0)
    with pytest.raises(ResumeError, match="RowPlanner") as caught:
        planned.load_state_dict(state)
    assert any(d[0] == "pipeline" for d in caught.value.differences)


def test_telemetry_times_the_planned_stages_without_changing_the_batches(manifest):
    plain = passes(sp.build_loader(pipe(manifest, features=None), seed=0), 1)
    timed = sp.build_loader(pipe(manifest, features=None), seed=0, telemetry=True)
    assert passes(timed, 1) == plain
    report = timed.telemetry.report()
    assert "load_audio" in report and "BatchFrontEnd" in report


def test_the_stages_count_the_whole_pass_and_warn_once(manifest, tmp_path):
    rows = rows_of(manifest)
    broken = tmp_path / "broken.flac"
    with open(rows[5]["audio_path"], "rb") as f:
        broken.write_bytes(f.read()[:300])  # a truncated FLAC
    rows[5] = {**rows[5], "audio_path": str(broken)}
    path = write_rows(tmp_path / "m.jsonl", rows)
    tok = sp.CharTokenizer.build([r["text"] for r in rows])
    for workers in (0, 2):
        pipeline = pipe(path, features=None, on_error="skip", tokenizer=tok)
        loader = sp.build_loader(pipeline, num_workers=workers, seed=0)
        for _ in range(2):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                for _ in loader:
                    pass
            skipped = [w for w in caught if issubclass(w.category, sp.SkippedInputWarning)]
            assert len(skipped) == 1 and rows[5]["key"] in str(skipped[0].message), workers
            report = sp.pipeline_report(pipeline)  # the pass's counts, not its last batch's
            assert f"tokenize: {len(rows) - 1} sample(s)" in report, (workers, report)
            assert "load_audio skipped 1 item(s)" in report, (workers, report)
