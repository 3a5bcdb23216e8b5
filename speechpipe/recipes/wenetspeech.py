"""WenetSpeech (10,000+ h of Mandarin from YouTube and podcasts): download, prepare, pipelines.

Layout (after the official download and decryption)::

    WenetSpeech/
      WenetSpeech.json      # one JSON document (GBs) describing every recording and segment
      TERMS_OF_ACCESS
      audio/train/{youtube,podcast}/B00000/Y0000000000_--5llN02F84.opus   # long, 16 kHz Opus
      audio/dev/third_party/...  audio/test_net/youtube/...  audio/test_meeting/third_party/...

``WenetSpeech.json`` is ``{..., "audios": [{"aid", "path", "duration", "source", "segments":
[{"sid", "begin_time", "end_time", "text", "subsets", "confidence"}, ...]}, ...]}``; each
segment is an utterance cut from its recording, and ``subsets`` says which of the parts
``S`` (100 h) ⊂ ``M`` (1,000 h) ⊂ ``L`` (10,000 h), ``DEV``, ``TEST_NET``, ``TEST_MEETING``
it belongs to.

- :func:`download_wenetspeech`: the official release is encrypted (AES-256-CBC, openssl's
  ``-pbkdf2`` key derivation) with a password that the corpus owners send on request; given
  that password and the release's object list (``metadata/v1.list`` of
  github.com/wenet-e2e/WenetSpeech: ``<md5> <object>`` lines), every object is downloaded
  (resumable, md5-verified), decrypted with the ``openssl`` command and extracted;
- :func:`prepare_wenetspeech`: reads ``WenetSpeech.json`` as a stream (never the whole
  document in memory: :func:`iter_audios`) and writes ``wenetspeech_samples_<part>.jsonl.gz``
  for every requested part in one pass, one line per segment: ``key`` (``sid``),
  ``audio_path`` (the recording, absolute), ``offset`` (``begin_time``), ``duration``
  (``end_time - begin_time``), ``text``, ``recording`` (``aid``), ``confidence``, ``origin``
  (the recording's ``source``: youtube, podcast...);
- :func:`wenetspeech_train` / :func:`wenetspeech_valid` / :func:`wenetspeech_test`: pipelines
  (train on 1-15 s, 80-bin fbank) that seek into the Opus recordings for each segment and
  normalize the text (:data:`TEXT_NORMALIZER`: full-width spaces and spaces between Chinese
  characters removed, as the official ``fix_json.py`` does).

Reading a segment seeks into a long Opus file, which costs a decode from the previous page;
for many epochs over ``M``/``L``, cut the segments into tar shards once with ``speechpipe pack
--manifest OUT/wenetspeech_samples_L.jsonl.gz --audio-format flac16 --out shards/L`` (16-bit
FLAC, as Kaldi and WeNet store them; float WAV would be four times larger).
"""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from ..errors import DataError, MissingDataError
from ..pipes._core import IterDataPipe
from ..pipes.sources import ManifestWriter
from ..pipes.text import TextNormalizer
from ..sample import DURATION, KEY, TEXT
from ._download import fetch_url, download_and_extract
from ._pipelines import eval_pipeline, train_pipeline
from ._prepare import (
    AUDIO_PATH,
    OFFSET,
    check_prepare_args,
    check_pairs,
    manifest_path,
    resolve_manifests,
    resolve_parts,
)

__all__ = [
    "CORPUS",
    "DOWNLOAD_PARTS",
    "DURATION_RANGE",
    "METADATA",
    "PARTS",
    "PART_FOLDERS",
    "RELEASE_URL",
    "TEXT_NORMALIZER",
    "download_wenetspeech",
    "iter_audios",
    "prepare_wenetspeech",
    "read_object_list",
    "wenetspeech_test",
    "wenetspeech_train",
    "wenetspeech_valid",
]

CORPUS = "wenetspeech"
#: The official parts (segment ``subsets``): S ⊂ M ⊂ L are training sets.
PARTS = ("S", "M", "L", "DEV", "TEST_NET", "TEST_MEETING")
#: The ``audio/<folder>/`` each part's recordings are in.
PART_FOLDERS = {"S": "train", "M": "train", "L": "train", "DEV": "dev",
                "TEST_NET": "test_net", "TEST_MEETING": "test_meeting"}
#: Utterance durations kept for training (seconds).
DURATION_RANGE = (1.0, 15.0)
#: The metadata file, relative to the corpus folder.
METADATA = "WenetSpeech.json"
#: The official release server (``utils/download_wenetspeech.sh``).
RELEASE_URL = "http://wenet.meeting.tencent.com/WenetSpeech"
#: Applied to ``text`` before tokenizing in the pipelines: NFKC (a full-width space becomes a
#: space) and the spaces next to Chinese characters removed; spaces between Latin words stay.
TEXT_NORMALIZER = TextNormalizer(remove_spaces="cjk")

#: Download parts: the metadata file and the recordings of each ``audio/<folder>/``.
DOWNLOAD_PARTS = ("metadata", "train", "dev", "test_net", "test_meeting")
_PASSWORD_ENV = "SPEECHPIPE_WENETSPEECH_PASSWORD"
log = logging.getLogger("speechpipe.recipes")
_CHUNK = 1 << 20


# --------------------------------------------------------------------------- JSON stream


class _JsonStream:
    """Incremental reader of one JSON document: values are decoded one at a time with
    ``json.JSONDecoder.raw_decode`` from a buffer refilled as needed, so the text held in
    memory is about the largest single value (one recording's entry), not the document."""

    _WS = " \t\r\n"

    def __init__(self, stream: io.TextIOWrapper, source: str,
                 progress: Callable[[int], None] | None = None) -> None:
        self.stream = stream
        self.progress = progress
        self.source = source
        self.buffer = ""
        self.pos = 0
        self.line = 1  # line number at buffer[0]
        self.eof = False
        self.decoder = json.JSONDecoder()

    def line_at(self, pos: int) -> int:
        return self.line + self.buffer.count("\n", 0, pos)

    def error(self, message: str, pos: int | None = None, **where: Any) -> DataError:
        return DataError(message, source=self.source,
                         line=self.line_at(self.pos if pos is None else pos), **where)

    def _fill(self) -> bool:
        if self.eof:
            return False
        try:
            chunk = self.stream.read(max(_CHUNK, len(self.buffer) - self.pos))
        except UnicodeDecodeError as exc:
            raise self.error(f"invalid UTF-8 ({exc.reason}) after this line") from exc
        if self.progress is not None:
            self.progress(self.stream.buffer.tell())
        if not chunk:
            self.eof = True
            return False
        self.line += self.buffer.count("\n", 0, self.pos)
        self.buffer = self.buffer[self.pos:] + chunk
        self.pos = 0
        return True

    def peek(self) -> str:
        """The next non-whitespace character ("" at the end)."""
        while True:
            while self.pos < len(self.buffer) and self.buffer[self.pos] in self._WS:
                self.pos += 1
            if self.pos < len(self.buffer):
                return self.buffer[self.pos]
            if not self._fill():
                return ""

    def expect(self, chars: str, what: str) -> str:
        found = self.peek()
        if not found or found not in chars:
            shown = repr(found) if found else "the end of the file"
            raise self.error(f"expected {what}, found {shown}")
        self.pos += 1
        return found

    def value(self) -> tuple[int, Any]:
        """``(line, value)`` of the next JSON value."""
        self.peek()
        while True:
            try:
                value, end = self.decoder.raw_decode(self.buffer, self.pos)
            except json.JSONDecodeError as exc:
                if self._fill():
                    continue
                raise self.error(f"invalid JSON: {exc.msg}", exc.pos) from None
            if end == len(self.buffer) and not self.eof and isinstance(value, (int, float)):
                if self._fill():  # a number may go on in the next chunk
                    continue
            line = self.line_at(self.pos)
            self.pos = end
            return line, value


def iter_audios(path: str | os.PathLike, *, progress: Callable[[int], None] | None = None
                ) -> Iterator[tuple[int, dict]]:
    """``(line, entry)`` for each element of ``audios`` in ``WenetSpeech.json``, streamed.

    The document is read in chunks and each recording's entry is decoded on its own, so a
    file of several GB is read in bounded memory. Other top-level fields are skipped.
    ``progress`` is called with the number of bytes read so far after each chunk.

    Raises:
        MissingDataError: the file does not exist.
        DataError: invalid JSON or UTF-8, a document that is not an object with an
            ``audios`` list, an entry that is not an object; naming ``file:line``.

    >>> import tempfile
    >>> p = Path(tempfile.mkdtemp()) / METADATA
    >>> _ = p.write_text('{"dataset": "WenetSpeech",\\n "audios": [\\n  {"aid": "Y1"},\\n'
    ...                  '  {"aid": "Y2"}]}', encoding="utf-8")
    >>> [(line, a["aid"]) for line, a in iter_audios(p)]
    [(3, 'Y1'), (4, 'Y2')]
    """
    path = Path(path)
    try:
        raw = open(path, "rb")
    except FileNotFoundError as exc:
        raise MissingDataError(f"{METADATA} not found", source=str(path)) from exc
    with raw, io.TextIOWrapper(raw, encoding="utf-8", errors="strict") as text:
        reader = _JsonStream(text, str(path), progress)
        if reader.peek() == "\ufeff":
            reader.pos += 1
        reader.expect("{", "a JSON object ('{')")
        found = False
        if reader.peek() != "}":
            while True:
                line, name = reader.value()
                if not isinstance(name, str):
                    raise reader.error("expected a field name")
                reader.expect(":", "':'")
                if name == "audios":
                    found = True
                    yield from _iter_array(reader)
                else:
                    reader.value()
                if reader.expect(",}", "',' or '}'") == "}":
                    break
        else:
            reader.pos += 1
        if reader.peek():
            raise reader.error("unexpected data after the JSON document")
        if not found:
            raise DataError("no 'audios' list in the document", source=str(path))


def _iter_array(reader: _JsonStream) -> Iterator[tuple[int, dict]]:
    reader.expect("[", "the 'audios' list ('[')")
    if reader.peek() == "]":
        reader.pos += 1
        return
    while True:
        line, entry = reader.value()
        if not isinstance(entry, dict):
            raise DataError(f"an 'audios' element must be an object, got "
                            f"{type(entry).__name__}", source=reader.source, line=line)
        yield line, entry
        if reader.expect(",]", "',' or ']'") == "]":
            return


# --------------------------------------------------------------------------- prepare


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def _segments(entry: dict, line: int, source: str) -> tuple[str, str, float, list[dict]]:
    """Validate one recording entry: ``(aid, path, duration, segments)``."""
    aid = entry.get("aid")
    where: dict[str, Any] = dict(source=source, line=line)
    if not isinstance(aid, str) or not aid:
        raise DataError("recording entry without a string 'aid'", **where)
    where["key"] = aid
    rel = entry.get("path")
    if not isinstance(rel, str) or not rel:
        raise DataError("recording without a string 'path'", **where)
    parts = Path(rel).parts
    if Path(rel).is_absolute() or ".." in parts or len(parts) < 3 or parts[0] != "audio":
        raise DataError(f"recording path {rel!r} is not audio/<folder>/... inside the corpus",
                        **where)
    duration = entry.get("duration")
    if not _number(duration) or duration <= 0:
        raise DataError(f"recording 'duration' must be seconds > 0, got {duration!r}", **where)
    segments = entry.get("segments")
    if not isinstance(segments, list):
        raise DataError("recording without a 'segments' list", **where)
    seen: set[str] = set()
    for seg in segments:
        if not isinstance(seg, dict):
            raise DataError(f"a segment must be an object, got {type(seg).__name__}", **where)
        sid = seg.get("sid")
        if not isinstance(sid, str) or not sid:
            raise DataError("segment without a string 'sid'", **where)
        at = dict(where, key=sid)
        if sid in seen:
            raise DataError("segment id repeated in its recording", **at)
        seen.add(sid)
        begin, end = seg.get("begin_time"), seg.get("end_time")
        if not (_number(begin) and _number(end) and 0 <= begin < end):
            raise DataError(f"segment times must be seconds with 0 <= begin_time < end_time, "
                            f"got {begin!r}, {end!r}", **at)
        if not isinstance(seg.get("text"), str):
            raise DataError("segment without a string 'text'", **at)
        subsets = seg.get("subsets")
        if not isinstance(subsets, list) or any(s not in PARTS for s in subsets):
            raise DataError(f"segment 'subsets' must be a list of {list(PARTS)}, got "
                            f"{subsets!r}", **at)
    return aid, rel, float(duration), segments


def _corpus_root(corpus_dir: str | os.PathLike) -> Path:
    root = Path(corpus_dir)
    if not root.is_dir():
        raise MissingDataError("WenetSpeech folder not found", source=str(root))
    if not (root / METADATA).is_file():
        raise MissingDataError(
            f"{METADATA} not found: pass the folder where the release was extracted (holding "
            f"{METADATA} and audio/)", source=str(root / METADATA))
    return root


def prepare_wenetspeech(
    corpus_dir: str | os.PathLike,
    output_dir: str | os.PathLike | None = None,
    parts: str | Iterable[str] = "auto",
    num_jobs: int = 1,
    *,
    on_mismatch: str = "error",
    force: bool = False,
    progress: bool = True,
) -> dict[str, Any]:
    """Read ``WenetSpeech.json`` once and write ``wenetspeech_samples_<part>.jsonl.gz`` for each
    requested part (``S``, ``M``, ``L``, ``DEV``, ``TEST_NET``, ``TEST_MEETING``).

    One manifest line per segment whose ``subsets`` holds the part, in the document's order:
    ``key`` (``sid``), ``audio_path`` (the recording, absolute), ``offset`` (``begin_time``,
    s), ``duration`` (``end_time - begin_time``, s), ``text`` (as written; the pipelines
    normalize it), ``recording`` (``aid``), ``origin`` (the recording's ``source``) and
    ``confidence`` when given. Manifests are written while the document streams past (memory
    does not grow with the corpus) and renamed into place when complete; parts whose manifest
    exists are reused unless ``force``.

    Mismatches, under ``on_mismatch``: a recording of a requested part whose Opus file is
    missing (its segments are transcripts without audio), a segment ending after its
    recording's ``duration``, and an audio file under the parts' ``audio/<folder>/`` that the
    document does not list (audio without transcript).

    Args:
        corpus_dir: the folder holding ``WenetSpeech.json`` and ``audio/``.
        output_dir: manifest folder; ``None`` returns the sample lists instead of paths.
        parts: ``"auto"`` (every part whose ``audio/<folder>/`` exists), a part or several.
        num_jobs: accepted for the common recipe signature; the pass is a single stream.
        on_mismatch: ``"error"`` raises a :class:`~speechpipe.errors.DataError` with counts and
            examples (and writes nothing); ``"skip"`` leaves them out, counted in a
            :class:`~speechpipe.diagnostics.SkippedInputWarning`.
        force: rebuild manifests that exist.
        progress: a tqdm bar over the bytes of ``WenetSpeech.json``.

    Returns:
        ``{part: manifest path}`` (or ``{part: [samples]}`` without ``output_dir``).

    Raises:
        MissingDataError: ``corpus_dir``, ``WenetSpeech.json`` or a requested part's audio
            folder is absent.
        DataError: malformed JSON, a recording or segment without its fields (naming
            ``file:line`` and the ``aid``/``sid``), a repeated segment id, a mismatch under
            ``"error"``, a part without any segment.
    """
    check_prepare_args(on_mismatch, num_jobs)
    root = _corpus_root(corpus_dir)
    names = resolve_parts(parts, PARTS, lambda p: (root / "audio" / PART_FOLDERS[p]).is_dir(),
                          corpus=CORPUS, corpus_dir=root,
                          where=lambda p: str(root / "audio" / PART_FOLDERS[p]))
    result = {} if output_dir is None or force else _existing_manifests(names, output_dir)
    todo = [p for p in names if p not in result]
    if not todo:
        return result
    sinks = _open_sinks(todo, output_dir)
    metadata = root / METADATA
    try:
        listed, without_audio, counts = _write_segments(root, sinks, progress=progress)
        without_text = _unlisted_audio(root, {PART_FOLDERS[p] for p in todo}, listed)
        check_pairs(without_text, without_audio, on_mismatch=on_mismatch,
                    stage=f"prepare_wenetspeech {','.join(todo)}", source=metadata)
        empty = [p for p in todo if not counts[p]]
        if empty:
            raise DataError(f"wenetspeech part(s) {empty}: no segment to write (none listed "
                            "in the part, or each one lacked its audio)", source=str(metadata))
    except BaseException:
        for sink in sinks.values():
            if isinstance(sink, ManifestWriter):
                sink.abort()
        raise
    for part in todo:
        sink = sinks[part]
        if isinstance(sink, ManifestWriter):
            sink.close()
            result[part] = Path(sink.path)
        else:
            result[part] = sink
    return {p: result[p] for p in names}


def _existing_manifests(names: Iterable[str], output_dir: str | os.PathLike) -> dict[str, Path]:
    """``{part: manifest}`` of the parts of ``names`` whose manifest exists (reused)."""
    paths = {part: manifest_path(output_dir, CORPUS, part) for part in names}
    return {part: path for part, path in paths.items() if path.exists()}


def _open_sinks(parts: Iterable[str], output_dir: str | os.PathLike | None) -> dict[str, Any]:
    """``{part: ManifestWriter}`` into ``output_dir`` (created), or ``{part: []}`` without."""
    if output_dir is None:
        return {p: [] for p in parts}
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    return {p: ManifestWriter(manifest_path(output_dir, CORPUS, p)) for p in parts}


def _write_segments(root: Path, sinks: dict[str, Any], *,
                    progress: bool) -> tuple[set[str], list[str], dict[str, int]]:
    """One pass over ``WenetSpeech.json``: each segment of a part of ``sinks`` whose recording
    is there is written to (or appended to) the sinks of its parts.

    Returns the audio files the document lists (relative to ``root``), the segments without
    audio (``file:line (key ...)``: no file, or ending after the recording) and the number of
    segments written per part.
    """
    from ..progress import progress_bar

    write = {p: sink.append if isinstance(sink, list) else sink.write
             for p, sink in sinks.items()}
    wanted = set(sinks)
    metadata = root / METADATA
    listed: set[str] = set()
    without_audio: list[str] = []
    counts = dict.fromkeys(sinks, 0)
    with progress_bar(total=metadata.stat().st_size, unit="B", unit_scale=True, desc=METADATA,
                      disable=not progress, leave=False) as bar:
        def advance(position: int) -> None:
            bar.update(position - bar.n)

        for line, entry in iter_audios(metadata, progress=advance):
            aid, rel, duration, segments = _segments(entry, line, str(metadata))
            listed.add(rel)
            audio_path = None  # the recording's absolute path, once it is needed
            for seg in segments:
                targets = wanted.intersection(seg["subsets"])
                if not targets:
                    continue
                if audio_path is None:
                    audio = root / rel
                    audio_path = str(audio.resolve()) if audio.is_file() else ""
                if not audio_path:
                    without_audio.append(f"{metadata}:{line} (key {seg['sid']!r}): "
                                         f"no file {rel}")
                    continue
                if seg["end_time"] > duration:
                    without_audio.append(f"{metadata}:{line} (key {seg['sid']!r}): ends at "
                                         f"{seg['end_time']} s, after the recording's "
                                         f"{duration} s")
                    continue
                sample = _segment_sample(seg, entry, aid, audio_path)
                for part in targets:
                    write[part](sample)
                    counts[part] += 1
    return listed, without_audio, counts


def _segment_sample(seg: dict, entry: dict, aid: str, audio_path: str) -> dict[str, Any]:
    """The manifest line of a checked segment of the recording ``entry``."""
    sample = {KEY: seg["sid"], AUDIO_PATH: audio_path,
              OFFSET: float(seg["begin_time"]),
              DURATION: round(seg["end_time"] - seg["begin_time"], 6),
              TEXT: seg["text"], "recording": aid}
    if isinstance(entry.get("source"), str):
        sample["origin"] = entry["source"]
    if _number(seg.get("confidence")):
        sample["confidence"] = seg["confidence"]
    return sample


def _unlisted_audio(root: Path, folders: Iterable[str], listed: set[str]) -> list[str]:
    """The audio files under ``root/audio/<folder>/`` that the document does not list."""
    return sorted(
        str(p) for folder in sorted(folders) for p in (root / "audio" / folder).rglob("*")
        if p.is_file() and p.suffix in (".opus", ".wav", ".flac")
        and p.relative_to(root).as_posix() not in listed)


# --------------------------------------------------------------------------- download


def read_object_list(list_file: str | os.PathLike) -> list[tuple[str, str]]:
    """``[(md5, object), ...]`` from the release's object list (a path or an http(s) URL).

    Lines are ``<md5> <object>`` (``9fa37bb1... WenetSpeech.json.aes.tgz``); blank lines and
    ``#`` comments are skipped.

    Raises:
        MissingDataError: the file does not exist.
        DataError: a line that is not an md5 and a relative object path (naming ``file:line``).

    >>> import tempfile
    >>> p = Path(tempfile.mkdtemp()) / "v1.list"
    >>> _ = p.write_text("# md5 object\\n" + "0" * 32 + " audio/dev/third_party/B00000.aes.tgz\\n")
    >>> read_object_list(p)
    [('00000000000000000000000000000000', 'audio/dev/third_party/B00000.aes.tgz')]
    """
    name = os.fspath(list_file)
    if urllib.parse.urlparse(name).scheme in ("http", "https"):
        try:
            with urllib.request.urlopen(name, timeout=60) as response:
                text = response.read().decode("utf-8")
        except OSError as exc:
            raise DataError(f"cannot fetch the object list ({exc})", source=name) from exc
    else:
        try:
            text = Path(name).read_text(encoding="utf-8")
        except FileNotFoundError as exc:
            raise MissingDataError("object list not found", source=name) from exc
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        fields = line.split()
        ok = len(fields) == 2 and len(fields[0]) == 32
        if ok:
            try:
                int(fields[0], 16)
            except ValueError:
                ok = False
        obj = fields[1] if ok else ""
        if not ok or obj.startswith("/") or ".." in Path(obj).parts or not obj.endswith(".tgz"):
            raise DataError(f"expected '<md5> <object>.tgz', got {line!r}", source=name,
                            line=number)
        out.append((fields[0].lower(), obj))
    return out


def _part_of(obj: str) -> str:
    parts = Path(obj).parts
    return parts[1] if len(parts) > 2 and parts[0] == "audio" else "metadata"


def _openssl_decrypt(password: str) -> Callable[[Path, Path], None]:
    """``decrypt(archive, output)`` with ``openssl aes-256-cbc -d -salt -pbkdf2`` (the
    release's encryption); the password goes through the environment, not the command line."""
    command = shutil.which("openssl")
    if command is None:
        raise MissingDataError("the openssl command is needed to decrypt the WenetSpeech "
                               "release: install OpenSSL (1.1.1 or newer)", source="openssl")

    def decrypt(archive: Path, output: Path) -> None:
        env = dict(os.environ, **{_PASSWORD_ENV: password})
        done = subprocess.run(
            [command, "aes-256-cbc", "-d", "-salt", "-pbkdf2", "-pass", f"env:{_PASSWORD_ENV}",
             "-in", str(archive), "-out", str(output)],
            env=env, capture_output=True, text=True, check=False)
        reason = None
        if done.returncode != 0:
            first = done.stderr.strip().splitlines()[:1]
            reason = first[0] if first else "openssl failed"
        elif archive.name.endswith((".tgz", ".tar.gz")) and not _gzip_at_start(output):
            # AES-CBC padding checks pass for about 1 wrong key in 256: openssl then writes
            # garbage and succeeds, so the gzip magic is checked too
            reason = "the output is not the gzip archive it should be"
        if reason is not None:
            raise DataError(f"cannot decrypt ({reason}): a wrong password? (the one the "
                            "WenetSpeech owners sent you)", source=str(archive))

    return decrypt


def _gzip_at_start(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def download_wenetspeech(
    target_dir: str | os.PathLike,
    parts: str | Iterable[str] = "all",
    force: bool = False,
    *,
    password: str | None = None,
    list_file: str | os.PathLike | None = None,
    base_url: str = RELEASE_URL,
    checksums: dict[str, str | None] | None = None,
    progress: bool = True,
) -> Path:
    """Download, verify, decrypt and extract the WenetSpeech release; return the corpus
    folder (``target_dir/WenetSpeech``, holding ``WenetSpeech.json`` and ``audio/``).

    Each object of ``list_file`` (``<base_url>/<object>``, e.g.
    ``audio/train/podcast/B00000.aes.tgz``) is downloaded to ``target_dir/download/<object>``
    (an interrupted transfer resumes), its md5 checked, decrypted by ``openssl`` into a
    temporary file, extracted safely and deleted; a marker per object
    (``target_dir/download/<object>.completed``) makes a second run skip it. The release's
    ``TERMS_OF_ACCESS`` is fetched first into the corpus folder (downloading means accepting
    them).

    Args:
        target_dir: download folder.
        parts: ``"all"``, or some of ``metadata`` (``WenetSpeech.json``), ``train``, ``dev``,
            ``test_net``, ``test_meeting`` (the recordings of ``audio/<part>/``; ``S``, ``M``
            and ``L`` are all in ``train``).
        force: download again objects already done.
        password: the release password (default: the ``WENETSPEECH_PASSWORD`` environment
            variable); the corpus owners send it on request (the "Download" section of
            github.com/wenet-e2e/WenetSpeech).
        list_file: the object list, ``metadata/v1.list`` of a clone of
            github.com/wenet-e2e/WenetSpeech (a path or URL).
        base_url: the release server or a mirror with the same object names.
        checksums: ``{object: checksum or None}`` replacing the list's md5s.
        progress: tqdm progress bars.

    Raises:
        ValueError: an unknown part, or no password / list given.
        MissingDataError: ``openssl`` is not installed, the list or an object is absent.
        DataError: a transfer fails, an md5 differs, decryption fails (wrong password), an
            archive is unsafe.
    """
    names = _download_part_names(parts)
    password = password if password is not None else os.environ.get("WENETSPEECH_PASSWORD")
    if not password:
        raise ValueError("the WenetSpeech release is encrypted: pass password=... (or set "
                         "WENETSPEECH_PASSWORD); the corpus owners send it on request")
    if list_file is None:
        raise ValueError("pass list_file=: metadata/v1.list of a clone of "
                         "github.com/wenet-e2e/WenetSpeech (the objects and their md5s)")
    objects = [(md5, obj) for md5, obj in read_object_list(list_file) if _part_of(obj) in names]
    if not objects:
        raise DataError(f"the object list names no object of part(s) {names}",
                        source=os.fspath(list_file))
    decrypt = _openssl_decrypt(password)
    target = Path(target_dir)
    corpus = target / "WenetSpeech"
    _fetch_terms(corpus, base_url, force=force)
    for md5, obj in objects:
        checksum: str | None = f"md5:{md5}"
        if checksums is not None and obj in checksums:
            checksum = checksums[obj]
        folder = target / "download" / Path(obj).parent
        download_and_extract(
            f"{base_url.rstrip('/')}/{obj}", folder, checksum=checksum, force=force,
            sentinel=target / "download" / f"{obj}.completed", progress=progress,
            decrypt=decrypt, extract_dir=corpus)
    return corpus


def _download_part_names(parts: str | Iterable[str]) -> list[str]:
    """The parts of :data:`DOWNLOAD_PARTS` that ``parts`` names (``"all"``: every one)."""
    names = list(DOWNLOAD_PARTS) if parts == "all" else (
        [parts] if isinstance(parts, str) else list(parts))
    unknown = [p for p in names if p not in DOWNLOAD_PARTS]
    if unknown:
        raise ValueError(f"unknown part(s) {unknown}; known: {list(DOWNLOAD_PARTS)} (S, M and "
                         "L are all in 'train')")
    return names


def _fetch_terms(corpus: Path, base_url: str, *, force: bool) -> None:
    """Fetch the release's ``TERMS_OF_ACCESS`` into ``corpus`` (unless there) and warn."""
    terms = corpus / "TERMS_OF_ACCESS"
    if force or not terms.exists():
        corpus.mkdir(parents=True, exist_ok=True)
        partial = terms.with_name("TERMS_OF_ACCESS.part")
        fetch_url(f"{base_url.rstrip('/')}/TERMS_OF_ACCESS", partial, resume=False,
               progress=False, timeout=60.0)
        os.replace(partial, terms)
        log.warning("WenetSpeech is downloaded under its terms of access: read %s", terms)


# --------------------------------------------------------------------------- pipelines


def wenetspeech_train(manifests: Any, parts: Iterable[str] = ("L",), *,
                      min_duration: float | None = DURATION_RANGE[0],
                      max_duration: float | None = DURATION_RANGE[1],
                      normalizer: Callable[[str], str] | None = TEXT_NORMALIZER,
                      **options: Any) -> IterDataPipe[dict]:
    """Training batches of WenetSpeech: segments of 1-15 s (the others dropped and counted),
    80-bin fbank, 200 padded seconds per batch, text normalized by :data:`TEXT_NORMALIZER`
    before tokenizing.

    Args:
        manifests: the manifest folder, prepare's dict, or manifest paths (then ``parts`` is
            ignored); see :func:`~speechpipe.recipes.resolve_manifests`.
        parts: the training part (``S``, ``M`` or ``L``; they are nested, so one of them).
        min_duration, max_duration: duration range kept, seconds.
        normalizer: applied to ``text`` before tokenizing (``None``: as stored).
        **options: :func:`~speechpipe.recipes.train_pipeline` options.
    """
    return train_pipeline(resolve_manifests(manifests, corpus=CORPUS, parts=list(parts)),
                          min_duration=min_duration, max_duration=max_duration,
                          normalizer=normalizer, **options)


def wenetspeech_valid(manifests: Any, parts: Iterable[str] = ("DEV",), *,
                      normalizer: Callable[[str], str] | None = TEXT_NORMALIZER,
                      **options: Any) -> IterDataPipe[dict]:
    """Validation batches (``DEV``), every segment, fixed order, text normalized as in
    :func:`wenetspeech_train`; ``options`` are
    :func:`~speechpipe.recipes.eval_pipeline`'s."""
    return eval_pipeline(resolve_manifests(manifests, corpus=CORPUS, parts=list(parts)),
                         normalizer=normalizer, **options)


def wenetspeech_test(manifests: Any, part: str = "TEST_NET", *,
                     normalizer: Callable[[str], str] | None = TEXT_NORMALIZER,
                     **options: Any) -> IterDataPipe[dict]:
    """Test batches (``TEST_NET`` or ``TEST_MEETING``), every segment, fixed order, text
    normalized as in :func:`wenetspeech_train`; ``options`` are
    :func:`~speechpipe.recipes.eval_pipeline`'s."""
    return eval_pipeline(resolve_manifests(manifests, corpus=CORPUS, parts=[part]),
                         normalizer=normalizer, **options)
