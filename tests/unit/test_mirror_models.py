"""rigkit/mirror/models.py (the read-only resolve/ mirror) and `bin/rigkit mirror` (detached start/stop)."""

from __future__ import annotations

import hashlib
import http.client
import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ansible.module_utils.fetch.model import FetchOptions, fetch_model

from rigkit.mirror.files import open_served_file, url_parts
from rigkit.mirror.models import MirrorError, ModelMirror
from rigkit.sandbox.tiny_gemma4 import write_arch_gguf

REPO = Path(__file__).resolve().parents[2]
RIGKIT = [sys.executable, str(REPO / "bin" / "rigkit")]
REV = "0123456789abcdef0123456789abcdef01234567"
OWNER_REPO = "rigkit-test/mirror-GGUF"
MiB = 1024 * 1024


def url_of(filename: str) -> str:
    return f"/{OWNER_REPO}/resolve/{REV}/{filename}"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A resolve/ layout with a model, a nested model, and things the mirror must never serve."""
    root = tmp_path / "root"
    rev = root / OWNER_REPO / "resolve" / REV
    (rev / "MTP").mkdir(parents=True)
    (rev / "model.gguf").write_bytes(os.urandom(3 * MiB + 123))
    (rev / "MTP" / "drafter.gguf").write_bytes(os.urandom(4096))
    (rev / "model.gguf.part").write_bytes(b"half a download")
    (rev / ".rigkit-verified").mkdir()
    (rev / ".rigkit-verified" / "model.gguf.json").write_text("{}")
    secret = tmp_path / "outside.txt"
    secret.write_text("not for the LAN")
    (rev / "escape.gguf").symlink_to(secret)
    (rev / "inside.gguf").symlink_to(rev / "MTP" / "drafter.gguf")
    (tmp_path / "root-sibling").mkdir()
    return root


@pytest.fixture
def mirror(tree: Path) -> Iterator[ModelMirror]:
    with ModelMirror(tree) as server:
        yield server


def request(
    mirror: ModelMirror, path: str, *, method: str = "GET", headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    """One raw request (the path is sent exactly as given: no client-side normalisation)."""
    conn = http.client.HTTPConnection("127.0.0.1", mirror.port, timeout=10)
    try:
        conn.request(method, path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def model_bytes(tree: Path, name: str = "model.gguf") -> bytes:
    return (tree / OWNER_REPO / "resolve" / REV / name).read_bytes()


# ------------------------------------------------------------------------------------------ GET / HEAD / Range
def test_get_whole_file(mirror: ModelMirror, tree: Path) -> None:
    status, headers, body = request(mirror, url_of("model.gguf"))
    assert status == 200
    assert body == model_bytes(tree)
    assert headers["Content-Length"] == str(len(body))
    assert headers["Accept-Ranges"] == "bytes"
    assert headers["Content-Type"] == "application/octet-stream"


def test_nested_file_served_but_no_symlink_followed(mirror: ModelMirror, tree: Path) -> None:
    assert request(mirror, url_of("MTP/drafter.gguf"))[2] == model_bytes(tree, "MTP/drafter.gguf")
    assert request(mirror, url_of("inside.gguf"))[0] == 404  # even to a file the mirror would serve


@pytest.mark.parametrize(
    ("header", "start", "end"),
    [
        ("bytes=100-199", 100, 200),
        ("bytes=1048576-", MiB, None),
        ("bytes=-1000", -1000, None),
        ("bytes=5-4000000000", 5, None),
    ],
)
def test_single_range(mirror: ModelMirror, tree: Path, header: str, start: int, end: int | None) -> None:
    data = model_bytes(tree)
    status, headers, body = request(mirror, url_of("model.gguf"), headers={"Range": header})
    want = data[start:end]
    first = start % len(data)
    assert status == 206
    assert body == want
    assert headers["Content-Length"] == str(len(want))
    assert headers["Content-Range"] == f"bytes {first}-{first + len(want) - 1}/{len(data)}"


@pytest.mark.parametrize("header", ["bytes=99999999-", "bytes=-0"])
def test_unsatisfiable_range_answers_416(mirror: ModelMirror, tree: Path, header: str) -> None:
    status, headers, _ = request(mirror, url_of("model.gguf"), headers={"Range": header})
    assert status == 416
    assert headers["Content-Range"] == f"bytes */{len(model_bytes(tree))}"


@pytest.mark.parametrize("header", ["bytes=0-10,20-30", "items=0-10", "bytes=10-5", "bytes=-"])
def test_multi_or_malformed_range_sends_the_whole_file(mirror: ModelMirror, tree: Path, header: str) -> None:
    status, _, body = request(mirror, url_of("model.gguf"), headers={"Range": header})
    assert (status, body) == (200, model_bytes(tree))


def test_head_has_headers_and_no_body(mirror: ModelMirror, tree: Path) -> None:
    status, headers, body = request(mirror, url_of("model.gguf"), method="HEAD")
    assert (status, body) == (200, b"")
    assert headers["Content-Length"] == str(len(model_bytes(tree)))
    status, headers, body = request(mirror, url_of("model.gguf"), method="HEAD", headers={"Range": "bytes=0-9"})
    assert (status, headers["Content-Range"], body) == (206, f"bytes 0-9/{len(model_bytes(tree))}", b"")
    counters = mirror.stats()["files"][url_of("model.gguf")]
    assert (counters["head"], counters["requests"], counters["bytes"]) == (2, 0, 0)


def test_read_only(mirror: ModelMirror) -> None:
    for method in ("POST", "PUT", "DELETE"):
        status, headers, _ = request(mirror, url_of("model.gguf"), method=method)
        assert status == 405 and headers["Allow"] == "GET, HEAD"


# ------------------------------------------------------------------------------------------ what is never served
@pytest.mark.parametrize(
    "path",
    [
        f"/{OWNER_REPO}/resolve/{REV}/../../../../outside.txt",
        f"/{OWNER_REPO}/resolve/{REV}/%2e%2e/%2e%2e/%2e%2e/%2e%2e/outside.txt",
        f"/{OWNER_REPO}/resolve/{REV}/..%2f..%2f..%2f..%2foutside.txt",
        f"/{OWNER_REPO}/resolve/{REV}/escape.gguf",  # a symlink out of the root
        f"/{OWNER_REPO}/resolve/{REV}/model.gguf.part",  # a download in progress
        f"/{OWNER_REPO}/resolve/{REV}/.rigkit-verified/model.gguf.json",  # hidden components
        f"/{OWNER_REPO}/resolve/{REV}/MTP",  # a directory: no listings
        f"/{OWNER_REPO}/resolve/{REV}/",
        f"/{OWNER_REPO}/resolve/{REV}//model.gguf",
        f"/{OWNER_REPO}/resolve/{REV}/model.gguf%00.txt",
        f"/{OWNER_REPO}/resolve/{REV}/missing.gguf",
        f"/{OWNER_REPO}/{REV}/model.gguf",  # not the resolve/ layout
        "/etc/passwd",
        "/",
    ],
)
def test_outside_the_layout_is_404(mirror: ModelMirror, path: str) -> None:
    status, _, body = request(mirror, path)
    assert status == 404
    assert b"not for the LAN" not in body


def test_a_request_path_is_confined_to_the_tree(tree: Path) -> None:
    served = open_served_file(str(tree), url_parts(url_of("model.gguf")) or [])
    assert served is not None
    os.close(served[0])
    assert url_parts(url_of("../../../../root-sibling/x.gguf")) is None
    assert open_served_file(str(tree), url_parts(url_of("escape.gguf")) or []) is None  # a symlink out of the tree


# ------------------------------------------------------------------------------------------ stats, lifecycle
def test_stats_count_body_bytes_per_path(tree: Path, tmp_path: Path) -> None:
    stats_file = tmp_path / "stats.json"
    with ModelMirror(tree, stats_file=stats_file) as server:
        size = len(model_bytes(tree))
        request(server, url_of("model.gguf"))
        request(server, url_of("model.gguf"), headers={"Range": "bytes=0-999"})
        request(server, url_of("MTP/drafter.gguf"))
        assert request(server, "/.rigkit/stats")[0] == 404  # no HTTP endpoint: root, pid and paths stay private
        stats = server.stats()
        assert stats["files"][url_of("model.gguf")] == {"bytes": size + 1000, "requests": 2, "complete": 2, "head": 0}
        assert stats["files"][url_of("MTP/drafter.gguf")]["bytes"] == 4096
        assert stats["total_bytes"] == size + 1000 + 4096
        assert stats["url"] == server.url
    assert json.loads(stats_file.read_text())["total_bytes"] == size + 1000 + 4096  # written at stop too


def test_client_hanging_up_counts_what_was_sent(tree: Path) -> None:
    big = tree / OWNER_REPO / "resolve" / REV / "big.gguf"
    with open(big, "wb") as handle:  # sparse, and far bigger than any socket buffer
        handle.truncate(256 * MiB)
    with ModelMirror(tree) as server:
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(f"GET {url_of('big.gguf')} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            sock.recv(64 * 1024)
        deadline = time.monotonic() + 5
        while url_of("big.gguf") not in server.stats()["files"] and time.monotonic() < deadline:
            time.sleep(0.05)
        counters = server.stats()["files"][url_of("big.gguf")]
        assert counters["complete"] == 0
        assert 0 < counters["bytes"] < 256 * MiB


def test_idle_timeout_stops_the_server(tree: Path) -> None:
    server = ModelMirror(tree, idle_timeout=0.5).start()
    request(server, url_of("MTP/drafter.gguf"))
    started = time.monotonic()
    server.wait()
    assert 0.4 < time.monotonic() - started < 5
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", server.port)) != 0


def test_bad_root_and_busy_port_say_what_to_do(tree: Path, tmp_path: Path) -> None:
    with pytest.raises(MirrorError, match="is not a directory"):
        ModelMirror(tmp_path / "nope")
    with ModelMirror(tree) as server, pytest.raises(MirrorError, match="pick another port"):
        ModelMirror(tree, port=server.port)


def test_model_fetch_uses_the_mirror_as_base_url_and_resumes(tmp_path: Path) -> None:
    """The mirror speaks the resolve/ layout model_fetch expects, Range resume included."""
    root = tmp_path / "root"
    rev = root / OWNER_REPO / "resolve" / REV
    rev.mkdir(parents=True)
    source = write_arch_gguf(rev / "m.gguf", "gemma4", padding_bytes=2 * MiB, seed=3)
    data = source.read_bytes()
    entry = {
        "repo": OWNER_REPO,
        "revision": REV,
        "filename": "m.gguf",
        "sha256": hashlib.sha256(data).hexdigest(),
        "size": len(data),
        "architecture": "gemma4",
        "role": "target",
    }
    models = tmp_path / "models"
    models.mkdir()
    dest = models / "m.gguf"
    # An interrupted earlier run left the first MiB (and its pin) behind.
    (models / "m.gguf.part").write_bytes(data[:MiB])
    (models / ".rigkit-verified").mkdir()
    (models / ".rigkit-verified" / "m.gguf.part.json").write_text(
        json.dumps({"sha256": entry["sha256"], "size": entry["size"]})
    )
    with ModelMirror(root) as server:
        result = fetch_model(entry, dest, FetchOptions(base_url=server.url, allow_insecure_http=True))
        served = server.stats()["files"][url_of("m.gguf")]
    assert (result.operation, result.resumed_from) == ("resume", MiB)
    assert dest.read_bytes() == data
    assert served["bytes"] == len(data) - MiB  # nothing re-sent


# ------------------------------------------------------------------------------------------ bin/rigkit mirror
def rigkit(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*RIGKIT, "mirror", *args], capture_output=True, text=True, timeout=60, check=False)


def answers(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_cli_starts_detached_and_stops(tree: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    common = ["--pidfile", str(run_dir / "m.pid")]
    start = ["--root", str(tree), "--port", "0", "--logfile", str(run_dir / "m.log"), *common]
    start += ["--stats-file", str(run_dir / "stats.json")]
    started = rigkit(*start)
    assert started.returncode == 0, started.stderr
    info: dict[str, Any] = json.loads(started.stdout)
    assert answers(info["port"])  # it returned only once the port answered
    assert int((run_dir / "m.pid").read_text()) == info["pid"]
    assert os.getsid(info["pid"]) == info["pid"]  # its own session: it outlives the caller
    status, body = _get(info["url"] + url_of("MTP/drafter.gguf"))
    assert status == 200 and len(body) == 4096

    again = rigkit(*start)  # a leftover from an interrupted run is replaced, not duplicated
    assert again.returncode == 0, again.stderr
    second = json.loads(again.stdout)
    assert second["replaced"] is True and second["pid"] != info["pid"]
    assert not Path(f"/proc/{info['pid']}").exists() or "Z" in Path(f"/proc/{info['pid']}/stat").read_text()

    stopped = rigkit("--stop", *common)
    assert stopped.returncode == 0, stopped.stderr
    assert json.loads(stopped.stdout)["stopped"] is True
    assert not (run_dir / "m.pid").exists()
    assert not answers(second["port"])
    assert "serving" in (run_dir / "m.log").read_text()
    assert json.loads((run_dir / "stats.json").read_text())["pid"] == second["pid"]

    assert json.loads(rigkit("--stop", *common).stdout)["stopped"] is False  # nothing running: nothing to do


def test_cli_start_failure_is_reported(tree: Path, tmp_path: Path) -> None:
    failed = rigkit(
        "--root", str(tmp_path / "missing"), "--pidfile", str(tmp_path / "p"), "--logfile", str(tmp_path / "l")
    )
    assert failed.returncode == 1
    assert "did not start" in failed.stderr and "is not a directory" in failed.stderr
    with ModelMirror(tree) as busy:
        args = [
            "--root",
            str(tree),
            "--port",
            str(busy.port),
            "--pidfile",
            str(tmp_path / "p"),
            "--logfile",
            str(tmp_path / "l"),
        ]
        failed = rigkit(*args)
    assert failed.returncode == 1 and "pick another port" in failed.stderr


def test_cli_never_signals_a_stranger(tmp_path: Path) -> None:
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        (tmp_path / "p").write_text(f"{sleeper.pid}\n")
        result = rigkit("--stop", "--pidfile", str(tmp_path / "p"))
        assert json.loads(result.stdout)["stopped"] is False
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()


def _get(url: str) -> tuple[int, bytes]:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as response:
        return response.status, response.read()


def test_gguf_fetch_progress_bar_draws_bytes_percent_rate_and_eta(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("gguf_fetch_module", REPO / "library" / "gguf_fetch.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    screen = tmp_path / "tty"
    screen.touch()
    bar = module.TtyProgress("tiny-gemma4-target", path=str(screen))
    bar(1_000_000, 4_000_000)
    time.sleep(0.3)
    bar(4_000_000, 4_000_000)
    bar.close()
    drawn = screen.read_text()
    assert "tiny-gemma4-target" in drawn and "4.0/4.0 MB" in drawn and "100.0%" in drawn
    assert "MB/s" in drawn and "ETA 0:00" in drawn and drawn.endswith("\n")
    silent = module.TtyProgress("x", path=str(tmp_path / "no" / "such" / "tty"))  # no terminal: nothing, no error
    silent(1, 2)
    silent.close()
