"""Fixture factories shared by the tests, the benchmarks and users' own tests.

- :func:`serve_directory`: a real HTTP server on 127.0.0.1 serving a folder, with two
  fault-injection paths for testing remote reads.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import threading
from typing import Iterator

__all__ = ["serve_directory"]


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
    handler = functools.partial(_Handler, directory=str(directory))
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
