"""`littlelm eval-bundle` against a local HTTP server: retries, resume, and failures that keep data.

The server runs in a thread on 127.0.0.1; nothing here touches the internet.
"""

from __future__ import annotations

import hashlib
import io
import random
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conftest import make_task_dir
from littlelm.cli import main
from littlelm.eval import bundle
from littlelm.eval.bundle import download_bundle, fetch, part_path


def bundle_zip(tmp_path) -> bytes:
    """A bundle of a few chunks: task files plus 400 kB of random bytes (incompressible)."""
    tasks = make_task_dir(tmp_path / "src", items=50)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for p in sorted(tasks.glob("*.jsonl")):
            zf.writestr(f"eval_bundle/eval_data/{p.name}", p.read_text())
        zf.writestr("eval_bundle/filler.bin", random.Random(0).randbytes(400_000))
    assert len(buf.getvalue()) > 4 * bundle.CHUNK
    return buf.getvalue()


def resumed_from(ranges: list) -> int:
    """The byte the second request asked to resume from (bytes kept from the cut transfer)."""
    assert ranges[0] is None and ranges[1].startswith("bytes=") and ranges[1].endswith("-")
    return int(ranges[1][6:-1])


class Handler(BaseHTTPRequestHandler):
    """Serves `server.payload`; each request takes the next behaviour from `server.plan`."""

    def do_GET(self):
        srv = self.server
        srv.ranges.append(self.headers.get("Range"))
        how = srv.plan.pop(0) if srv.plan else srv.default
        data = srv.payload
        start = int(self.headers["Range"][6:-1]) if self.headers.get("Range") else 0
        if how == "503":
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if start >= len(data):
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{len(data)}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(206 if start else 200)
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.send_header("Content-Length", str(len(data) - start))
        self.end_headers()
        if how == "cut":  # announce everything, send 40%, hang up
            self.wfile.write(data[start : start + int(0.4 * len(data))])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(data[start:])

    def log_message(self, *args):
        pass


@pytest.fixture
def server(tmp_path, monkeypatch):
    monkeypatch.setattr(bundle, "BACKOFF", 0.0)  # retry at once: the test is about what happens
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.payload, srv.plan, srv.default, srv.ranges = bundle_zip(tmp_path), [], "ok", []
    srv.url = f"http://127.0.0.1:{srv.server_address[1]}/eval_bundle.zip"
    srv.sha = hashlib.sha256(srv.payload).hexdigest()
    thread = threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_transient_503_is_retried(server, tmp_path):
    server.plan = ["503", "503"]
    dest = tmp_path / "eb"
    assert download_bundle(dest, server.url, server.sha, log=lambda m: None) == dest
    assert server.ranges == [None, None, None]  # two 503s, then the file
    assert (dest / "eval_data" / "mc.jsonl").read_text() == (
        tmp_path / "src" / "mc.jsonl"
    ).read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eb", "src"]  # no .part left


def test_a_cut_download_resumes_with_a_range_request(server, tmp_path):
    server.plan = ["cut"]
    part = tmp_path / "x.part"
    fetch(server.url, part)
    # what was written before the cut (whole chunks) is kept, and asked for no more
    kept = resumed_from(server.ranges)
    assert 0 < kept <= 0.4 * len(server.payload) and len(server.ranges) == 2
    assert part.read_bytes() == server.payload
    # and through download_bundle, which then checks the sha256 of the joined file
    server.plan, server.ranges = ["cut"], []
    dest = tmp_path / "eb"
    download_bundle(dest, server.url, server.sha, log=lambda m: None)
    assert resumed_from(server.ranges) == kept and len(server.ranges) == 2
    assert (dest / "eval_data").is_dir() and not part_path(dest, server.url).exists()


def test_a_failing_server_keeps_the_part_for_the_next_run(server, tmp_path, capsys):
    server.plan, server.default = ["cut"], "503"
    dest = tmp_path / "eb"
    args = ["eval-bundle", "--dest", str(dest), "--url", server.url, "--sha256", server.sha]
    assert main(args) == 2
    err = capsys.readouterr().err
    part = part_path(dest, server.url)
    kept = resumed_from(server.ranges)
    assert err.startswith(f"error: could not download {server.url}: HTTP 503")
    assert f"{kept:,} bytes are kept in {part}" in err and "run the command again" in err
    assert "Traceback" not in err and not dest.exists()
    assert part.read_bytes() == server.payload[:kept]
    # urllib3 asked again: the cut, then 1 + RETRIES answers of 503 to the resume
    assert server.ranges == [None] + [f"bytes={kept}-"] * (1 + bundle.RETRIES)
    server.default, server.ranges = "ok", []
    assert main(args) == 0
    assert server.ranges == [f"bytes={kept}-"] and "resuming" in capsys.readouterr().out
    assert (dest / "eval_data" / "lm.jsonl").is_file() and not part.exists()


def test_a_complete_part_is_not_fetched_again_and_a_wrong_one_is_deleted(server, tmp_path):
    dest = tmp_path / "eb"
    part = part_path(dest, server.url)
    part.write_bytes(server.payload)
    download_bundle(dest, server.url, server.sha, log=lambda m: None)
    assert server.ranges == [f"bytes={len(server.payload)}-"]  # answered 416: nothing left
    part.write_bytes(b"x" * 100)  # a part that does not continue into this file
    with pytest.raises(Exception, match="does not match the expected"):
        download_bundle(dest, server.url, server.sha, force=True, log=lambda m: None)
    assert not part.exists()  # resuming a wrong file cannot fix it
