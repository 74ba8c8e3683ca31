"""What the Hub (or anything at --endpoint) sends is data: a ``Link: rel=next`` that points at a
page already read (itself, or any cycle) stops ``rigkit pin`` with an error naming the URL instead of looping,
the walk has a page cap, and the server's text (error headers, commit titles, exception text) reaches the
terminal with its escape sequences made visible."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any

import pytest
from ansible.module_utils.fetch.http import _error_detail
from ansible.module_utils.http_client import redact
from ansible.module_utils.printable import printable

from rigkit.pinning import hf_api
from rigkit.pinning.hf_api import HubApi, PinError

COMMIT = "0123456789abcdef0123456789abcdef01234567"
ESC = "\x1b]0;owned\x07\x1b[2J\x9b31m\r\u202e"

# (path and query) -> (status, headers, body) for one request
Answer = Callable[[str], tuple[int, dict[str, str], Any]]


@pytest.fixture
def serve() -> Iterator[Callable[[Answer], tuple[str, list[str]]]]:
    servers: list[ThreadingHTTPServer] = []

    def start(answer: Answer) -> tuple[str, list[str]]:
        seen: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                seen.append(self.path)
                status, headers, body = answer(self.path)
                data = json.dumps(body).encode()
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_args: Any) -> None:
                pass

        class Handler(Handler):  # after 100 requests, no more next pages: code that loops ends (and fails)
            def do_GET(self) -> None:
                if len(seen) >= 100:
                    seen.append(self.path)
                    self.send_response(200)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"[]")
                    return
                super().do_GET()

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}", seen

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _api(endpoint: str) -> HubApi:
    return HubApi(endpoint, allow_insecure_http=True, timeout=5)


# ---------------------------------------------------------------------------------------------- pagination
def test_a_next_page_pointing_at_itself_stops_with_the_url(serve) -> None:
    def answer(path: str) -> tuple[int, dict[str, str], Any]:
        return 200, {"Link": f'<{path}>; rel="next"'}, []  # an empty page that names itself as the next one

    endpoint, seen = serve(answer)
    with pytest.raises(PinError, match=r"back at a page already read \(http://127\.0\.0\.1:\d+/api/models/o/r/commits"):
        list(_api(endpoint).commits("o/r", "main"))
    assert len(seen) == 1


def test_a_cycle_of_pages_stops_after_one_round(serve) -> None:
    def answer(path: str) -> tuple[int, dict[str, str], Any]:
        other = "/api/models/o/r/commits/main?p=1" if "p=1" not in path else "/api/models/o/r/commits/main?p=2"
        if "p=2" in path:
            other = "/api/models/o/r/commits/main?p=1"
        return 200, {"Link": f"<{other}>; rel=next"}, []

    endpoint, seen = serve(answer)
    with pytest.raises(PinError, match=r"page already read \(.*p=1\)"):
        list(_api(endpoint).commits("o/r", "main"))
    assert len(seen) == 3  # the first page, p=1, p=2; p=1 again is refused before it is sent


def test_the_walk_stops_at_the_page_cap(serve, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hf_api, "MAX_COMMIT_PAGES", 5)

    def answer(path: str) -> tuple[int, dict[str, str], Any]:
        page = int(path.rsplit("p=", 1)[1]) if "p=" in path else 0
        return 200, {"Link": f"</api/models/o/r/commits/main?p={page + 1}>; rel=next"}, []

    endpoint, seen = serve(answer)
    with pytest.raises(PinError, match=r"still has a next page after 5 pages .*Pin a commit directly"):
        list(_api(endpoint).commits("o/r", "main"))
    assert len(seen) == 5


def test_pages_that_move_on_are_followed(serve) -> None:
    def answer(path: str) -> tuple[int, dict[str, str], Any]:
        if "p=1" in path:
            return 200, {}, [{"id": COMMIT.replace("0", "f"), "title": "second"}]
        return 200, {"Link": "</api/models/o/r/commits/main?p=1>; rel=next"}, [{"id": COMMIT, "title": "first"}]

    endpoint, _ = serve(answer)
    assert [c["title"] for c in _api(endpoint).commits("o/r", "main")] == ["first", "second"]


# -------------------------------------------------------------------------------------- the server's text
def test_printable_shows_escapes_and_keeps_text() -> None:
    assert printable("plain text, näive ü") == "plain text, näive ü"
    shown = printable(ESC)
    assert shown.isprintable() and "\x1b" not in shown and "\x9b" not in shown and "\u202e" not in shown
    assert shown == "\\x1b]0;owned\\x07\\x1b[2J\\x9b31m\\x0d\\u202e"
    assert printable("a" * 50, limit=10) == "a" * 10 + "..."
    assert printable(None) == "None"


def test_commit_titles_reach_the_table_without_escapes(serve) -> None:
    endpoint, _ = serve(lambda _path: (200, {}, [{"id": COMMIT, "title": f"fix{ESC}", "date": f"2026{ESC}"}]))
    (commit,) = list(_api(endpoint).commits("o/r", "main"))
    assert commit["title"].isprintable() and "\x1b" not in commit["title"] and commit["title"].startswith("fix")
    assert commit["date"].isprintable()


def test_error_headers_from_the_hub_are_printable_in_the_message(serve) -> None:
    endpoint, _ = serve(
        lambda _path: (404, {"X-Error-Code": "RepoNotFound\x1b[2J", "X-Error-Message": "gone\x1b]0;owned\x07"}, {})
    )
    with pytest.raises(PinError) as caught:
        _api(endpoint).resolve_revision("o/r", "main")
    message = str(caught.value)
    assert message.isprintable() and "\x1b" not in message
    assert "RepoNotFound\\x1b[2J" in message and "repository o/r not found" in message


def test_a_commit_entry_without_an_id_is_shown_printable(serve) -> None:
    endpoint, _ = serve(lambda _path: (200, {}, [{"title": ESC}]))
    with pytest.raises(PinError) as caught:
        list(_api(endpoint).commits("o/r", "main"))
    assert str(caught.value).isprintable()


def test_the_fetchers_error_detail_is_printable() -> None:
    headers = {"X-Error-Code": "Gated\x1b[2J", "X-Error-Message": "accept\x9b31m\r"}
    resp = SimpleNamespace(getheader=lambda name, default=None: headers.get(name, default), read=lambda _n: b"")
    detail = _error_detail(resp)  # type: ignore[arg-type]
    assert detail.isprintable() and detail == "Gated\\x1b[2J: accept\\x9b31m\\x0d"


def test_a_redirect_url_in_a_message_is_printable() -> None:
    shown = redact("https://cdn.example/x\x1b[2J.gguf?sig=secret")
    assert shown.isprintable() and "sig=secret" not in shown


def test_an_exception_from_the_server_is_printable_in_the_message(monkeypatch: pytest.MonkeyPatch) -> None:
    from ansible.module_utils import http_client

    class Connection:
        def __init__(self, *_args: Any, **_kwargs: Any) -> None:
            pass

        def request(self, *_args: Any, **_kwargs: Any) -> None:
            raise http.client.BadStatusLine("HTTP/1.1 200\x1b[2J\x1b]0;owned\x07")

        def close(self) -> None:
            pass

    monkeypatch.setattr(http_client.http.client, "HTTPSConnection", Connection)
    with pytest.raises(PinError) as caught:
        HubApi("https://hub.example", timeout=5).resolve_revision("o/r", "main")
    assert str(caught.value).isprintable() and "BadStatusLine" in str(caught.value)


def test_rig_reported_text_reaches_the_terminal_escaped():
    """make status and make bench-report print what rigs report (nvidia-smi's GPU name, errors) escaped."""
    import json

    from rigkit.bench.report import table_row
    from rigkit.fleet.status import COLUMNS, render
    from tests.support import BENCH_FIXTURES

    hostile = "RTX\x1b]0;pwned\x07\x1b[2J"
    cells = {**dict.fromkeys(COLUMNS, ""), "rig": "r1", "reachable": "yes", "gpu": hostile}
    text = render([{"cells": cells, "raw": {"error": "boom\x1b[31m"}}], wide=True)
    assert "\x1b" not in text and "\x07" not in text
    assert "RTX\\x1b]0;pwned\\x07\\x1b[2J" in text and "boom\\x1b[31m" in text
    report = json.loads(next(iter(sorted(BENCH_FIXTURES.rglob("*.json")))).read_text())
    report["rig"]["gpu"] = {"name": hostile}
    shown = "".join(str(value) for value in table_row(report).values())
    assert "\x1b" not in shown and "RTX\\x1b]0;pwned" in shown
