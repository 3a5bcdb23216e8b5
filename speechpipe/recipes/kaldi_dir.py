"""A generic Kaldi data directory: manifests from its tables, or samples streamed from them.

A Kaldi data directory (``data/train``) is a set of ``<key> <value>`` tables, sorted by key::

    wav.scp     <recording-id> <audio path>        (or an ark reference, or a 'cmd |')
    segments    <utt-id> <recording-id> <start-sec> <end-sec>   (optional: utterances are
                segments of the recordings; without it each recording is an utterance)
    text        <utt-id> <transcript>               (optional: unlabelled data has none)
    utt2spk     <utt-id> <speaker-id>               spk2utt  <speaker-id> <utt-id> ...
    utt2dur     <utt-id> <seconds>                  feats.scp <utt-id> <ark-path>:<offset>

Relative paths in ``wav.scp`` and ``feats.scp`` are relative to the recipe folder Kaldi runs
from (the parent of ``data/``), so both functions take ``root`` (default: the current folder).

- :func:`prepare_kaldi_dir`: one manifest per data directory,
  ``kaldi_dir_samples_<dir name>.jsonl.gz``: ``key``, ``audio_path``, ``offset`` (segments),
  ``duration``, ``sample_rate``, ``recording`` (segments), ``text``, ``speaker``, and
  ``feats_path``/``num_frames`` when ``feats.scp`` is there -- or, for a directory holding
  only features, ``feats_path``, ``num_frames`` and ``duration`` (``utt2dur``, else frames ×
  10 ms). Train on it with :func:`kaldi_dir_train` (``input="feats"`` for feature-only data).
- :func:`kaldi_dir_samples`: no manifest: a pipe reading the tables as they are (segments
  cut from their recordings, ``cmd |`` values with ``allow_commands``), joined by key with
  ``text`` and ``utt2spk`` (``join_by_key``).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any, Iterable

from ..errors import DataError, MissingDataError, locate
from ..pipes._core import IterableWrapper, IterDataPipe
from ..pipes.kaldi import Segment, parse_segment
from ..pipes.kaldi import read_scp_table, ScpEntry
from ..pipes.kaldi import parse_ark_ref, read_matrix, read_wav_value
from ..sample import DURATION, KEY, SOURCE, SPEAKER, TEXT
from ._pipelines import eval_pipeline, train_pipeline
from ._prepare import (
    AUDIO_PATH,
    FEATS_PATH,
    OFFSET,
    VERIFYING,
    as_names,
    collected_faults,
    check_prepare_args,
    files_under,
    check_pairs,
    measure_audio,
    prepare_parts,
    resolve_manifests,
)

__all__ = [
    "CORPUS",
    "FRAME_SHIFT",
    "MAX_OVERSHOOT",
    "NO_DOWNLOAD",
    "PARTS",
    "kaldi_dir_eval",
    "kaldi_dir_samples",
    "kaldi_dir_train",
    "prepare_kaldi_dir",
]

CORPUS = "kaldi_dir"
#: No fixed part names: the parts are the data directories found (``train``, ``dev`` ...).
PARTS: tuple[str, ...] = ()
#: Why ``speechpipe download kaldi_dir`` does not exist.
NO_DOWNLOAD = "a Kaldi data directory is made by a Kaldi recipe, not downloaded"
#: Seconds per feature frame, for the duration of feature-only utterances without utt2dur.
FRAME_SHIFT = 0.01
#: Seconds a segment may end past its recording and be truncated (Kaldi's extract-segments).
MAX_OVERSHOOT = 0.5



def _is_data_dir(path: Path) -> bool:
    return (path / "wav.scp").is_file() or (path / "feats.scp").is_file()


def _data_dirs(root: Path, parts: str | Iterable[str]) -> dict[str, Path]:
    if not root.is_dir():
        raise MissingDataError("Kaldi data folder not found", source=str(root))
    own_name = root.resolve().name  # "." has no name of its own (issue 18)
    if parts == "auto":
        if _is_data_dir(root):
            return {own_name: root}
        found = {d.name: d for d in sorted(root.iterdir()) if d.is_dir() and _is_data_dir(d)}
        if not found:
            raise MissingDataError(
                "no Kaldi data directory here: neither this folder nor its subfolders hold "
                "wav.scp or feats.scp", source=str(root))
        return found
    out = {}
    for name in as_names(parts, "parts"):
        path = root if (name == own_name and _is_data_dir(root)) else root / name
        if not path.is_dir():
            raise MissingDataError("Kaldi data directory not found", source=str(path))
        if not _is_data_dir(path):
            raise MissingDataError("not a Kaldi data directory: it has neither wav.scp nor "
                                   "feats.scp", source=str(path))
        out[name] = path
    return out


# long: a 39-line docstring (the recipe's arguments); the body is 48 lines
def prepare_kaldi_dir(
    corpus_dir: str | os.PathLike,
    output_dir: str | os.PathLike | None = None,
    parts: str | Iterable[str] = "auto",
    num_jobs: int = 1,
    *,
    root: str | os.PathLike | None = None,
    on_mismatch: str = "error",
    force: bool = False,
    progress: bool = True,
    allow_commands: bool = False,
    **checks: Any,
) -> dict[str, Any]:
    """Write ``kaldi_dir_samples_<name>.jsonl.gz`` for Kaldi data directories.

    ``corpus_dir`` is a data directory (``data/train``: the part is ``train``) or a folder of
    them (``data``: with ``parts="auto"`` every subfolder holding ``wav.scp`` or ``feats.scp``).
    Utterances are the ``segments`` entries, else the ``wav.scp`` recordings, else the
    ``feats.scp`` entries; one manifest line each, sorted by key (see the module docstring
    for the fields). Durations come from the audio headers (``soundfile.info``) and the
    segment times; a segment ending up to :data:`MAX_OVERSHOOT` seconds past its recording is
    truncated, as Kaldi does.

    Args:
        corpus_dir: a data directory or a folder of data directories.
        output_dir: manifest folder; ``None`` returns the sample lists.
        parts: ``"auto"``, or data directory names.
        num_jobs: threads reading audio headers.
        root: folder relative table paths start from (default: the current folder, Kaldi's).
        on_mismatch: utterances without a ``text`` line and ``text`` lines without
            utterance: ``"error"`` (raise, with counts and examples) or ``"skip"`` (leave them
            out, counted in a warning). A directory without ``text`` is unlabelled: no
            ``text`` field, nothing reported.
        force: rebuild manifests that exist.
        progress: tqdm progress bars.
        allow_commands: run the ``cmd |`` values of ``wav.scp`` (what Kaldi's own recipes
            write: ``flac -c -d -s x.flac |``, ``sox x.wav -t wav - |``) with the shell, once
            each, and write their audio to ``<output_dir>/kaldi_dir_audio_<name>/<id>.flac``
            (24-bit FLAC: lossless for 16- and 24-bit sources), which the manifest names.
            Opt-in: a table's commands run with your rights. Needs ``output_dir``.
        **checks: ``sample_rate`` (16000), ``verify`` (False), ``on_error`` ("raise"),
            ``empty_text`` ("error"): see :func:`~speechpipe.recipes.prepare_parts`.

    Raises:
        MissingDataError: the folder, a data directory or an audio / ark file is absent.
        DataError: a malformed or duplicate table line, a segment of an unknown recording or
            past its end, a ``wav.scp`` value that is not an audio file (an ark: use
            :func:`kaldi_dir_samples` or ``speechpipe pack``; a command without
            ``allow_commands``, or one that fails), an utterance missing from
            ``utt2spk``, ``spk2utt`` disagreeing with ``utt2spk``, ``feats.scp`` keys that are
            not the utterances, a mismatch under ``"error"``.
    """
    check_prepare_args(on_mismatch, num_jobs)
    dirs = _data_dirs(Path(corpus_dir), parts)
    base = None if root is None else os.fspath(root)
    if not isinstance(allow_commands, bool):
        raise TypeError(f"allow_commands must be a bool, got {allow_commands!r}")
    if allow_commands and output_dir is None:
        raise ValueError("allow_commands needs an output_dir: the commands' audio is written "
                         "there, beside the manifests")

    def commands(part: str) -> Path | None:
        return Path(output_dir, f"{CORPUS}_audio_{part}") if allow_commands else None

    # the commands' audio folder of the part that fails goes again if this run created it
    # (the parts before it are written: their manifests name their folders)
    started: list[Path | None] = []  # per part begun: its folder if this run creates it

    def samples(part: str) -> list[dict]:
        folder = commands(part)
        started.append(folder if folder is not None and not folder.exists() else None)
        return _dir_samples(dirs[part], base, num_jobs=num_jobs, on_mismatch=on_mismatch,
                            progress=progress, commands=folder)

    try:
        return prepare_parts(
            CORPUS, list(dirs), output_dir, samples,
            force=force, num_jobs=num_jobs, progress=progress,
            inputs=lambda part: files_under(dirs[part], recursive=False),
            settings={"on_mismatch": on_mismatch, "root": base,
                      "allow_commands": allow_commands},
            **checks,
        )
    except BaseException:
        if started and started[-1] is not None:
            shutil.rmtree(started[-1], ignore_errors=True)
        raise


def _table(path: Path, **kwargs: Any) -> dict[str, ScpEntry] | None:
    return read_scp_table(path, **kwargs) if path.is_file() else None


def _where(entry: ScpEntry) -> str:
    return f"{entry.source}:{entry.line} (key {entry.key!r})"


def _resolve(value: str, root: str | None) -> str:
    path = value if root is None or os.path.isabs(value) else os.path.join(root, value)
    return os.path.abspath(path)


def _audio_file(entry: ScpEntry, root: str | None, commands: Path | None = None) -> str:
    value = entry.value
    if value.endswith("|"):
        if commands is not None:
            return _command_audio(entry, root, commands)
        raise DataError(
            "this wav.scp value is a command: pass allow_commands=True (CLI: speechpipe "
            "prepare kaldi_dir ... --allow-commands) to run it and write its audio beside the "
            "manifest, or read this directory with kaldi_dir_samples(..., "
            "allow_commands=True)", source=entry.source, line=entry.line, key=entry.key)
    path = _resolve(value, root)
    ref = parse_ark_ref(value)
    if not os.path.exists(path) and ref and ref.offset is not None \
            and os.path.isfile(_resolve(ref.path, root)):
        raise DataError(
            "this wav.scp value is audio stored in an ark: a manifest names audio files. "
            "Read this directory with kaldi_dir_samples(), or pack it with 'speechpipe pack'",
            source=entry.source, line=entry.line, key=entry.key)
    if not os.path.isfile(path):
        if VERIFYING.get():  # the verification counts it with every other fault
            return path
        raise MissingDataError(f"audio file not found: {path} (prepare --verify reports "
                               "every missing file at once; with --on-error skip it leaves "
                               "them out, counted)", source=entry.source, line=entry.line,
                               key=entry.key)
    return path


def _command_audio(entry: ScpEntry, root: str | None, folder: Path) -> str:
    """Run the ``cmd |`` of ``entry``, write its audio to ``folder/<id>.flac``; its path."""
    import urllib.parse

    import soundfile

    audio, rate = read_wav_value(entry.value, root=root, allow_commands=True,
                                 source=entry.source, line=entry.line, key=entry.key)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{urllib.parse.quote(entry.key, safe='')}.flac"
    tmp = path.with_name(path.name + ".tmp")
    soundfile.write(tmp, audio, rate, subtype="PCM_24", format="FLAC")
    os.replace(tmp, path)
    return str(path.resolve())


def _feats_value(entry: ScpEntry, root: str | None) -> str:
    ref = parse_ark_ref(entry.value)
    if ref is None or entry.value.endswith("|"):
        raise DataError("expected '<ark path>[:<offset>]' in feats.scp", source=entry.source,
                        line=entry.line, key=entry.key)
    return _resolve(ref.path, root) + entry.value[len(ref.path):]


def _speakers(data_dir: Path, utts: Iterable[str]) -> dict[str, str] | None:
    utt2spk = _table(data_dir / "utt2spk")
    if utt2spk is None:
        return None
    speakers = {key: entry.value for key, entry in utt2spk.items()}
    for utt in utts:
        if utt not in speakers:
            raise DataError("utterance missing from utt2spk (every utterance needs a speaker)",
                            source=str(data_dir / "utt2spk"), key=utt)
    spk2utt = _table(data_dir / "spk2utt")
    if spk2utt is not None:
        listed: set[str] = set()
        for spk, entry in spk2utt.items():
            for utt in entry.value.split():
                if speakers.get(utt) != spk:
                    raise DataError(
                        f"spk2utt lists {utt!r} under {spk!r} but utt2spk says "
                        f"{speakers.get(utt)!r} (regenerate it: utils/utt2spk_to_spk2utt.pl)",
                        source=entry.source, line=entry.line, key=spk)
                listed.add(utt)
        unlisted = sorted(set(speakers) - listed)
        if unlisted:
            raise DataError(f"{len(unlisted)} utterance(s) of utt2spk are not in spk2utt, "
                            f"e.g. {unlisted[:3]} (regenerate it: utils/utt2spk_to_spk2utt.pl)",
                            source=str(data_dir / "spk2utt"))
    return speakers


def _dir_samples(data_dir: Path, root: str | None, *, num_jobs: int, on_mismatch: str,
                 progress: bool, commands: Path | None = None) -> list[dict]:
    wav = _table(data_dir / "wav.scp")
    segments = _table(data_dir / "segments")
    feats = _table(data_dir / "feats.scp")
    if segments is not None and wav is None:
        raise MissingDataError("segments needs wav.scp (the recordings it cuts)",
                               source=str(data_dir / "wav.scp"))
    samples: dict[str, dict] = {}
    origin: dict[str, str] = {}  # utterance -> the file:line it comes from
    if wav is not None:
        samples, origin = _audio_samples(data_dir, wav, segments, root, num_jobs=num_jobs,
                                         progress=progress, commands=commands)
    if feats is not None:
        _add_feats_samples(samples, origin, data_dir, feats, root)
    return _labelled(samples, origin, data_dir, on_mismatch=on_mismatch)


def _audio_samples(data_dir: Path, wav: dict[str, ScpEntry],
                   segments: dict[str, ScpEntry] | None, root: str | None, *, num_jobs: int,
                   progress: bool, commands: Path | None = None
                   ) -> tuple[dict[str, dict], dict[str, str]]:
    """The utterances of ``wav.scp`` (whole recordings, or the ``segments`` cut from them;
    durations from the audio headers) and the ``file:line`` each comes from."""
    samples: dict[str, dict] = {}
    origin: dict[str, str] = {}
    recordings = sorted(wav)
    paths = {r: _audio_file(wav[r], root, commands) for r in recordings}
    measured = dict(zip(recordings, measure_audio(
        [paths[r] for r in recordings], num_jobs=num_jobs, progress=progress,
        desc=f"kaldi_dir {data_dir.name}")))
    if segments is None:
        for r in recordings:
            frames, rate = measured[r]
            samples[r] = {KEY: r, AUDIO_PATH: paths[r], DURATION: frames / rate,
                          "sample_rate": rate}
            origin[r] = _where(wav[r])
        return samples, origin
    misfits: list[str] = []  # prepare --verify: segments outside their recording, all at once
    for utt, entry in segments.items():
        seg = parse_segment(entry)
        if seg.recording not in wav:
            raise DataError(f"unknown recording {seg.recording!r}: not in wav.scp",
                            source=entry.source, line=entry.line, key=utt)
        if seg.channel is not None:
            raise DataError("segments with a channel field cannot go into a "
                            "manifest; use kaldi_dir_samples()", source=entry.source,
                            line=entry.line, key=utt)
        frames, rate = measured[seg.recording]
        if (frames, rate) == (0, 1) and VERIFYING.get():  # unreadable: verify reports it
            end = seg.start if seg.end == -1 else max(seg.end, seg.start)
        else:
            try:
                end = _segment_end(seg, frames / rate, entry, utt)
            except DataError as exc:
                if collected_faults() is None:
                    raise
                misfits.append(str(exc))
                origin[utt] = _where(entry)  # in origin, not in samples: reported already
                continue
        samples[utt] = {KEY: utt, AUDIO_PATH: paths[seg.recording], OFFSET: seg.start,
                        DURATION: round(end - seg.start, 6), "sample_rate": rate,
                        "recording": seg.recording}
        origin[utt] = _where(entry)
    if misfits:
        collected_faults().append(("segment outside its recording (or a truncated recording)",
                                   len(misfits), misfits[:3], None))
    return samples, origin


def _segment_end(seg: Segment, length: float, entry: ScpEntry, utt: str) -> float:
    """The end of segment ``seg`` (``-1``: the recording's), within the recording's
    ``length`` seconds (a few ms past it are clipped)."""
    end = length if seg.end == -1 else seg.end
    if end > length + MAX_OVERSHOOT:
        raise DataError(f"segment ends at {end} s, past the end of recording "
                        f"{seg.recording!r} ({length:.3f} s)",
                        source=entry.source, line=entry.line, key=utt)
    end = min(end, length)
    if end <= seg.start:
        raise DataError(f"segment starts at {seg.start} s, at or after the end "
                        f"of recording {seg.recording!r} ({length:.3f} s)",
                        source=entry.source, line=entry.line, key=utt)
    return end


def _add_feats_samples(samples: dict[str, dict], origin: dict[str, str], data_dir: Path,
                       feats: dict[str, ScpEntry], root: str | None) -> None:
    """Add ``feats_path`` and ``num_frames`` to the utterances of ``feats.scp`` (the same keys
    as the audio's, if any); without audio, they are the utterances (durations from
    ``utt2dur``, or frames × the frame shift)."""
    faulted = set(origin) - set(samples)  # audio faults prepare --verify reports already
    if (samples or faulted) and set(feats) - faulted != set(samples):
        extra = sorted(set(feats) - faulted - set(samples))
        lacking = sorted(set(samples) - set(feats))
        raise DataError(
            f"feats.scp keys differ from the utterances: {len(extra)} not an utterance "
            f"(e.g. {extra[:3]}), {len(lacking)} utterance(s) without features "
            f"(e.g. {lacking[:3]})", source=str(data_dir / "feats.scp"))
    utt2dur = _table(data_dir / "utt2dur")
    for utt, entry in feats.items():
        if utt in faulted:
            continue
        value = _feats_value(entry, root)
        frames = int(read_matrix(value, source=entry.source, line=entry.line,
                                 key=utt).shape[0])
        if utt in samples:
            samples[utt].update({FEATS_PATH: value, "num_frames": frames})
            continue
        duration = frames * FRAME_SHIFT
        if utt2dur is not None and utt in utt2dur:
            duration = _seconds(utt2dur[utt])
        samples[utt] = {KEY: utt, FEATS_PATH: value, "num_frames": frames,
                        DURATION: duration}
        origin[utt] = _where(entry)


def _labelled(samples: dict[str, dict], origin: dict[str, str], data_dir: Path, *,
              on_mismatch: str) -> list[dict]:
    """The samples in key order with their ``text`` and ``speaker`` (when the folder has
    ``text`` / ``utt2spk``); utterances without text, or text without utterance, under
    ``on_mismatch``."""
    text = _table(data_dir / "text", allow_empty=True)
    keep = set(samples)
    if text is not None:
        without_text = [origin[u] for u in sorted(samples) if u not in text]
        without_audio = [_where(text[u]) for u in sorted(text)
                         if u not in samples and u not in origin]  # origin only: a fault
        check_pairs(without_text, without_audio, on_mismatch=on_mismatch,
                    stage=f"prepare_kaldi_dir {data_dir.name}", source=data_dir)
        keep = {u for u in samples if u in text}
    speakers = _speakers(data_dir, sorted(samples))
    out = []
    for utt in sorted(keep):
        sample = samples[utt]
        if text is not None:
            sample[TEXT] = text[utt].value
        if speakers is not None:
            sample[SPEAKER] = speakers[utt]
        out.append(sample)
    return out


def _seconds(entry: ScpEntry) -> float:
    try:
        value = float(entry.value)
    except ValueError:
        value = float("nan")
    if not value >= 0:
        raise DataError(f"expected seconds, got {entry.value!r}", source=entry.source,
                        line=entry.line, key=entry.key)
    return value


def _speaker_row(entry: ScpEntry) -> dict:
    return {KEY: entry.key, SPEAKER: entry.value,
            SOURCE: locate(entry.source, line=entry.line)}  # join_by_key's errors name it


def _table_pipe(path: Path, *, allow_empty: bool = False) -> IterDataPipe:
    return IterableWrapper([str(path)]).open_files(mode="b").parse_scp(allow_empty=allow_empty)


def kaldi_dir_samples(
    data_dir: str | os.PathLike,
    *,
    root: str | os.PathLike | None = None,
    allow_commands: bool = False,
    on_missing: str = "raise",
    on_error: str = "raise",
) -> IterDataPipe[dict]:
    """Samples of a Kaldi data directory, read from its tables (no manifest).

    Stages and element shapes::

        segments -> parse_scp -> load_segments(wav.scp)   {key, audio, sample_rate, recording}
          (no segments: wav.scp -> parse_scp -> load_scp("wav")    {key, audio, sample_rate})
          (no wav.scp: feats.scp -> parse_scp -> load_scp("feats") {key, feats})
        join_by_key(text, utt2spk)                        + text, speaker

    The builder looks only at which tables exist; they are read when iteration starts.
    Without ``text`` or ``utt2spk`` that field is absent. Each sample's ``source`` is the
    ``file:line`` of its first table, which errors name.

    Args:
        data_dir: the data directory.
        root: folder relative table paths start from (default: the current folder).
        allow_commands: run ``cmd |`` values of ``wav.scp``.
        on_missing: ``"raise"`` when an utterance has no text or speaker (or the reverse),
            or ``"skip"`` it, counted (``join_by_key``).
        on_error: audio (or features) that is missing, truncated or corrupt, or a failing
            command: ``"raise"`` naming the table line, or ``"skip"`` the utterance, counted
            in the loading stage's diagnostics (:func:`~speechpipe.recipes.pipeline_report`;
            with ``text``/``utt2spk``, pass ``on_missing="skip"`` too: their lines for the
            skipped utterances are then counted as well).

    Raises:
        MissingDataError: ``data_dir`` holds none of ``segments``, ``wav.scp``, ``feats.scp``.
    """
    d = Path(data_dir)
    if (d / "segments").is_file():
        pipe = _table_pipe(d / "segments").load_segments(
            str(d / "wav.scp"), root=root, allow_commands=allow_commands, on_error=on_error)
    elif (d / "wav.scp").is_file():
        pipe = _table_pipe(d / "wav.scp").load_scp("wav", root=root,
                                                    allow_commands=allow_commands,
                                                    on_error=on_error)
    elif (d / "feats.scp").is_file():
        pipe = _table_pipe(d / "feats.scp").load_scp("feats", root=root, on_error=on_error)
    else:
        raise MissingDataError("not a Kaldi data directory: no segments, wav.scp or feats.scp",
                               source=str(d))
    tables = []
    if (d / "text").is_file():
        tables.append(_table_pipe(d / "text", allow_empty=True).load_scp("text"))
    if (d / "utt2spk").is_file():
        tables.append(_table_pipe(d / "utt2spk").map(_speaker_row))
    if tables:
        pipe = pipe.join_by_key(*tables, on_missing=on_missing)
    return pipe


def _sources(manifests: Any, parts: Iterable[str] | None) -> list:
    return resolve_manifests(manifests, corpus=CORPUS,
                             parts=None if parts is None else list(parts))


def kaldi_dir_train(manifests: Any, parts: Iterable[str] | None = None,
                    **options: Any) -> IterDataPipe[dict]:
    """Training batches of prepared Kaldi data directories
    (:func:`~speechpipe.recipes.train_pipeline`; pass ``input="feats",
    features=None`` for a feature-only directory). No corpus defaults: set
    ``min_duration``/``max_duration`` as your recipe does.

    Args:
        manifests: the manifest folder (with ``parts``), prepare's dict, or manifest paths.
        parts: data directory names, with a manifest folder.
        **options: :func:`~speechpipe.recipes.train_pipeline` options.
    """
    return train_pipeline(_sources(manifests, parts), **options)


def kaldi_dir_eval(manifests: Any, parts: Iterable[str] | None = None,
                   **options: Any) -> IterDataPipe[dict]:
    """Validation / test batches in manifest order
    (:func:`~speechpipe.recipes.eval_pipeline`)."""
    return eval_pipeline(_sources(manifests, parts), **options)

