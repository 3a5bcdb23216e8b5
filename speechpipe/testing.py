"""Fixture factories shared by the tests, the benchmarks and users' own tests.

- :func:`write_musan`, :func:`write_rirs_noises`: tiny noise and room-response corpora in
  MUSAN's and RIRS_NOISES's official layouts (synthetic sounds), for the augmentation recipes.
- :func:`serve_directory`: a real HTTP server on 127.0.0.1 serving a folder, with two
  fault-injection paths for testing remote reads.
- :func:`sample_durations`: utterance durations drawn from real corpora's published
  percentiles (``shared/data/durations.md``), for realistic tests and benchmarks.
- :func:`demo_speech`: real speech from the demo corpus at any sample rate,
  :func:`on_pcm_grid` to make it exactly representable in integer PCM, and :func:`snr_db` to
  compare a decoded copy with it (codec round trips).
- :func:`cut_and_resume`: a loader's uninterrupted run beside a run cut after ``k`` batches
  and resumed from its state in a new loader, to check exact resume.
- :func:`serve_s3`: a real S3-compatible server (moto's server mode) on 127.0.0.1, with
  :func:`upload_folder` to fill a bucket and :class:`FaultProxy` in front of it to inject
  faults (5xx answers, connections dropped mid-body, slow answers). Needs the test extra
  (``moto[server]``, ``boto3``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.client
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

__all__ = ["DURATION_PERCENTILES", "FaultProxy", "MUSAN_FIXTURE", "S3_TEST_CREDENTIALS",
           "USABLE_RANGE", "batch_digest", "cut_and_resume", "demo_speech", "join_rank_group",
           "on_pcm_grid", "pack_digest", "run_ranks", "s3_test_storage", "sample_durations",
           "serve_directory", "serve_handler", "serve_s3", "snr_db", "upload_folder", "write_musan",
           "write_rirs_noises"]

#: Published percentile points ``(quantile, seconds)`` of utterance durations. Sources:
#: icefall's ``display_manifest_statistics.py`` per recipe (train sets measured 3x speed
#: perturbed, medians unchanged), LJSpeech's README; see ``shared/data/durations.md``.
DURATION_PERCENTILES: dict[str, tuple[tuple[float, float], ...]] = {
    "librispeech-train-clean-100": (
        (0.0, 1.4), (0.001, 1.9), (0.005, 2.2), (0.01, 2.5), (0.05, 4.2), (0.10, 6.4),
        (0.25, 11.4), (0.50, 13.8), (0.75, 15.3), (0.90, 16.7), (0.95, 17.3), (0.99, 18.1),
        (0.995, 18.4), (0.999, 18.8), (1.0, 24.5),
    ),
    "librispeech-dev-clean": (
        (0.0, 1.4), (0.25, 3.8), (0.50, 5.9), (0.75, 9.3), (0.99, 23.8), (1.0, 32.6),
    ),
    "aishell-1-train": (
        (0.0, 1.2), (0.25, 3.5), (0.50, 4.3), (0.75, 5.4), (0.99, 8.8), (1.0, 14.5),
    ),
    "wenetspeech-m": (
        (0.0, 0.2), (0.25, 1.4), (0.50, 2.0), (0.75, 2.9), (0.99, 8.0), (1.0, 405.1),
    ),
    "wenetspeech-l": (
        (0.0, 0.2), (0.25, 1.4), (0.50, 2.0), (0.75, 3.0), (0.99, 8.4), (1.0, 405.1),
    ),
    "ljspeech": (
        (0.0, 1.1), (0.25, 5.0), (0.50, 6.8), (0.75, 8.4), (0.99, 10.0), (1.0, 10.1),
    ),
}

#: The duration range icefall keeps for training (seconds), per corpus family.
USABLE_RANGE = {"librispeech": (1.0, 20.0), "aishell-1": (1.0, 12.0), "wenetspeech": (1.0, 15.0)}


def _write_wav(path: os.PathLike, audio: np.ndarray, rate: int = 16000) -> None:
    import soundfile

    path.parent.mkdir(parents=True, exist_ok=True)
    soundfile.write(str(path), audio.astype(np.float32), rate, subtype="PCM_16")


#: What :func:`write_musan` writes: ``{part: {source: number of files}}``.
MUSAN_FIXTURE = {"music": {"fma": 2, "rfm": 1}, "noise": {"free-sound": 3, "sound-bible": 2},
                 "speech": {"librivox": 3, "us-gov": 2}}


def write_musan(root: str | os.PathLike, seed: int = 0) -> os.PathLike:
    """A tiny MUSAN in its official layout under ``root``; returns ``<root>/musan`` (a
    :class:`pathlib.Path`).

    ``musan/<part>/<source>/{ANNOTATIONS,LICENSE,<part>-<source>-NNNN.wav}`` per
    :data:`MUSAN_FIXTURE`: 16 kHz 16-bit WAV files of 0.3-2 s (noise: filtered white noise,
    music: chords, speech: modulated harmonics).

    >>> import tempfile
    >>> musan = write_musan(tempfile.mkdtemp())
    >>> sorted(p.name for p in (musan / "noise" / "free-sound").iterdir())[:2]
    ['ANNOTATIONS', 'LICENSE']
    """
    from pathlib import Path

    rng = np.random.default_rng(seed)
    base = Path(root) / "musan"
    base.mkdir(parents=True, exist_ok=True)
    (base / "README").write_text("MUSAN: a music, speech and noise corpus (fixture)\n")
    for part, sources in MUSAN_FIXTURE.items():
        for source, count in sources.items():
            folder = base / part / source
            names = [f"{part}-{source}-{i:04d}" for i in range(count)]
            for name in names:
                t = np.arange(int(16000 * rng.uniform(0.3, 2.0))) / 16000
                if part == "noise":
                    audio = np.convolve(rng.standard_normal(t.size), np.ones(4) / 4, "same")
                elif part == "music":
                    audio = sum(np.sin(2 * np.pi * f * t) for f in rng.uniform(200, 800, 3))
                else:
                    audio = np.sin(2 * np.pi * rng.uniform(100, 250) * t) * (
                        1 + np.sin(2 * np.pi * 4 * t))
                _write_wav(folder / f"{name}.wav", 0.1 * audio / np.abs(audio).max())
            (folder / "ANNOTATIONS").write_text("".join(f"{n} fixture\n" for n in names))
            (folder / "LICENSE").write_text("fixture: synthetic sounds\n")
    return base


def _response(rng: np.random.Generator, length: int, delay: int, decay: float) -> np.ndarray:
    rir = np.zeros(length)
    rir[delay] = 1.0
    tail = np.arange(length - delay - 1)
    rir[delay + 1:] = rng.standard_normal(tail.size) * 0.3 * np.exp(-tail / decay)
    return rir / np.abs(rir).max() * 0.9


def write_rirs_noises(root: str | os.PathLike, seed: int = 0) -> os.PathLike:
    """A tiny RIRS_NOISES in its official layout under ``root``; returns
    ``<root>/RIRS_NOISES`` (a :class:`pathlib.Path`).

    ``simulated_rirs/{smallroom,mediumroom}/RoomNNN/RoomNNN-0000K.wav`` with their
    ``rir_list`` (2 rooms × 2 responses, 0.1-0.3 s), ``real_rirs_isotropic_noises/`` with a
    ``rir_list`` (2 responses) and a ``noise_list`` (1 isotropic noise), and
    ``pointsource_noises/`` with a ``noise_list`` (2 noises); list paths start with
    ``RIRS_NOISES/`` as in the official lists.

    >>> import tempfile
    >>> rirs = write_rirs_noises(tempfile.mkdtemp())
    >>> (rirs / "simulated_rirs" / "smallroom" / "rir_list").read_text().split()[:4]
    ['--rir-id', 'smallroom-Room001-00001', '--room-id', 'smallroom-Room001']
    """
    from pathlib import Path

    rng = np.random.default_rng(seed)
    base = Path(root) / "RIRS_NOISES"
    for size, decay in (("smallroom", 300.0), ("mediumroom", 900.0)):
        lines = []
        for room in ("Room001", "Room002"):
            for k in (1, 2):
                rel = f"simulated_rirs/{size}/{room}/{room}-{k:05d}.wav"
                _write_wav(base / rel, _response(rng, int(rng.integers(1600, 4800)),
                                                 int(rng.integers(5, 60)), decay))
                lines.append(f"--rir-id {size}-{room}-{k:05d} --room-id {size}-{room} "
                             f"RIRS_NOISES/{rel}\n")
        (base / "simulated_rirs" / size / "rir_list").write_text("".join(lines))
    real = base / "real_rirs_isotropic_noises"
    lines = []
    for name in ("air_type1_air_binaural_lecture_0_1", "RVB2014_type1_rir_largeroom1_near_angla"):
        _write_wav(real / f"{name}.wav", _response(rng, 3200, 20, 600.0))
        lines.append(f"--rir-id {name} --room-id {name.split('_')[0]} "
                     f"RIRS_NOISES/real_rirs_isotropic_noises/{name}.wav\n")
    (real / "rir_list").write_text("".join(lines))
    _write_wav(real / "RVB2014_type1_noise_largeroom1_1.wav", rng.standard_normal(16000) * 0.05)
    (real / "noise_list").write_text(
        "--noise-id RVB2014_type1_noise_largeroom1_1 --noise-type isotropic --room-linkage "
        "RVB2014_type1_rir_largeroom1_near_angla "
        "RIRS_NOISES/real_rirs_isotropic_noises/RVB2014_type1_noise_largeroom1_1.wav\n")
    point = base / "pointsource_noises"
    lines = []
    for i, kind in enumerate(("background", "foreground"), 1):
        _write_wav(point / f"noise{i}.wav", rng.standard_normal(8000 * i) * 0.05)
        lines.append(f"--noise-id noise{i} --noise-type point-source --bg-fg-type {kind} "
                     f"RIRS_NOISES/pointsource_noises/noise{i}.wav\n")
    (point / "noise_list").write_text("".join(lines))
    return base


def sample_durations(corpus: str, n: int, seed: int = 0, *, usable_only: bool = False) -> np.ndarray:
    """``n`` durations (seconds) drawn from ``corpus``'s published percentiles.

    The percentile points are a piecewise-linear inverse CDF: draw ``u ~ U(0, 1)`` and
    interpolate, which keeps the skew and the cliffs (LibriSpeech training near 17.5 s,
    LJSpeech at 10.1 s). With ``usable_only``, durations outside the corpus's usual training
    range (:data:`USABLE_RANGE`) are redrawn.

    >>> d = sample_durations("librispeech-train-clean-100", 10_000)
    >>> round(float(np.median(d)), 1), bool(d.min() >= 1.4), bool(d.max() <= 24.5)
    (13.8, True, True)
    """
    if corpus not in DURATION_PERCENTILES:
        raise ValueError(f"unknown corpus {corpus!r}; known: {sorted(DURATION_PERCENTILES)}")
    q, v = map(np.asarray, zip(*DURATION_PERCENTILES[corpus]))
    rng = np.random.default_rng(seed)
    low, high = next((r for k, r in USABLE_RANGE.items() if corpus.startswith(k)),
                     (0.0, np.inf)) if usable_only else (0.0, np.inf)
    out = np.empty(0)
    while out.size < n:
        draw = np.interp(rng.random(2 * n), q, v)
        out = np.concatenate([out, draw[(draw >= low) & (draw <= high)]])
    return out[:n]


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Serves files; ``/__truncate__/<path>`` announces the full size but sends half and
    hangs up; ``/__status__/<code>`` answers with that status."""

    def log_message(self, format, *args):  # keep test output quiet
        pass

    def do_GET(self):
        if self.path.startswith("/__status__/"):
            code = int(self.path.rsplit("/", 1)[1])
            self.send_error(code)
            return
        if self.path.startswith("/__truncate__/"):
            path = self.translate_path(self.path[len("/__truncate__"):])
            with open(path, "rb") as f:
                data = f.read()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        super().do_GET()


@contextlib.contextmanager
def serve_directory(directory: str) -> Iterator[str]:
    """Serve ``directory`` over HTTP on 127.0.0.1 and yield the base URL (no trailing slash).

    >>> import tempfile, pathlib, urllib.request
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (d / "a.txt").write_bytes(b"hello")
    >>> with serve_directory(str(d)) as url:
    ...     with urllib.request.urlopen(url + "/a.txt") as r:
    ...         r.read()
    b'hello'
    """
    with serve_handler(functools.partial(_Handler, directory=str(directory))) as url:
        yield url


@contextlib.contextmanager
def serve_handler(handler: Callable[..., http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """Serve with ``handler`` (a request handler class) on 127.0.0.1 and yield the base URL;
    the server is shut down and closed on exit."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


_DEMO_DEV_CLEAN = os.path.join(os.path.dirname(__file__), "demo_data", "LibriSpeech", "dev-clean")


@functools.lru_cache(maxsize=8)
def _demo_speech(rate: int, files: int) -> np.ndarray:
    import soundfile
    import torch
    import torchaudio.functional

    paths = sorted(os.path.join(d, f) for d, _, names in os.walk(_DEMO_DEV_CLEAN)
                   for f in names if f.endswith(".flac"))[:files]
    speech = np.concatenate([soundfile.read(p, dtype="float32")[0] for p in paths])
    if rate != 16000:
        speech = torchaudio.functional.resample(torch.from_numpy(speech), 16000, rate).numpy()
    speech = 0.9 * speech / max(float(np.abs(speech).max()), 1e-9)  # no clipping after codecs
    speech.setflags(write=False)
    return speech


def demo_speech(rate: int = 16000, *, files: int = 2) -> np.ndarray:
    """The first ``files`` utterances of the demo corpus (16 kHz espeak speech, LibriSpeech's
    layout), joined, resampled to ``rate`` with :func:`torchaudio.functional.resample` and
    scaled to a peak of 0.9: a read-only float32 ``(samples,)`` array, cached.

    >>> speech = demo_speech(8000, files=1)
    >>> speech.dtype, speech.ndim, float(np.abs(speech).max())
    (dtype('float32'), 1, 0.8999999761581421)
    """
    return _demo_speech(int(rate), int(files))


def snr_db(reference: np.ndarray, decoded: np.ndarray) -> float:
    """Signal-to-noise ratio of ``decoded`` against ``reference`` in dB, over their common
    length (``inf`` when they are equal).

    >>> x = np.ones(100)
    >>> snr_db(x, x), round(snr_db(x, 1.1 * x), 1)
    (inf, 20.0)
    """
    n = min(len(reference), len(decoded))
    ref = np.asarray(reference[:n], dtype=np.float64)
    noise = float(np.sum((ref - np.asarray(decoded[:n], dtype=np.float64)) ** 2))
    return float("inf") if noise == 0 else float(10 * np.log10(np.sum(ref ** 2) / noise))


def on_pcm_grid(audio: np.ndarray, subtype: str) -> tuple[np.ndarray, np.ndarray]:
    """``(to_write, expected)`` for a bit-exact round trip of float ``audio`` through soundfile
    subtype ``PCM_16`` or ``PCM_24``: the integers to write (int16; for 24 bits int32 whose low
    byte is 0, as soundfile passes 24-bit PCM) and the float32 values soundfile reads back
    for them (integer / 2**15, / 2**31). Any other subtype (``FLOAT``, lossy codecs): the audio
    twice.

    >>> ints, expected = on_pcm_grid(np.array([0.5, -1.0], np.float32), "PCM_16")
    >>> ints, expected
    (array([ 16384, -32767], dtype=int16), array([ 0.5      , -0.9999695], dtype=float32))
    """
    if subtype == "PCM_16":
        ints = np.round(audio * 32767).astype(np.int16)
        return ints, ints.astype(np.float32) / 2 ** 15
    if subtype == "PCM_24":
        ints = np.round(audio * (2 ** 23 - 1)).astype(np.int32) << 8
        return ints, ints.astype(np.float32) / 2 ** 31
    return audio, audio


def cut_and_resume(make: Callable[[], Any], k: int,
                   summary: Callable[[Any], Any] = lambda batch: batch
                   ) -> tuple[list, list]:
    """``(uninterrupted, resumed)``: the summaries of one pass over a fresh ``make()`` loader,
    and of the first ``k`` batches of another followed by a third one that loaded the second's
    ``state_dict()`` (a speechpipe :class:`~speechpipe.loader.Loader`, a
    ``torchdata.nodes.Loader``...). Exact resume means the two lists are equal.

    >>> class Counter:  # a loader whose state is its position
    ...     def __init__(self): self.at = 0
    ...     def __iter__(self):
    ...         while self.at < 4:
    ...             self.at += 1
    ...             yield self.at
    ...     def state_dict(self): return {"at": self.at}
    ...     def load_state_dict(self, state): self.at = state["at"]
    >>> cut_and_resume(Counter, 2)
    ([1, 2, 3, 4], [1, 2, 3, 4])
    """
    uninterrupted = [summary(batch) for batch in make()]
    loader = make()
    it = iter(loader)
    head = [summary(next(it)) for _ in range(k)]
    state = loader.state_dict()
    again = make()
    again.load_state_dict(state)
    return uninterrupted, head + [summary(batch) for batch in again]
# --------------------------------------------------------------------------------------------
# A local S3 server (moto) and a fault-injecting proxy
# --------------------------------------------------------------------------------------------

#: Made-up credentials the local S3 server accepts (s3fs's ``key``/``secret``).
S3_TEST_CREDENTIALS = {"key": "speechpipe-test-key-id", "secret": "speechpipe-test-secret-key"}


def s3_test_storage(endpoint: str) -> dict:
    """s3fs storage options for the local server at ``endpoint``: its credentials, and
    botocore's own retries off (so that the retries a test counts are speechpipe's)."""
    return {"endpoint_url": endpoint, **S3_TEST_CREDENTIALS,
            "config_kwargs": {"retries": {"total_max_attempts": 1}}}


@contextlib.contextmanager
def serve_s3() -> Iterator[str]:
    """Run moto's S3 server on 127.0.0.1 (a free port) and yield its endpoint URL.

    moto keeps its buckets per process: servers started in one process share them, so give
    each test its own bucket. Storage options for it: ``{"endpoint_url": url,
    **S3_TEST_CREDENTIALS}``.
    """
    import logging

    from moto.server import ThreadedMotoServer

    log = logging.getLogger("werkzeug")  # moto's server logs every request there
    level = log.level
    log.setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()
        log.setLevel(level)


def upload_folder(endpoint_url: str, folder: str, bucket: str, prefix: str = "") -> str:
    """Upload every file of ``folder`` (not recursive) to ``s3://bucket/prefix/`` on the
    server at ``endpoint_url`` (the bucket is created if needed); return that folder URL."""
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint_url, region_name="us-east-1",
                          aws_access_key_id=S3_TEST_CREDENTIALS["key"],
                          aws_secret_access_key=S3_TEST_CREDENTIALS["secret"])
    try:
        if bucket not in {b["Name"] for b in client.list_buckets().get("Buckets", [])}:
            client.create_bucket(Bucket=bucket)
        prefix = prefix.strip("/")
        for name in sorted(os.listdir(folder)):
            path = os.path.join(folder, name)
            if os.path.isfile(path):
                client.upload_file(path, bucket, f"{prefix}/{name}" if prefix else name)
    finally:
        client.close()
    return f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"


@dataclass
class _Fault:
    kind: str  # "status", "drop", "short" or "delay"
    match: str  # a substring of "<path> <Range header>"
    times: int  # how many requests it applies to (-1: all)
    value: float  # the status, the body bytes sent, or the seconds


class _ProxyHandler(http.server.BaseHTTPRequestHandler):
    """Forwards each request to the upstream server, applying the proxy's faults."""

    def log_message(self, format, *args):
        pass

    def handle(self):
        with contextlib.suppress(ConnectionError, TimeoutError):  # a client that gave up
            super().handle()

    def _forward(self):
        proxy: FaultProxy = self.server.proxy
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        fault = proxy._take_fault(self.command, f"{self.path} {self.headers.get('Range')}")
        proxy.requests.append((self.command, self.path, self.headers.get("Range"),
                               fault.kind if fault else None))
        if fault is not None and fault.kind == "delay":
            time.sleep(fault.value)
        if fault is not None and fault.kind == "status":
            self.send_response(int(fault.value))
            code = {500: "InternalError", 503: "ServiceUnavailable"}.get(int(fault.value),
                                                                         "Injected")
            payload = (f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code>"
                       "<Message>injected fault</Message></Error>").encode()
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        upstream = http.client.HTTPConnection(proxy.upstream_host, proxy.upstream_port,
                                              timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
            upstream.request(self.command, self.path, body=body or None, headers=headers)
            response = upstream.getresponse()
            data = response.read()
            self.send_response(response.status)
            if fault is not None and fault.kind == "short":
                data = data[: int(fault.value)]  # a short body that says it is complete
            length = (response.getheader("Content-Length", "0") if self.command == "HEAD"
                      else str(len(data)))
            for key, value in response.getheaders():
                if key.lower() not in ("connection", "transfer-encoding", "content-length",
                                       "content-range", "server", "date"):
                    self.send_header(key, value)
            self.send_header("Content-Length", length)
            self.end_headers()
            if fault is not None and fault.kind == "drop":
                self.wfile.write(data[: int(fault.value)])  # then hang up mid-body
                self.wfile.flush()
                self.close_connection = True
                return
            if self.command != "HEAD":
                self.wfile.write(data)
        finally:
            upstream.close()

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward


class FaultProxy:
    """An HTTP proxy on 127.0.0.1 in front of ``upstream`` (e.g. :func:`serve_s3`'s URL) that
    injects faults into the requests whose path contains ``match`` (object ``GET`` requests
    only; ``HEAD`` and listings pass; ``match`` is looked for in ``"<path> <Range header>"``,
    e.g. ``"data-00001.tar bytes=65536-"``). Use as a context manager; :attr:`url` is the
    endpoint to give clients; :attr:`requests` records ``(method, path, Range, fault)``.

    - :meth:`fail`: answer ``status`` (e.g. 503, S3's ``ServiceUnavailable``) instead of
      forwarding;
    - :meth:`drop`: forward, announce the full ``Content-Length``, send ``after`` bytes of the
      body and hang up;
    - :meth:`short`: forward only the first ``size`` bytes of the body, as if complete;
    - :meth:`delay`: wait ``seconds`` before forwarding.

    ``times`` requests get the fault (``-1``: every one until :meth:`clear`).
    """

    def __init__(self, upstream: str) -> None:
        host_port = upstream.split("://", 1)[-1].rstrip("/")
        host, _, port = host_port.partition(":")
        self.upstream_host, self.upstream_port = host, int(port or 80)
        self.requests: list[tuple[str, str, str | None, str | None]] = []
        self._faults: list[_Fault] = []
        self._lock = threading.Lock()
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    def fail(self, status: int = 503, *, match: str = "", times: int = 1) -> "FaultProxy":
        return self._add(_Fault("status", match, times, status))

    def drop(self, after: int, *, match: str = "", times: int = 1) -> "FaultProxy":
        return self._add(_Fault("drop", match, times, after))

    def short(self, size: int, *, match: str = "", times: int = 1) -> "FaultProxy":
        return self._add(_Fault("short", match, times, size))

    def delay(self, seconds: float, *, match: str = "", times: int = 1) -> "FaultProxy":
        return self._add(_Fault("delay", match, times, seconds))

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()
            self.requests.clear()

    def _add(self, fault: _Fault) -> "FaultProxy":
        with self._lock:
            self._faults.append(fault)
        return self

    def _take_fault(self, method: str, request: str) -> _Fault | None:
        path = request.split(" ", 1)[0]
        if method != "GET" or "list-type=" in path or path.rstrip("/").count("/") < 2:
            return None
        with self._lock:
            for fault in self._faults:
                if fault.times != 0 and fault.match in request:
                    fault.times -= fault.times > 0
                    return fault
        return None

    def __enter__(self) -> "FaultProxy":
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ProxyHandler)
        server.daemon_threads = True
        server.proxy = self
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{server.server_address[1]}"
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def batch_digest(batch: dict, size: int = 16) -> str:
    """A batch's keys and every tensor's name, dtype, shape and bytes, hashed (sha256, the
    first ``size`` hex digits): equal only for byte-identical batches.

    >>> import torch
    >>> a = {"key": ["u1"], "x": torch.zeros(2)}
    >>> batch_digest(a) == batch_digest({"key": ["u1"], "x": torch.zeros(2)})
    True
    >>> len(batch_digest(a, 20))
    20
    >>> batch_digest(a) == batch_digest({"key": ["u1"], "x": torch.zeros(2, dtype=torch.float64)})
    False
    """
    h = hashlib.sha256(json.dumps(list(batch["key"])).encode())
    for name in sorted(batch):
        value = batch[name]
        if hasattr(value, "numpy"):
            h.update(f"{name}{value.dtype}{tuple(value.shape)}".encode())
            h.update(value.numpy().tobytes())
    return h.hexdigest()[:size]


def join_rank_group(timeout: float = 120.0) -> tuple[int, int, Any, str]:
    """In a script that :func:`run_ranks` started: join its gloo group and return ``(rank,
    world, ctx, out)`` -- this rank, the world size, the ``ctx`` given to ``run_ranks`` and the
    path to write this rank's JSON result to. Warnings are ignored (the rank's log is read only
    when it fails); ``timeout`` seconds bound each collective.

    Use: ``if __name__ == "__main__": main(*join_rank_group())``.
    """
    import warnings
    from datetime import timedelta

    import torch.distributed as dist

    rank, world, port, ctx_path, out = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]),
                                        sys.argv[4], sys.argv[5])
    warnings.simplefilter("ignore")
    with open(ctx_path) as f:
        ctx = json.load(f)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=timeout))
    return rank, world, ctx, out


def run_ranks(script: str, world: int, ctx: Any, folder: str, tag: str, *, timeout: float,
              env: dict | None = None, expect_exit: dict | None = None) -> list:
    """Run a gloo group of ``world`` processes, ``python script RANK WORLD PORT CTX OUT`` (the
    rendezvous on a free port of 127.0.0.1, ``ctx`` written as JSON to ``CTX``), and return
    each rank's result, the JSON it wrote to ``OUT``. Files are
    ``folder/{ctx,rankR}-{tag}.{json,log}``. Every process is killed when ``timeout`` seconds
    have passed (an ``AssertionError`` then says a rank hung: never a hang); a rank exiting
    with another status than ``expect_exit.get(rank, 0)`` is an ``AssertionError`` with the
    end of its log."""
    ctx_path = os.path.join(folder, f"ctx-{tag}.json")
    with open(ctx_path, "w") as f:
        json.dump(ctx, f)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, GLOO_SOCKET_IFNAME=os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
               PYTHONWARNINGS="ignore", **(env or {}))
    outs = [os.path.join(folder, f"rank{r}-{tag}.json") for r in range(world)]
    log_paths = [os.path.join(folder, f"rank{r}-{tag}.log") for r in range(world)]
    logs = [open(path, "w") for path in log_paths]
    procs = [subprocess.Popen([sys.executable, script, str(r), str(world), str(port),
                               ctx_path, outs[r]], env=env, stdout=logs[r],
                              stderr=subprocess.STDOUT) for r in range(world)]
    deadline = time.monotonic() + timeout
    try:
        for proc in procs:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
        raise AssertionError(f"a rank hung: killed after {timeout} s; logs in {folder}")
    finally:
        for proc in procs:
            proc.wait()
        for log in logs:
            log.close()
    expect_exit = expect_exit or {}
    for r, proc in enumerate(procs):
        if proc.returncode != expect_exit.get(r, 0):
            with open(log_paths[r]) as f:
                raise AssertionError(f"rank {r} exited with {proc.returncode}:\n"
                                     f"{f.read()[-3000:]}")
    results = []
    for path in outs:
        with open(path) as f:
            results.append(json.load(f))
    return results


def pack_digest(folder: str | os.PathLike) -> str:
    """sha256 over every file under ``folder`` (relative names and bytes) but the indexes'
    mapped tables (``*.spmap``): a cache of the index beside it that records the index's size
    and modification time (as a ``.pyc`` records its source's), so that two runs' tables differ
    in those bytes. What two packs hold, compared byte for byte."""
    digest = hashlib.sha256()
    for root, _, files in sorted(os.walk(folder)):
        for name in sorted(files):
            if name.endswith(".spmap"):
                continue
            path = os.path.join(root, name)
            digest.update(os.path.relpath(path, folder).encode() + b"\0")
            with open(path, "rb") as f:
                digest.update(f.read())
    return digest.hexdigest()
