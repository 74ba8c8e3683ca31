"""The pin client and the fetcher against the Hub's real answers: access errors, rate limits, HTTPS proxies.

The stand-in answers as the Hub does (tests/fixtures/hf_standin.py): without a token an unknown repository is 401
RepoNotFound, with one 404; a gated one 401 / 403 GatedRepo; a 429 carries ``RateLimit: "api";r=0;t=N``. The
proxy tests put a real CONNECT proxy (tests/fixtures/connect_proxy.py) in front of a TLS stand-in.
"""

from __future__ import annotations

import base64
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ansible.module_utils.fetch.http import _error_detail
from ansible.module_utils.fetch.model import DownloadError, HttpStatusError, fetch_model
from ansible.module_utils.http_client import HttpClientError, Proxy, proxy_for, retry_wait

from rigkit.pinning.hf_api import HubApi, PinError, _ApiError, _explain
from tests.fixtures.connect_proxy import ConnectProxy
from tests.fixtures.hf_standin import Fault, HfStandin, make_tls_files
from tests.support import Served, options, part_of, sha256, tls_options

REPO = "rigkit-test/pinned-GGUF"
ABSENT = "rigkit-test/absent"
COMMIT = "a1b2c3d4e5f60718293a4b5c6d7e8f9012345678"
FILENAME = "model.gguf"
CATALOG = "inventory/group_vars/all/model_catalog.yml"
TOKEN = f"hf_{secrets.token_hex(12)}"  # generated: a literal would look like a leaked secret
OTHER_TOKEN = f"hf_{secrets.token_hex(12)}"
MiB = 1024 * 1024
PROXY_VARS = ("https_proxy", "HTTPS_PROXY", "no_proxy", "NO_PROXY", "http_proxy", "HTTP_PROXY", "all_proxy")


@pytest.fixture(autouse=True)
def no_proxy_from_the_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test says which proxy variables it wants; none leak in from the machine running the tests."""
    for name in PROXY_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


def publish(server: HfStandin) -> HfStandin:
    server.add_commit(REPO, COMMIT, {FILENAME: b"GGUF" + bytes(100)})
    return server


@pytest.fixture
def plain_hub() -> Iterator[HfStandin]:
    with HfStandin() as server:
        yield publish(server)


@pytest.fixture
def trusted_ca(tls_files: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SSL_CERT_FILE", str(tls_files[0]))  # the pin client trusts the throwaway CA, as a real one
    return tls_files[0]


@pytest.fixture
def tls_hub(tls_files: tuple[Path, Path, Path], trusted_ca: Path) -> Iterator[HfStandin]:
    _, cert, key = tls_files
    with HfStandin(tls_cert=cert, tls_key=key) as server:
        yield publish(server)


@pytest.fixture
def gated_hub(tls_files: tuple[Path, Path, Path], trusted_ca: Path) -> Iterator[HfStandin]:
    _, cert, key = tls_files
    with HfStandin(tls_cert=cert, tls_key=key, require_token=TOKEN) as server:
        yield publish(server)


@pytest.fixture
def proxy() -> Iterator[ConnectProxy]:
    with ConnectProxy() as server:
        yield server


def api(server: HfStandin, **kw: object) -> HubApi:
    return HubApi(server.base_url, allow_insecure_http=True, **kw)  # type: ignore[arg-type]


def statuses(server: HfStandin) -> list[int]:
    return [r.status for r in server.requests]


# ------------------------------------------------------------------------------------------ access: the pin client
def test_pin_unknown_repo_without_token_is_401_and_says_both_things_to_check(plain_hub: HfStandin) -> None:
    with pytest.raises(PinError) as caught:
        api(plain_hub).resolve_revision(ABSENT, "main")
    assert str(caught.value) == (
        f"HTTP 401 for {ABSENT} (RepoNotFound: Invalid username or password.): no such repository, or it is "
        f"private or gated: check the repo name in the catalog ({CATALOG}), or set HF_TOKEN to a read token of an "
        "account with access, then re-run the pin."
    )
    assert statuses(plain_hub) == [401]


def test_pin_unknown_repo_with_token_is_404_not_found_or_no_access(tls_hub: HfStandin) -> None:
    with pytest.raises(PinError) as caught:
        HubApi(tls_hub.base_url, token=TOKEN).resolve_revision(ABSENT, "main")
    assert str(caught.value) == (
        f"repository {ABSENT} not found, or the account of HF_TOKEN has no access to it (RepoNotFound: Repository "
        f"not found): check the repo name in the catalog ({CATALOG}), or use a token of an account with access."
    )
    assert statuses(tls_hub) == [404] and tls_hub.requests[0].authorized


def test_pin_gated_repo_is_401_without_token_and_403_with_one_lacking_access(gated_hub: HfStandin) -> None:
    with pytest.raises(PinError, match=rf"HTTP 401 for {REPO} \(GatedRepo: .*\): the repository is gated: accept"):
        HubApi(gated_hub.base_url).resolve_revision(REPO, "main")
    with pytest.raises(PinError, match=rf"HTTP 403 for {REPO} \(GatedRepo: .*\): accept the model's license"):
        HubApi(gated_hub.base_url, token=OTHER_TOKEN).resolve_revision(REPO, "main")
    assert HubApi(gated_hub.base_url, token=TOKEN).resolve_revision(REPO, "main") == COMMIT
    assert statuses(gated_hub) == [401, 403, 200]


def test_pin_401_with_a_token_says_the_token_was_not_accepted() -> None:
    refused = _ApiError(401, "", "Invalid credentials in Authorization header")
    message = str(_explain(refused, REPO, "main", TOKEN))
    assert message.startswith(f"HTTP 401 for {REPO} (Invalid credentials in Authorization header): the token")
    assert "was not accepted" in message and TOKEN not in message


@pytest.mark.parametrize(
    ("code", "text", "shown"),
    [("", "gone", " (gone)"), ("RepoNotFound", "", " (RepoNotFound)"), ("", "", ""), ("A", "b", " (A: b)")],
)
def test_the_servers_detail_joins_only_what_it_sent(code: str, text: str, shown: str) -> None:
    message = str(_explain(_ApiError(401, code, text), REPO, "main", None))
    assert message.startswith(f"HTTP 401 for {REPO}{shown}: no such repository")
    headers = {"X-Error-Code": code, "X-Error-Message": text}
    resp = type("R", (), {"getheader": lambda _s, name, d=None: headers.get(name) or d, "read": lambda _s, _n: b""})
    assert _error_detail(resp()) == shown.strip(" ()")  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ access: the fetcher
def test_fetch_unknown_repo_without_token_is_401_and_says_both_things_to_check(
    hub: HfStandin, tiny: Served, models: Path
) -> None:
    tiny.publish(hub)
    with pytest.raises(HttpStatusError) as caught:
        fetch_model(tiny.entry(repo=ABSENT), models / tiny.filename, options(hub))
    assert caught.value.status == 401
    assert str(caught.value) == (
        f"HTTP 401 for {ABSENT} @ {tiny.revision} : {tiny.filename} (server says RepoNotFound: Invalid username or "
        f"password.): no such repository, or it is private or gated: check the repo name in the catalog ({CATALOG}), "
        "or set HF_TOKEN (models_hf_token) to a read token of an account with access."
    )


def test_fetch_unknown_repo_with_token_is_404_not_found_or_no_access(
    tiny: Served, models: Path, tls_files: tuple[Path, Path, Path]
) -> None:
    ca, cert, key = tls_files
    with HfStandin(tls_cert=cert, tls_key=key) as server:
        with pytest.raises(HttpStatusError, match="no such repository, or the token's account has no access") as err:
            fetch_model(tiny.entry(repo=ABSENT), models / tiny.filename, tls_options(server, ca, token=TOKEN))
        assert err.value.status == 404 and "private repository also answers 404" not in str(err.value)
        assert [r.authorized for r in server.requests] == [True]


# ------------------------------------------------------------------------------------------ 429: the pin client
def test_pin_waits_for_the_rate_limit_reset_then_succeeds(plain_hub: HfStandin) -> None:
    plain_hub.add_api_fault(Fault("rate_limit", seconds=1))
    notices: list[str] = []
    assert api(plain_hub, rate_limit_wait=5, notice=notices.append).resolve_revision(REPO, "main") == COMMIT
    assert statuses(plain_hub) == [429, 200]
    waited = plain_hub.requests[1].at - plain_hub.requests[0].at
    assert 0.95 <= waited < 2.0, waited  # t=1: once, after the reset, not before
    assert len(notices) == 1 and "HTTP 429" in notices[0] and "waiting 1 s" in notices[0]


def test_pin_rate_limit_reads_retry_after_and_ratelimit_the_longer_wins(plain_hub: HfStandin) -> None:
    plain_hub.add_api_fault(Fault("rate_limit", seconds=3, retry_after="7"))
    slept: list[float] = []
    assert api(plain_hub, sleep=slept.append, notice=lambda _line: None).resolve_revision(REPO, "main") == COMMIT
    assert slept == [7.0] and statuses(plain_hub) == [429, 200]


def test_pin_rate_limit_beyond_the_bound_fails_with_the_wait_asked(plain_hub: HfStandin) -> None:
    plain_hub.add_api_fault(Fault("rate_limit", seconds=120, times=None))
    slept: list[float] = []
    with pytest.raises(PinError) as caught:
        api(plain_hub, rate_limit_wait=5, sleep=slept.append).file_at(REPO, COMMIT, FILENAME)
    assert str(caught.value) == (
        f"HTTP 429 for {REPO}: the Hugging Face API's rate limit; its quota resets in 120 s, beyond the 5 s this pin "
        "waits in all. Re-run the pin after that; with HF_TOKEN set the quota is an account's, larger than an "
        "anonymous one."
    )
    assert slept == [] and statuses(plain_hub) == [429]  # no early retry that would spend more of the quota


def test_pin_rate_limit_waits_are_bounded_in_total(plain_hub: HfStandin) -> None:
    plain_hub.add_api_fault(Fault("rate_limit", seconds=2, times=None))
    slept: list[float] = []
    with pytest.raises(
        PinError, match="its quota resets in 2 s, this pin has already waited 4 s of the 5 s it waits in all"
    ):
        api(plain_hub, rate_limit_wait=5, sleep=slept.append, notice=lambda _line: None).resolve_revision(REPO, "main")
    assert slept == [2.0, 2.0] and statuses(plain_hub) == [429, 429, 429]


# ------------------------------------------------------------------------------------------ 429: the fetcher
def test_fetch_waits_for_the_rate_limit_reset_then_succeeds(hub: HfStandin, tiny: Served, models: Path) -> None:
    tiny.publish(hub)
    tiny.fault(hub, Fault("rate_limit", seconds=1))
    result = fetch_model(tiny.entry(), models / tiny.filename, options(hub, backoff_max=2.0))
    assert statuses(hub) == [429, 200] and result.attempts == 2
    waited = hub.requests[1].at - hub.requests[0].at
    assert 0.95 <= waited < 2.0, waited  # the reset (1 s), not the backoff (0.01 s)
    assert any("rate limited: the quota resets in 1 s" in event for event in result.events)


def test_fetch_rate_limit_reads_retry_after(hub: HfStandin, tiny: Served, models: Path) -> None:
    tiny.publish(hub)
    tiny.fault(hub, Fault("rate_limit", seconds=0, retry_after="1"))
    fetch_model(tiny.entry(), models / tiny.filename, options(hub, backoff_max=2.0))
    assert statuses(hub) == [429, 200] and hub.requests[1].at - hub.requests[0].at >= 0.95


def test_fetch_rate_limit_beyond_backoff_fails_at_once_with_the_wait(
    hub: HfStandin, tiny: Served, models: Path
) -> None:
    tiny.publish(hub)
    tiny.fault(hub, Fault("rate_limit", seconds=120, times=None))
    started = time.monotonic()
    with pytest.raises(DownloadError) as caught:
        fetch_model(tiny.entry(), models / tiny.filename, options(hub, backoff_max=2.0))
    message = str(caught.value)
    assert "HTTP 429" in message and "the server's rate limit resets in 120 s" in message
    assert "longer than this download waits between attempts (2 s)" in message and "Re-run after 120 s" in message
    assert statuses(hub) == [429] and time.monotonic() - started < 1.5


def test_fetch_rate_limit_mid_download_keeps_the_part(hub: HfStandin, medium: Served, models: Path) -> None:
    medium.publish(hub)
    medium.fault(hub, Fault("reset", after_bytes=3 * MiB), Fault("rate_limit", seconds=120, times=None))
    dest = models / medium.filename
    with pytest.raises(DownloadError, match="rate limit resets in 120 s"):
        fetch_model(medium.entry(), dest, options(hub))
    assert part_of(dest).stat().st_size >= 3 * MiB  # what was received resumes on the next run


@pytest.mark.parametrize(
    ("retry_after", "ratelimit", "wait"),
    [
        (None, '"api";r=0;t=39', 39.0),
        ("30", None, 30.0),
        ("30", '"api";r=0;t=39', 39.0),
        ("Wed, 21 Oct 2015 07:28:00 GMT", None, 30.0),  # an HTTP date, 30 s after "now"
        ("Wed, 21 Oct 2015 07:27:00 GMT", None, 0.0),  # already past
        (None, "limit=500, remaining=0, reset=12", 12.0),  # the draft's older form
        ("soon", None, None),
        ("\u00b2", None, None),  # '²'.isdigit() is true; it is no number of seconds
        (None, '"api";r=0;t=\u0663', None),
        (None, None, None),
    ],
)
def test_retry_wait(retry_after: str | None, ratelimit: str | None, wait: float | None) -> None:
    now = 1445412450.0  # Wed, 21 Oct 2015 07:27:30 GMT
    assert retry_wait(retry_after, ratelimit, now=now) == wait


# ------------------------------------------------------------------------------------------ HTTPS_PROXY / NO_PROXY
HF = "https://huggingface.co/api/models/o/r"


@pytest.mark.parametrize(
    ("environ", "url", "expected"),
    [
        ({"HTTPS_PROXY": "http://proxy.lan:3128"}, HF, ("proxy.lan", 3128, "HTTPS_PROXY")),
        ({"https_proxy": "http://a:1", "HTTPS_PROXY": "http://b:2"}, HF, ("a", 1, "https_proxy")),
        ({"HTTPS_PROXY": "proxy.lan:3128"}, HF, ("proxy.lan", 3128, "HTTPS_PROXY")),
        ({"HTTPS_PROXY": "http://proxy.lan"}, HF, ("proxy.lan", 80, "HTTPS_PROXY")),
        ({"HTTPS_PROXY": "http://p:1"}, "http://127.0.0.1:9/x", None),  # plain http goes direct
        ({"HTTPS_PROXY": "http://p:1", "NO_PROXY": "huggingface.co"}, HF, None),
        ({"HTTPS_PROXY": "http://p:1", "NO_PROXY": "huggingface.co"}, "https://cdn.huggingface.co/x", None),
        ({"HTTPS_PROXY": "http://p:1", "no_proxy": ".huggingface.co"}, HF, None),
        ({"HTTPS_PROXY": "http://p:1", "NO_PROXY": "*.huggingface.co"}, HF, None),
        ({"HTTPS_PROXY": "http://p:1", "NO_PROXY": "*"}, HF, None),
        ({"HTTPS_PROXY": "http://p:1", "NO_PROXY": "huggingface.co:443"}, HF, None),
        ({"HTTPS_PROXY": "http://p:1", "NO_PROXY": "10.0.0.0/8"}, "https://10.1.2.3/x", None),
        ({"HTTPS_PROXY": "http://p:1", "NO_PROXY": "::1"}, "https://[::1]:8443/x", None),
        ({"HTTPS_PROXY": "http://p:1", "NO_PROXY": "huggingface.co:8443"}, HF, ("p", 1, "HTTPS_PROXY")),
        ({"HTTPS_PROXY": "http://p:1", "NO_PROXY": "ingface.co"}, HF, ("p", 1, "HTTPS_PROXY")),  # a dot boundary
        ({"HTTPS_PROXY": "http://p:1", "NO_PROXY": "10.0.0.0/8"}, "https://11.1.2.3/x", ("p", 1, "HTTPS_PROXY")),
    ],
)
def test_proxy_for(environ: dict[str, str], url: str, expected: tuple[str, int, str] | None) -> None:
    found = proxy_for(url, environ)
    assert (found and (found.host, found.port, found.source)) == expected


def test_proxy_credentials_become_proxy_authorization_and_stay_out_of_messages() -> None:
    found = proxy_for(HF, {"HTTPS_PROXY": "http://us%40er:p%3Ass@proxy.lan:3128"})
    assert found == Proxy("proxy.lan", 3128, "HTTPS_PROXY", "Basic " + base64.b64encode(b"us@er:p:ss").decode())
    assert "p:ss" not in str(found)
    with pytest.raises(HttpClientError, match="give http://HOST:PORT") as caught:
        proxy_for(HF, {"https_proxy": "https://user:secret@proxy.lan:3128"})
    assert "secret" not in str(caught.value) and "https_proxy=" in str(caught.value)


def assert_tunnelled(proxy: ConnectProxy, server: HfStandin) -> None:
    """Every request went through a CONNECT to the stand-in; the token reached it, and never the proxy in clear
    (nor in the tunnel's bytes, which are TLS records)."""
    assert server.requests and proxy.targets == [f"127.0.0.1:{server.port}"] * len(server.requests)
    assert all(h.get("Authorization") == f"Bearer {TOKEN}" for h in server.headers_seen)
    clear = b"".join(proxy.heads)
    assert b"Authorization:" not in clear and TOKEN.encode() not in clear
    assert proxy.tunnelled[:1] == b"\x16" and TOKEN.encode() not in proxy.tunnelled  # a TLS handshake first


def test_pin_goes_through_the_https_proxy_and_the_token_only_inside_the_tunnel(
    gated_hub: HfStandin, proxy: ConnectProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", proxy.url)
    client = HubApi(gated_hub.base_url, token=TOKEN)
    assert client.resolve_revision(REPO, "main") == COMMIT
    assert client.lookup_file(REPO, COMMIT, FILENAME).size == 104
    assert_tunnelled(proxy, gated_hub)


def test_fetch_goes_through_the_https_proxy_and_the_token_only_inside_the_tunnel(
    tiny: Served, models: Path, tls_files: tuple[Path, Path, Path], proxy: ConnectProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca, cert, key = tls_files
    monkeypatch.setenv("https_proxy", proxy.url)
    with HfStandin(tls_cert=cert, tls_key=key, require_token=TOKEN) as server:
        tiny.publish(server)
        fetch_model(tiny.entry(), models / tiny.filename, tls_options(server, ca, token=TOKEN))
        assert_tunnelled(proxy, server)
    assert sha256(models / tiny.filename) == tiny.sha256


@pytest.mark.parametrize(
    ("variable", "value"), [("NO_PROXY", "127.0.0.1"), ("no_proxy", "*"), ("NO_PROXY", "example.com, 127.0.0.1:{port}")]
)
def test_no_proxy_bypasses_the_proxy(
    tls_hub: HfStandin, proxy: ConnectProxy, monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", proxy.url)
    monkeypatch.setenv(variable, value.format(port=tls_hub.port))
    assert HubApi(tls_hub.base_url, token=TOKEN).resolve_revision(REPO, "main") == COMMIT
    assert proxy.targets == [] and proxy.heads == [] and statuses(tls_hub) == [200]


def test_fetch_no_proxy_bypasses_the_proxy(
    tiny: Served, models: Path, tls_files: tuple[Path, Path, Path], proxy: ConnectProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca, cert, key = tls_files
    monkeypatch.setenv("HTTPS_PROXY", proxy.url)
    monkeypatch.setenv("no_proxy", "localhost,127.0.0.1")
    with HfStandin(tls_cert=cert, tls_key=key) as server:
        tiny.publish(server)
        fetch_model(tiny.entry(), models / tiny.filename, tls_options(server, ca))
        assert server.requests and proxy.heads == []


def test_plain_http_endpoints_stay_direct(
    plain_hub: HfStandin, proxy: ConnectProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", proxy.url)
    assert api(plain_hub).resolve_revision(REPO, "main") == COMMIT
    assert proxy.heads == [] and statuses(plain_hub) == [200]


def test_proxy_credentials_from_the_url_are_sent_and_a_refusal_names_the_proxy(
    tls_hub: HfStandin, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ConnectProxy(require_auth="rig:s3cret") as guarded:
        monkeypatch.setenv("HTTPS_PROXY", f"http://rig:s3cret@127.0.0.1:{guarded.port}")
        assert HubApi(tls_hub.base_url).resolve_revision(REPO, "main") == COMMIT
        assert guarded.targets == [f"127.0.0.1:{tls_hub.port}"]
        monkeypatch.setenv("HTTPS_PROXY", guarded.url)
        with pytest.raises(PinError) as caught:
            HubApi(tls_hub.base_url).resolve_revision(REPO, "main")
    message = str(caught.value)
    assert f"through the proxy 127.0.0.1:{guarded.port} (from HTTPS_PROXY)" in message and "407" in message
    assert "HTTPS_PROXY / NO_PROXY" in message


def test_an_unreachable_proxy_is_named_by_the_fetcher(
    tiny: Served, models: Path, tls_files: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    ca, cert, key = tls_files
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:1")
    with HfStandin(tls_cert=cert, tls_key=key) as server:
        tiny.publish(server)
        with pytest.raises(DownloadError, match=r"through the proxy 127\.0\.0\.1:1 \(from HTTPS_PROXY\)"):
            fetch_model(tiny.entry(), models / tiny.filename, tls_options(server, ca, retries=0))
        assert server.requests == []
