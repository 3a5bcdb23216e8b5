"""speechpipe's functional names: registered on import, never shadowing torch or torchdata.

Invariant: importing speechpipe in a fresh interpreter adds names to torch's DataPipe registry
and redefines none of them, and takes none of the names torchdata <= 0.9 registered (users may
still have it installed, and a second registration is an error in torch).
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
import subprocess
import sys

import pytest

import speechpipe
import speechpipe.pipes

# Every name torchdata 0.8 and 0.9 register with @functional_datapipe (read from their wheels).
TORCHDATA_NAMES = frozenset("""
add_index async_map_batches bucketbatch check_hash cycle dataframe decompress drop end_caching
enumerate extract flatmap flatten fullsync header in_batch_shuffle in_memory_cache
lines_to_paragraphs list_files_by_ais list_files_by_fsspec list_files_by_iopath list_files_by_s3
load_files_by_ais load_files_by_s3 load_from_bz2 load_from_rar load_from_tar load_from_tfrecord
load_from_xz load_from_zip load_parquet_as_df map_batches max_token_bucketize memory_cell
mux_longest on_disk_cache open_files_by_fsspec open_files_by_iopath parse_csv parse_csv_as_dict
parse_json_files pin_memory prefetch random_split read_from_gdrive read_from_http
read_from_remote readlines repeat round_robin_demux rows2columnar save_by_fsspec save_by_iopath
save_to_disk set_length shard_expand sharding_round_robin_dispatch shuffled_flatmap slice
threadpool_map to_iter_datapipe to_map_datapipe unzip webdataset zip_longest zip_with_iter
zip_with_map
""".split())

_PROBE = """
import json
from torch.utils.data import IterDataPipe, MapDataPipe
before = {"iter": {k: repr(v) for k, v in IterDataPipe.functions.items()},
          "map": {k: repr(v) for k, v in MapDataPipe.functions.items()}}
import speechpipe
after = {"iter": {k: repr(v) for k, v in IterDataPipe.functions.items()},
         "map": {k: repr(v) for k, v in MapDataPipe.functions.items()}}
print(json.dumps({"before": before, "after": after}))
"""


def _registry_in_fresh_interpreter():
    out = subprocess.run([sys.executable, "-c", _PROBE], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_registers_names_and_redefines_none_of_torchs():
    reg = _registry_in_fresh_interpreter()
    for kind in ("iter", "map"):
        before, after = reg["before"][kind], reg["after"][kind]
        for name, fn in before.items():
            assert after[name] == fn, f"speechpipe redefined torch's {kind} name {name!r}"
    added = set(reg["after"]["iter"]) - set(reg["before"]["iter"])
    for expected in ("open", "list_shards", "parse_scp", "join_by_key"):
        assert expected in added
    assert not added & TORCHDATA_NAMES, f"names taken by torchdata: {added & TORCHDATA_NAMES}"


def test_torch_core_verbs_are_reused_not_rewritten():
    reg = _registry_in_fresh_interpreter()
    torch_verbs = {"list_files", "open_files", "shuffle", "batch", "map", "filter", "collate",
                   "zip", "mux", "sharding_filter"}
    assert torch_verbs <= set(reg["before"]["iter"])


def _pipe_modules():
    for info in pkgutil.walk_packages(speechpipe.pipes.__path__, "speechpipe.pipes."):
        yield importlib.import_module(info.name)


def _our_pipe_classes():
    from speechpipe.pipes._core import IterDataPipe, MapDataPipe

    for module in _pipe_modules():
        for obj in vars(module).values():
            if (isinstance(obj, type) and issubclass(obj, (IterDataPipe, MapDataPipe))
                    and obj.__module__ == module.__name__):
                yield obj


def test_pipe_classes_and_functional_names_follow_the_naming_rule():
    from speechpipe.pipes._core import IterDataPipe, MapDataPipe

    classes = list(_our_pipe_classes())
    assert classes
    # torch stores each registration as functools.partial(class_function, cls, ...).
    registered = {fn.args[0]: name
                  for table in (IterDataPipe.functions, MapDataPipe.functions)
                  for name, fn in table.items() if getattr(fn, "args", None)}
    ours = [name for cls, name in registered.items() if cls.__module__.startswith("speechpipe.")]
    classes = [cls for cls in classes if cls is not speechpipe.Buffering]  # a base class
    for cls in classes:
        if issubclass(cls, IterDataPipe):
            assert cls in registered, f"{cls.__name__} has no functional name"
    for cls in classes:
        assert re.fullmatch(r"[A-Z]\w*er(Iter|Map)DataPipe", cls.__name__), cls.__name__
        alias = cls.__name__.replace("IterDataPipe", "").replace("MapDataPipe", "")
        module = sys.modules[cls.__module__]
        assert getattr(module, alias, None) is cls, f"{cls.__name__} lacks the alias {alias}"
        assert cls.__doc__ and "functional name: ``" in cls.__doc__.splitlines()[0] + cls.__doc__
        assert ">>>" in cls.__doc__, f"{cls.__name__} has no executed example"
    for name in ours:
        assert re.fullmatch(r"[a-z]+(_[a-z]+)*", name), name


def test_every_module_all_is_sorted_and_complete():
    top = [f"speechpipe.{m.name}" for m in pkgutil.iter_modules(speechpipe.__path__)
           if not m.ispkg and m.name != "__main__"]
    recipes = [f"speechpipe.recipes.{m.name}" for m in pkgutil.iter_modules(
        importlib.import_module("speechpipe.recipes").__path__)]
    for module in list(_pipe_modules()) + [importlib.import_module(m) for m in top + recipes]:
        names = getattr(module, "__all__", None)
        assert names is not None, f"{module.__name__} has no __all__"
        assert list(names) == sorted(names), f"{module.__name__}.__all__ is not sorted"
        for name in names:
            assert hasattr(module, name), f"{module.__name__}.__all__ lists missing {name}"


def test_torch_datapipe_machinery_is_imported_in_one_module_only():
    import pathlib

    root = pathlib.Path(speechpipe.__file__).parent
    offenders = [str(p.relative_to(root)) for p in root.rglob("*.py")
                 if p.name != "_base.py" and re.search(
                     r"torch\.utils\.data\.datapipes|from torch\.utils\.data import .*DataPipe",
                     p.read_text())]
    assert offenders == []


_CLASS_PROBE = """
import json
from torch.utils.data import IterDataPipe, MapDataPipe

def state(cls):
    return {k: [id(v), repr(v)] for k, v in vars(cls).items() if k != "functions"}

def functions(cls):
    return {k: [id(v), v.args[0].__module__] for k, v in cls.functions.items()}

before = {c.__name__: [state(c), functions(c)] for c in (IterDataPipe, MapDataPipe)}
import speechpipe
after = {c.__name__: [state(c), functions(c)] for c in (IterDataPipe, MapDataPipe)}
print(json.dumps({"before": before, "after": after}))
"""


def test_import_leaves_torchs_datapipe_classes_as_they_were():
    """Importing speechpipe (in a fresh interpreter) changes nothing in the class dicts of
    torch's ``IterDataPipe`` and ``MapDataPipe`` but the functional names it registers through
    torch's own registry (their ``functions``): no attribute is added or replaced, so other
    libraries' DataPipes behave as without speechpipe."""
    out = subprocess.run([sys.executable, "-c", _CLASS_PROBE], check=True, capture_output=True,
                         text=True)
    probe = json.loads(out.stdout.strip().splitlines()[-1])
    for kind in ("IterDataPipe", "MapDataPipe"):
        (state_before, functions_before) = probe["before"][kind]
        (state_after, functions_after) = probe["after"][kind]
        assert state_after == state_before, kind
        added = {k: v for k, v in functions_after.items() if k not in functions_before}
        assert {k: functions_after[k] for k in functions_before} == functions_before, kind
        assert added and all(module.startswith("speechpipe.") for _, module in added.values())


def test_child_pipes_of_fork_and_demux_still_enforce_their_rules():
    """speechpipe's own stages have ``_is_child_datapipe = False`` (set by _base's
    plain_iterator: a per-item cost of torch's hook); torch's IterDataPipe is left without it,
    and fork's and demux's children keep True, so torch still checks them."""
    from speechpipe.pipes._core import IterableWrapper, IterDataPipe

    assert "_is_child_datapipe" not in vars(IterDataPipe)
    classes = _speechpipe_pipe_classes()
    assert classes and all(c._is_child_datapipe is False for c in classes)
    a, b = IterableWrapper(range(6)).fork(2)
    assert a._is_child_datapipe is True
    assert list(zip(a, b)) == [(i, i) for i in range(6)]
    even, odd = IterableWrapper(range(6)).demux(2, _parity)
    assert list(even) == [0, 2, 4] and list(odd) == [1, 3, 5]
    it = iter(a)
    next(it)
    with pytest.warns(UserWarning, match="not exhausted"):
        iter(a)  # a second iterator of a child resets the fork: the first one is now invalid
    with pytest.raises(RuntimeError, match="invalidated"):
        next(it)


def _parity(x: int) -> int:
    return x % 2


def _speechpipe_pipe_classes() -> list[type]:
    from speechpipe.pipes._core import IterDataPipe

    classes = []
    for info in pkgutil.walk_packages(speechpipe.__path__, "speechpipe."):
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if (isinstance(value, type) and issubclass(value, IterDataPipe)
                    and value.__module__ == module.__name__ and "__iter__" in vars(value)):
                classes.append(value)
    return sorted(set(classes), key=lambda c: c.__qualname__)


def test_every_speechpipe_stage_iterates_outside_torchs_per_item_hook():
    """Each of our IterDataPipe classes that defines ``__iter__`` has it made plain (registered
    through _base's functional_datapipe or decorated with plain_iterator): iterating yields
    from our own generator, not from torch's wrapper generator."""
    classes = _speechpipe_pipe_classes()
    assert len(classes) >= 25
    hooked = [c.__qualname__ for c in classes
              if vars(c)["__iter__"].__code__.co_name == "wrap_generator"]
    assert hooked == []
    from speechpipe.pipes._core import IterableWrapper

    rows = [{"key": "a", "text": "x"}]
    it = iter(IterableWrapper(rows).normalize_text())
    assert it.gi_code.co_name == "__iter__"  # our generator itself, no wrapper around it
    assert next(it)["text"] == "x"


def test_a_plain_stage_still_appears_in_torchs_profiler():
    """With torch's profiler on, a pass goes through torch's hook, which records a
    ``record_function`` entry per stage; iteration gives the same items."""
    import torch
    from speechpipe.pipes._core import IterableWrapper

    rows = [{"key": f"u{i}", "text": "ab"} for i in range(3)]
    pipe = IterableWrapper(rows).normalize_text()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out = list(pipe)
    assert [s["key"] for s in out] == ["u0", "u1", "u2"]
    names = {event.name for event in prof.events()}
    assert any("TranscriptNormalizer" in name for name in names), sorted(names)[:20]
    assert [s["key"] for s in pipe] == ["u0", "u1", "u2"]  # and plain again without it


# ------------------------------------------------------------------------------ public face


# Issue 17: ``import speechpipe as sp`` reaches every name a pipeline needs. The list is
# pinned: a name added or removed is a decision, made here.
PUBLIC = [
    "AudioFormatError",
    "BatchConstraint",
    "BatchStats",
    "BatchView",
    "BudgetWarning",
    "BufferStats",
    "Buffering",
    "Calibration",
    "ChannelMismatchError",
    "CharTokenizer",
    "CmvnStats",
    "DEMO_CORPUS",
    "DataError",
    "DecodeCollate",
    "Diagnostics",
    "DistributedStepError",
    "EpochProgress",
    "EpochWarning",
    "EqualSteps",
    "FbankOptions",
    "FolderLockedError",
    "FrontEnd",
    "IndexLength",
    "IterableWrapper",
    "LengthUnitError",
    "Loader",
    "LogMelOptions",
    "MfccOptions",
    "MissingDataError",
    "OutputError",
    "PackReport",
    "PadCollate",
    "PaddedArea",
    "PipeDataset",
    "PipelineNode",
    "PlanMismatchWarning",
    "Quadratic",
    "RemoteOptions",
    "ResumeError",
    "ResumeWarning",
    "SampleCount",
    "SampleRateError",
    "SentencePieceTokenizer",
    "SequenceWrapper",
    "ShardEntry",
    "ShardIndex",
    "ShardReadOptions",
    "ShardSplit",
    "ShardWriter",
    "SkippedInputWarning",
    "SpeechpipeError",
    "StepPlanner",
    "StepStats",
    "StreamPlan",
    "SumOfLengths",
    "Telemetry",
    "TextNormalizer",
    "TwoDimensional",
    "UnevenSplitWarning",
    "UnevenStepsWarning",
    "UnsafeInputError",
    "UnsupportedCodecError",
    "WordTokenizer",
    "build_loader",
    "build_tokenizer",
    "calibrate_budget",
    "compute_cmvn_stats",
    "compute_lengths",
    "corpus_stats",
    "encode_audio",
    "eval_pipeline",
    "fbank",
    "get_recipe",
    "kaldi_arks",
    "load_tokenizer",
    "log_mel",
    "manifest_path",
    "manifest_samples",
    "merge_cmvn_stats",
    "merge_pack",
    "mfcc",
    "pack_data",
    "pack_task",
    "pipeline_report",
    "plan_pack",
    "read_data_len",
    "read_hf_dataset",
    "read_lhotse",
    "read_lhotse_shar",
    "recipes",
    "redact",
    "select_keys",
    "set_epoch",
    "shard_assignment",
    "start",
    "train_pipeline",
    "write_lhotse",
    "write_manifest_table",
]


def test_one_import_reaches_the_public_names():
    assert speechpipe.__all__ == PUBLIC == sorted(PUBLIC)
    for name in PUBLIC:
        assert getattr(speechpipe, name) is not None
    for corpus in speechpipe.recipes.RECIPES:  # sp.recipes.<corpus>, no import of its own
        assert hasattr(getattr(speechpipe.recipes, corpus), "PARTS")


def test_no_readme_line_or_docstring_imports_a_private_module():
    import pathlib

    private = re.compile(r"(?:from|import)\s+speechpipe(?:\.\w+)*\._\w+")
    root = pathlib.Path(speechpipe.__file__).parent
    readme = (root.parent / "README.md").read_text()
    assert not private.search(readme)
    offenders = []
    for path in root.rglob("*.py"):
        for line in path.read_text().splitlines():
            if line.lstrip().startswith(">>>") and private.search(line):
                offenders.append(f"{path.name}: {line.strip()}")
    assert offenders == []
