"""Trust boundaries (issue 34): what a URL's credentials, a pre-placed file or a slow server
can make speechpipe show, store or wait for.

Invariants:
- credentials in a URL (a password in its userinfo, the signing parameters of a presigned URL)
  are never shown or stored: errors, ``.completed`` files, skip reports, loader states;
- a checkpoint names shards without their signatures, and a resume with freshly signed URLs
  for the same objects continues exactly.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import speechpipe as sp
from speechpipe.loader import PipeDataset
from speechpipe.testing import serve_directory, serve_handler

SECRET = "wJalrXUtnFEMIK7MDENGbPxRfiCYSECRET"
PASSWORD = "hunter2-PASSWORD"


def signed(url: str, secret: str = SECRET, date: str = "20261127T120000Z") -> str:
    """A presigned-looking S3 URL (the server here ignores the query)."""
    return (f"{url}?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAEXAMPLE%2F{secret}"
            f"&X-Amz-Date={date}&X-Amz-Expires=3600&X-Amz-SignedHeaders=host"
            f"&X-Amz-Signature={secret}&X-Amz-Security-Token={secret}")


def assert_clean(text: str) -> None:
    assert SECRET not in text and PASSWORD not in text, text


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    with sp.ShardWriter(str(root / "data-%05d.tar"), maxcount=10) as writer:
        for i in range(60):
            writer.write({"key": f"u{i:03d}", "txt": f"text {i}",
                          "feats.npy": np.full((3, 2), i, np.float32)})
    return root, [os.path.basename(p) for p in writer.paths]


# --------------------------------------------------------------------------------------------
# item 3: credentials in URLs
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, shown", [
    ("https://alice:hunter2@host/a.tar", "https://alice:***@host/a.tar"),
    ("https://ghp_TOKEN@host/a.tar", "https://***@host/a.tar"),
    ("s3://b/a.tar?versionId=7&X-Amz-Signature=abc",
     "s3://b/a.tar?versionId=7&X-Amz-Signature=***"),
    ("https://acct.blob.core.windows.net/c/a.tar?sv=2022&sig=abc%3D&se=2026",
     "https://acct.blob.core.windows.net/c/a.tar?sv=2022&sig=***&se=***"),
    ("https://cdn/a.tar?Expires=1&Signature=x&Key-Pair-Id=K",
     "https://cdn/a.tar?Expires=***&Signature=***&Key-Pair-Id=***"),
    ("data/a.tar", "data/a.tar"),
])
def test_redact_hides_userinfo_passwords_and_signing_parameters(text, shown):
    from speechpipe.errors import redact
    assert redact(text) == shown


def test_open_errors_do_not_show_credentials(shards):
    root, _ = shards
    with serve_directory(str(root)) as base:
        host = base[len("http://"):]
        for url in (signed(f"{base}/absent.tar"), f"http://bob:{PASSWORD}@{host}/absent.tar"):
            with pytest.raises(sp.MissingDataError) as info:
                list(sp.IterableWrapper([url]).open(timeout=5))
            assert_clean(str(info.value))
            assert "HTTP 404" in str(info.value)


def test_userinfo_becomes_basic_auth_and_the_shard_reads(shards):
    import base64
    import http.server
    root, names = shards
    seen = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(root), **kwargs)

        def do_GET(self):
            seen.append(self.headers.get("Authorization"))
            super().do_GET()

        def log_message(self, *args):
            pass

    with serve_handler(Handler) as base:
        url = base.replace("http://", f"http://bob:{PASSWORD}@") + f"/{names[0]}"
        samples = list(sp.IterableWrapper([url]).sharded_shuffle(buffer_size=1))
    assert len(samples) == 10
    assert seen == ["Basic " + base64.b64encode(f"bob:{PASSWORD}".encode()).decode()]
    for sample in samples:
        assert_clean(sample["source"])
        assert sample["source"].startswith("http://bob:***@127.0.0.1:")


def test_skip_reports_do_not_show_credentials(shards, tmp_path):
    root, names = shards
    with serve_directory(str(root)) as base:
        urls = [signed(f"{base}/{names[0]}"), signed(f"{base}/absent-00009.tar")]
        pipe = sp.IterableWrapper(urls).sharded_shuffle(buffer_size=1, on_error="skip")
        with pytest.warns(sp.SkippedInputWarning) as warned:
            assert len(list(pipe)) == 10
    assert pipe.diagnostics.total == 1
    assert_clean(pipe.diagnostics.report())
    assert_clean(sp.pipeline_report(pipe))
    assert "X-Amz-Signature=***" in pipe.diagnostics.report()
    for w in warned:
        assert_clean(str(w.message))


def test_a_checkpoint_holds_no_credentials_and_resumes_with_freshly_signed_urls(shards):
    root, names = shards

    def make(urls):
        return sp.IterableWrapper(urls).sharded_shuffle(buffer_size=8, seed=1).decode()

    with serve_directory(str(root)) as base:
        first = [signed(f"{base}/{n}") for n in names]
        full = [s["key"] for s in PipeDataset(make(first))]
        dataset = PipeDataset(make(first))
        it = iter(dataset)
        head = [next(it)["key"] for _ in range(23)]
        state = dataset.state_dict()
        it.close()
        text = json.dumps(state, default=repr)
        assert_clean(text)
        assert "X-Amz-Signature=***" in text  # the shards are named, without signatures
        # a day later: the same objects, signed again with other credentials
        again_urls = [signed(f"{base}/{n}", secret="OTHERsignature0000", date="20261128T0900Z")
                      for n in names]
        again = PipeDataset(make(again_urls))
        again.load_state_dict(state)
        rest = [s["key"] for s in again]
    assert head + rest == full and len(full) == 60


def test_download_keeps_credentials_out_of_its_errors_and_completed_file(tmp_path):
    import tarfile
    src = tmp_path / "src"
    (src / "corpus").mkdir(parents=True)
    (src / "corpus" / "a.txt").write_text("a")
    with tarfile.open(tmp_path / "srv.tar.gz", "w:gz") as tar:
        tar.add(src / "corpus", arcname="corpus")
    served = tmp_path / "served"
    served.mkdir()
    os.replace(tmp_path / "srv.tar.gz", served / "corpus.tar.gz")
    from speechpipe.recipes._download import download_and_extract
    with serve_directory(str(served)) as base:
        host = base[len("http://"):]
        with pytest.raises(sp.MissingDataError) as info:
            download_and_extract(f"http://bob:{PASSWORD}@{host}/absent.tar.gz", tmp_path / "x",
                                 progress=False)
        assert_clean(str(info.value))
        with pytest.raises(sp.MissingDataError) as info:
            download_and_extract(signed(f"{base}/absent.tar.gz"), tmp_path / "x",
                                 progress=False)
        assert_clean(str(info.value))
        out = download_and_extract(signed(f"http://bob:{PASSWORD}@{host}/corpus.tar.gz"),
                                   tmp_path / "y", progress=False)
    assert (out / "corpus" / "a.txt").read_text() == "a"
    completed = (out / ".corpus.tar.gz.completed").read_text()
    assert_clean(completed)
    assert json.loads(completed)["url"].startswith("http://bob:***@127.0.0.1:")


# --------------------------------------------------------------------------------------------
# item 10: a pre-placed symbolic link where the download writes
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("placed", ["corpus.tar.gz.part", "corpus.tar.gz"])
def test_download_refuses_a_pre_placed_symlink_and_leaves_its_target(tmp_path, placed):
    served = tmp_path / "served"
    served.mkdir()
    (served / "corpus.tar.gz").write_bytes(b"\x1f\x8b not really")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    target = tmp_path / "target"
    target.mkdir()
    (target / placed).symlink_to(victim)
    from speechpipe.recipes._download import download_and_extract
    with serve_directory(str(served)) as base:
        with pytest.raises(sp.UnsafeInputError) as info:
            download_and_extract(f"{base}/corpus.tar.gz", target, progress=False)
    assert str(info.value) == (f"{target / placed}: is a symbolic link (to {str(victim)!r}); "
                               "the download writes here and never follows links: remove it "
                               "and run again")
    assert victim.read_text() == "precious"


def test_the_part_file_is_opened_without_following_links(tmp_path):
    # The check before the transfer and the open are two steps: the open itself refuses too.
    from speechpipe.recipes._download import _open_no_follow
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (tmp_path / "a.part").symlink_to(victim)
    with pytest.raises(sp.UnsafeInputError, match="is a symbolic link"):
        _open_no_follow(tmp_path / "a.part", "ab")
    assert victim.read_text() == "precious"


# --------------------------------------------------------------------------------------------
# item 9: an overall deadline per HTTP transfer, not only per socket read
# --------------------------------------------------------------------------------------------

@pytest.fixture
def dripping_server():
    """An HTTP server on 127.0.0.1 announcing 20 KB and sending one byte every 0.5 s: never
    silent long enough for a socket timeout."""
    import http.server
    import threading
    stop = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "20000")
            self.end_headers()
            for _ in range(20000):
                if stop.wait(0.5):
                    return
                try:
                    self.wfile.write(b"x")
                    self.wfile.flush()
                except OSError:
                    return

        def log_message(self, *args):
            pass

    with serve_handler(Handler) as base:
        try:
            yield base
        finally:
            stop.set()  # the drip loops end before the server shuts down


def test_a_dripping_http_server_is_timed_out(dripping_server):
    import time
    url = f"{dripping_server}/data-00000.tar"
    start = time.monotonic()
    with pytest.raises(sp.DataError, match=r"stalled or far too slow") as info:
        for _, stream in sp.IterableWrapper([url]).open(timeout=2):
            stream.read()
    assert time.monotonic() - start < 10
    assert str(info.value).startswith(f"{url}: the server sent ")


def test_a_dripping_http_server_is_timed_out_in_download(dripping_server, tmp_path):
    import time
    from speechpipe.recipes._download import download_and_extract
    start = time.monotonic()
    with pytest.raises(sp.DataError, match=r"stalled or far too slow.*the partial file .*"
                                           r"corpus.tar.gz.part is kept"):
        download_and_extract(f"{dripping_server}/corpus.tar.gz", tmp_path, timeout=2,
                             progress=False)
    assert time.monotonic() - start < 10


# --------------------------------------------------------------------------------------------
# item 12: messages that sent you the wrong way
# --------------------------------------------------------------------------------------------

def test_a_seed_change_on_resume_says_the_order_differs_not_equal_counts(shards):
    root, names = shards
    paths = [str(root / n) for n in names]
    dataset = PipeDataset(sp.IterableWrapper(paths).sharded_shuffle(buffer_size=4, seed=1))
    it = iter(dataset)
    for _ in range(25):
        next(it)
    state = dataset.state_dict()
    it.close()
    again = PipeDataset(sp.IterableWrapper(paths).sharded_shuffle(buffer_size=4, seed=2))
    again.load_state_dict(state)
    with pytest.raises(sp.DataError) as info:
        list(again)
    message = str(info.value)
    assert "but the state was saved reading" in message
    assert "reads 6 shards this epoch but the state was saved reading 6" not in message
    assert "the shard order differs (the seed, the shard list" in message


def test_an_error_without_a_place_does_not_say_unknown_input():
    assert str(sp.DataError("resume: nothing to resume")) == "resume: nothing to resume"
    assert str(sp.MissingDataError("no such thing")) == "no such thing"


def test_a_dead_servers_503s_are_not_filed_under_corrupt_shard(shards):
    import http.server

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_error(503, "Slow Down")

        def log_message(self, *args):
            pass

    with serve_handler(Handler) as base:
        pipe = sp.IterableWrapper([f"{base}/data-00000.tar"]).sharded_shuffle(
            buffer_size=1, on_error="skip")
        with pytest.warns(sp.SkippedInputWarning):
            assert list(pipe) == []
    assert dict(pipe.diagnostics.counts) == {
        "unreachable shard: server errors or timeouts (rest of the shard skipped)": 1}


def test_an_http_timeout_is_not_a_missing_file():
    import socket
    import time
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)  # connections complete in the backlog; nothing is ever answered
    try:
        url = f"http://127.0.0.1:{server.getsockname()[1]}/data-00000.tar"
        started = time.monotonic()
        with pytest.raises(sp.DataError) as info:
            list(sp.IterableWrapper([url]).open(timeout=1))
        assert not isinstance(info.value, sp.MissingDataError)
        assert str(info.value) == (f"{url}: no answer within the 1 s timeout: the server is "
                                   "down or overloaded (not a missing file)")
        assert time.monotonic() - started < 10
    finally:
        server.close()


def test_headers_dripped_a_byte_at_a_time_are_timed_out_too():
    # Issue 34, item 9: urllib's timeout bounds each socket read, so a server sending its
    # status line and headers a byte now and then held open() forever.
    import socket
    import threading
    import time
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    stop = threading.Event()

    def drip():
        conn, _ = server.accept()
        with conn:
            for byte in b"HTTP/1.0 200 OK\r\nX-Slow: " + b"x" * 10_000:
                if stop.wait(0.3):
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return

    thread = threading.Thread(target=drip, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.getsockname()[1]}/data-00000.tar"
        started = time.monotonic()
        with pytest.raises(sp.DataError, match="no answer within the 2 s timeout"):
            list(sp.IterableWrapper([url]).open(timeout=2))
        assert time.monotonic() - started < 10
    finally:
        stop.set()
        server.close()


def test_the_loaders_state_dict_holds_no_credentials(shards):
    from speechpipe.loader import build_loader
    root, names = shards
    with serve_directory(str(root)) as base:
        urls = [signed(f"{base}/{n}") for n in names]
        pipe = (sp.IterableWrapper(urls).sharded_shuffle(buffer_size=8, seed=1).decode()
                .block_batch(sp.PaddedArea(6)).collate())
        loader = build_loader(pipe, num_workers=1, seed=0, snapshot_every=1)
        it = iter(loader)
        for _ in range(5):
            next(it)
        state = loader.state_dict()
        del it
    text = repr(state)
    assert_clean(text)
    assert "X-Amz-Signature=***" in text
