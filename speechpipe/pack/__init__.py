"""Packing a corpus into tar shards with an index: ``pack_data`` (the ``pack`` command is
:mod:`speechpipe.cli.pack`).

For corpora larger than the page cache, reading utterances at random from ``.ark`` files
becomes random disk access. Packing writes them, once, into tar shards of a few thousand
utterances (webdataset naming) that a training run reads sequentially, shuffling shard order
and within a buffer (CAT's large-dataset recipe: ``pack_data(f_scps, f_labels, d_out, fmt,
filter_group)``, 2000 utterances per shard, labels stored as text so that the tokenizer can
change without packing again).

- :func:`pack_data`: Kaldi tables (``feats.scp`` or ``wav.scp`` with an optional
  ``segments`` file, several of each, plus ``text`` label files) or JSON-lines manifests, to
  shards ``d_out[/lo_hi]/data-%05d.tar`` and one ``index.jsonl`` per folder
  (:class:`~speechpipe.index.ShardIndex`); returns a :class:`PackReport`.
- :class:`PackOptions`: the settings of a pack, checked, as the plan of a job array records
  them (``pack_data`` and ``plan_pack`` take them as keyword arguments).
- :func:`parse_length_groups`: ``["10:500", "500:800"]`` to :class:`LengthGroup` ranges.
- :func:`plan_pack`, :func:`pack_task`, :func:`merge_pack`: the same pack as a job array
  (``pack --plan-only``, ``--task i/N`` on any machine, ``--merge``): a deterministic plan
  file, tasks writing their shards under temporary names, a merge checking the shards and
  writing the indexes; the bytes are those of :func:`pack_data`, whatever the number of tasks
  or their order. :func:`pack_data` takes ``executor=`` (a process pool, Dask's
  ``distributed.Client``) for the same steps in one call.

One run owns an output folder at a time (:mod:`~speechpipe.pack.lock`: a lock file naming the
holder's pid and host; a second run fails with :class:`~speechpipe.errors.FolderLockedError`).

Each utterance ``<key>`` becomes two members: ``<key>.feats.npy`` (float32 ``(frames, dim)``)
or ``<key>.flac`` / ``<key>.wav`` (audio), and ``<key>.txt`` (the label, UTF-8, unchanged:
tokenization happens when the shards are read); from a manifest, a third, ``<key>.json``,
keeps the line's other fields (speaker, chapter, gender, age, accent, language...), decoded
with :mod:`json` when read. Read them back with
``IterableWrapper(paths).open().read_shards().decode()``, or with webdataset.

The work happens in four steps, so that nothing is written when the inputs are inconsistent:
read the tables and match keys; measure every utterance (feature matrix headers, audio file
headers; no sample is decoded where a header tells the length); assign sorted keys to length
groups and shards; write the shards in parallel, then each folder's index. One module per
job: :mod:`~speechpipe.pack.inputs` (reading the tables, matching keys),
:mod:`~speechpipe.pack.lengths` (measuring, length groups), :mod:`~speechpipe.pack.plan`
(groups, shards, what an earlier run left complete; the plan file), :mod:`~speechpipe.pack.write`
(writing one shard), :mod:`~speechpipe.pack.lock` (who owns the folder),
:mod:`~speechpipe.pack.options`, :mod:`~speechpipe.pack.report` and :mod:`~speechpipe.pack.run`
(:func:`pack_data` and the job-array steps, in order).
"""

from __future__ import annotations

from .inputs import KINDS, MANIFEST_AUDIO_FIELDS, MANIFEST_FIELDS_NOT_KEPT, MANIFEST_TEXT_FIELDS
from .lengths import LENGTH_UNITS, LengthGroup, parse_length_groups
from .options import COMPRESS, ON_MISMATCH, UTTS_PER_SHARD, PackOptions
from .report import PackReport
from .run import merge_pack, pack_data, pack_task, plan_pack
from .write import AUDIO_FORMATS

__all__ = [
    "AUDIO_FORMATS",
    "COMPRESS",
    "KINDS",
    "LENGTH_UNITS",
    "LengthGroup",
    "MANIFEST_AUDIO_FIELDS",
    "MANIFEST_FIELDS_NOT_KEPT",
    "MANIFEST_TEXT_FIELDS",
    "ON_MISMATCH",
    "PackOptions",
    "PackReport",
    "UTTS_PER_SHARD",
    "merge_pack",
    "pack_data",
    "pack_task",
    "parse_length_groups",
    "plan_pack",
]
