"""`make pin` / `rigkit pin` (rigkit/pinning/models.py) against the Hugging Face stand-in, on a copy of the catalog."""

from __future__ import annotations

import difflib
import hashlib
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from ansible.module_utils.http_client import UrlRefused, next_hop

from rigkit.pinning import hf_api
from rigkit.pinning.models import HubApi, PinError, pin_entry, pin_host
from rigkit.sandbox.tiny_gemma4 import write_arch_gguf, write_target
from tests.fixtures.hf_standin import HfStandin, make_tls_files
from tests.support import recap, run

REPO = Path(__file__).resolve().parents[2]
CATALOG = REPO / "inventory" / "group_vars" / "all" / "model_catalog.yml"
COMMIT = "a1b2c3d4e5f60718293a4b5c6d7e8f9012345678"
NEWER = "fedcba9876543210fedcba9876543210fedcba98"
TARGET = "unsloth-gemma-4-E4B-it-Q4_K_M"  # listed with repo and filename, nothing pinned (no trusted sha256)
DRAFTER = "gemma-4-E2B-it-qat-assistant-q4_0-exact"  # carries the seed article's sha256, no revision/size
TOKEN = f"hf_{secrets.token_hex(12)}"


def entry(catalog: Path, name: str) -> dict:
    return yaml.safe_load(catalog.read_text())["model_catalog"][name]


@pytest.fixture
def catalog(tmp_path: Path) -> Path:
    copy = tmp_path / "model_catalog.yml"
    shutil.copyfile(CATALOG, copy)
    return copy


@pytest.fixture
def body(tmp_path: Path) -> bytes:
    """A real GGUF (pin measures its header's shape facts), a fresh sha256 each test."""
    return write_arch_gguf(
        tmp_path / "body.gguf", "gemma4", padding_bytes=5000, seed=secrets.randbelow(1 << 30)
    ).read_bytes()


@pytest.fixture
def hub(body: bytes) -> Iterator[HfStandin]:
    with HfStandin() as server:
        target = entry(CATALOG, TARGET)
        server.add_file(target["repo"], COMMIT, target["filename"], body)
        server.add_ref(target["repo"], "main", COMMIT)
        yield server


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


def pin(
    catalog: Path, hub: HfStandin, name: str = TARGET, revision: str = COMMIT, token: str | None = None, **kw: object
):
    api = HubApi(hub.base_url, token=token, allow_insecure_http=True)
    return pin_entry(name, revision, catalog_path=str(catalog), api=api, **kw)


def test_pin_writes_revision_sha256_and_size(catalog: Path, hub: HfStandin, body: bytes) -> None:
    result = pin(catalog, hub)
    assert result.changed
    pinned = entry(catalog, TARGET)
    assert pinned["revision"] == COMMIT
    assert pinned["sha256"] == hashlib.sha256(body).hexdigest()
    assert pinned["size"] == len(body)
    assert f'revision: "{COMMIT}"' in catalog.read_text()  # quoted: a commit of digits stays a string
    paths_info = [r for r in hub.requests if "/paths-info/" in r.path]
    assert paths_info and paths_info[-1].method == "POST" and paths_info[-1].path.endswith(f"/paths-info/{COMMIT}")


def test_only_the_three_pin_lines_change_and_comments_survive(catalog: Path, hub: HfStandin) -> None:
    before = catalog.read_text()
    pin(catalog, hub)
    after = catalog.read_text()
    changed = [
        line
        for line in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    pinned = [line for line in changed if line.lstrip("+-").strip().split(":")[0] in ("revision", "sha256", "size")]
    assert len(pinned) == 6, changed  # revision, sha256, size: three lines out, three in
    # and, the entry having none, the shape facts measured from the file's GGUF header: lines added, none removed
    shape = [line for line in changed if line not in pinned]
    assert shape[0] == "+    shape:" and all(line.startswith("+      ") for line in shape[1:]), changed
    assert "+      weights_bytes: 5128" in shape, shape  # a 4x8 f32 token_embd (128 bytes) and 5,000 of padding
    comments = [line for line in before.splitlines() if line.lstrip().startswith("#")]
    assert comments and all(line in after.splitlines() for line in comments)
    assert after.startswith("---\n")


def test_same_pin_again_changes_nothing(catalog: Path, hub: HfStandin) -> None:
    pin(catalog, hub)
    text, mtime = catalog.read_text(), catalog.stat().st_mtime_ns
    result = pin(catalog, hub)
    assert not result.changed
    assert catalog.read_text() == text and catalog.stat().st_mtime_ns == mtime


def test_a_different_pin_is_refused_without_force(catalog: Path, hub: HfStandin, body: bytes) -> None:
    pin(catalog, hub)
    target = entry(CATALOG, TARGET)
    newer = body + b"v2"
    hub.add_file(target["repo"], NEWER, target["filename"], newer)
    text = catalog.read_text()
    # The sha256 recorded by the first pin is now the anchor: a revision whose file differs is refused, listed.
    with pytest.raises(PinError, match=r"no commit of .* holds") as refused:
        pin(catalog, hub, revision=NEWER)
    message = str(refused.value)
    assert f"{NEWER}  sha256 {hashlib.sha256(newer).hexdigest()}  size {len(newer)}" in message
    assert f"make pin model={TARGET} revision=COMMIT force=1" in message
    assert catalog.read_text() == text  # untouched

    result = pin(catalog, hub, revision=NEWER, force=True)
    assert result.changed and result.previous["revision"] == COMMIT and not result.anchored
    assert entry(catalog, TARGET)["sha256"] == hashlib.sha256(newer).hexdigest()


def test_a_pinned_revision_that_moved_is_never_replaced_silently(catalog: Path, hub: HfStandin, body: bytes) -> None:
    """Same file (same sha256) at a newer commit: the walk finds the newer commit, and the pin refuses to move."""
    pin(catalog, hub)
    target = entry(CATALOG, TARGET)
    hub.add_commit(target["repo"], NEWER, {"README.md": b"docs"}, parent=COMMIT)  # main moves, the file does not
    text = catalog.read_text()
    with pytest.raises(PinError, match="refusing to replace the pin") as refused:
        pin(catalog, hub, revision="")
    assert f"revision: {COMMIT} -> {NEWER}" in str(refused.value) and "force=1" in str(refused.value)
    assert catalog.read_text() == text


def test_a_recorded_sha256_that_no_commit_holds_is_never_replaced(catalog: Path, hub: HfStandin) -> None:
    drafter = entry(CATALOG, DRAFTER)
    hub.add_commit(drafter["repo"], COMMIT, {drafter["filename"]: b"GGUF not the article's file"})
    text = catalog.read_text()
    with pytest.raises(PinError, match=f"no commit of {drafter['repo']} @ main holds .* {drafter['sha256']}"):
        pin(catalog, hub, name=DRAFTER, revision="")
    assert catalog.read_text() == text


def test_a_recorded_sha256_that_agrees_is_completed(catalog: Path, hub: HfStandin) -> None:
    drafter = entry(CATALOG, DRAFTER)
    # The stand-in reports the sha256 it is told (as HF reports the LFS oid), so the article's value can match.
    hub.add_commit(
        drafter["repo"], COMMIT, {drafter["filename"]: b"x" * 777}, sha256={drafter["filename"]: drafter["sha256"]}
    )
    result = pin(catalog, hub, name=DRAFTER, revision="")
    assert result.changed and result.anchored and result.walked == 1
    assert entry(catalog, DRAFTER) | {} == drafter | {"revision": COMMIT, "size": 777}


def test_a_branch_is_resolved_to_its_commit(catalog: Path, hub: HfStandin) -> None:
    result = pin(catalog, hub, revision="main")
    assert (result.resolved_from, result.revision) == ("main", COMMIT)
    assert entry(catalog, TARGET)["revision"] == COMMIT


@pytest.mark.parametrize(
    ("name", "revision", "message"),
    [
        ("no-such-model", COMMIT, "not in"),
        (TARGET, NEWER, f"revision {NEWER} not found"),
        ("gemma-4-e4b-it-mtp-assistant-ultralight-f16", COMMIT, "has no repo"),
    ],
)
def test_bad_requests_fail_clearly(catalog: Path, hub: HfStandin, name: str, revision: str, message: str) -> None:
    with pytest.raises(PinError, match=message):
        pin(catalog, hub, name=name, revision=revision)


@pytest.mark.parametrize("name", ["gemma-4-E4B-it-qat-q4_0-exact", "unsloth-gemma-4-E4B-it-BF16-MTP"])
def test_unknown_repository(catalog: Path, name: str) -> None:
    """401 without a token, as the Hub answers an absent (or private) repository: the message names the repository
    and both things to check (with a trusted sha256: the commit walk; without: the revision)."""
    repo = entry(CATALOG, name)["repo"]
    with (
        HfStandin() as empty,
        pytest.raises(
            PinError,
            match=rf"HTTP 401 for {repo} \(RepoNotFound: Invalid username or password\.\): no such repository, or "
            r"it is private or gated: check the repo name in the catalog.*or set HF_TOKEN",
        ),
    ):
        pin(catalog, empty, name=name, revision="")
    assert [r.status for r in empty.requests] == [401]


def test_unknown_file(catalog: Path, hub: HfStandin) -> None:
    target = entry(CATALOG, TARGET)
    hub.add_file(target["repo"], NEWER, "some-other.gguf", b"GGUF")
    with pytest.raises(PinError, match=f"{target['filename']} does not exist in {target['repo']} at {NEWER}"):
        pin(catalog, hub, revision=NEWER)


@pytest.mark.parametrize("name", [TARGET, DRAFTER])  # what the revision holds / the walk for a trusted sha256
def test_gated_repository_needs_the_token(
    catalog: Path, body: bytes, name: str, tls_files: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    pinned = entry(CATALOG, name)
    repo = pinned["repo"]
    ca, cert, key = tls_files
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))  # trust the throwaway CA, as a real endpoint's is trusted
    with HfStandin(require_token=TOKEN, tls_cert=cert, tls_key=key) as gated:
        reported = {pinned["filename"]: pinned["sha256"]} if pinned["sha256"] else None
        gated.add_commit(repo, COMMIT, {pinned["filename"]: body}, sha256=reported)
        with pytest.raises(
            PinError,
            match=rf"HTTP 401 for {repo} \(GatedRepo: .*\): the repository is gated.*set HF_TOKEN.*re-run the pin",
        ) as no_token:
            pin(catalog, gated, name=name, revision="")
        # The stand-in answers 403 to a token without access, as HF does for a gated repo whose terms are pending.
        with pytest.raises(PinError, match=rf"HTTP 403 for {repo}.*accept the model's license") as forbidden:
            pin(catalog, gated, name=name, revision="", token="hf_wrong")  # noqa: S106 - a deliberately wrong token
        assert f"https://huggingface.co/{repo}" in str(forbidden.value)
        assert pin(catalog, gated, name=name, revision="", token=TOKEN).changed
    assert TOKEN not in str(no_token.value) + str(forbidden.value)


def test_the_token_never_travels_over_plain_http(catalog: Path, hub: HfStandin) -> None:
    assert pin(catalog, hub, revision="", token=TOKEN).changed
    assert hub.headers_seen and not any("Authorization" in h for h in hub.headers_seen)


def test_an_endpoint_from_the_environment_is_announced(catalog: Path, hub: HfStandin) -> None:
    result = run(
        ["python", "bin/rigkit", "pin", TARGET, COMMIT, "--catalog", str(catalog), "--allow-insecure-http"],
        HF_ENDPOINT=hub.base_url,
    )
    assert result.returncode == 0, result.tail()
    assert f"rigkit pin: asking {hub.base_url} (from $HF_ENDPOINT), not https://huggingface.co" in result.output


def test_plain_http_endpoint_needs_the_flag(catalog: Path, hub: HfStandin) -> None:
    with pytest.raises(PinError, match="refusing the base URL plain http://"):
        pin_entry(TARGET, COMMIT, catalog_path=str(catalog), api=HubApi(hub.base_url))


def test_cli_and_make_target(catalog: Path, hub: HfStandin, body: bytes) -> None:
    base = [sys.executable, str(REPO / "bin" / "rigkit"), "pin", TARGET, COMMIT, "--catalog", str(catalog)]
    base += ["--endpoint", hub.base_url, "--allow-insecure-http"]
    done = subprocess.run(base, capture_output=True, text=True, check=False, env={**os.environ, "HF_TOKEN": ""})
    assert done.returncode == 0, done.stderr
    assert f"sha256 {hashlib.sha256(body).hexdigest()}" in done.stdout

    target = entry(CATALOG, TARGET)
    hub.add_file(target["repo"], NEWER, target["filename"], body + b"!")
    args = f"--catalog {catalog} --endpoint {hub.base_url} --allow-insecure-http"
    refused = run(["make", "--no-print-directory", "pin", f"model={TARGET}", f"revision={NEWER}", f"ARGS={args}"])
    assert refused.returncode != 0
    assert (
        "no commit of" in refused.output
        and f"{NEWER}  sha256 {hashlib.sha256(body + b'!').hexdigest()}" in refused.output
    )
    forced = run(
        ["make", "--no-print-directory", "pin", f"model={TARGET}", f"revision={NEWER}", "force=1", f"ARGS={args}"]
    )
    assert forced.returncode == 0, forced.output
    assert entry(catalog, TARGET)["revision"] == NEWER
    assert CATALOG.read_text() != catalog.read_text()  # the real catalog was never the one written


# ------------------------------------------------------------------ a trusted sha256 anchors the pin
EXACT = "gemma-4-E2B-it-qat-q4_0-exact"  # the seed rigs' target: trusted sha256 and size, no revision
C1, C2, C3, C4 = (f"{n}" * 40 for n in "1234")


@pytest.fixture
def history(hub: HfStandin) -> dict[str, tuple[str, int]]:
    """The exact E2B repository with a file that changed twice: v1 (c1), v2 (c2, still there at c3), v3 (c4).

    v2 is reported with the catalog's trusted sha256 and size (as HF reports a 2.6 GB file's LFS record)."""
    exact = entry(CATALOG, EXACT)
    repo, name = exact["repo"], exact["filename"]
    v1, v2, v3 = (b"GGUF" + bytes([n]) * 3000 for n in (1, 2, 3))
    hub.add_commit(repo, C1, {name: v1, "README.md": b"v1"}, title="build v1")
    hub.add_commit(
        repo, C2, {name: v2}, parent=C1, title="build v2", sha256={name: exact["sha256"]}, size={name: exact["size"]}
    )
    hub.add_commit(repo, C3, {"README.md": b"notes"}, parent=C2, title="readme")
    hub.add_commit(repo, C4, {name: v3}, parent=C3, title="build v3")
    return {
        "v1": (hashlib.sha256(v1).hexdigest(), len(v1)),
        "v2": (exact["sha256"], exact["size"]),
        "v3": (hashlib.sha256(v3).hexdigest(), len(v3)),
    }


def set_sha256(catalog: Path, name: str, sha256: str | None, size: int | None = None) -> None:
    data = yaml.safe_load(catalog.read_text())
    data["model_catalog"][name].update(sha256=sha256, size=size)
    catalog.write_text(yaml.safe_dump(data, sort_keys=False))


def test_trusted_sha256_pins_the_newest_commit_holding_it(catalog: Path, hub: HfStandin, history: dict) -> None:
    result = pin(catalog, hub, name=EXACT, revision="")
    assert (result.revision, result.anchored, result.resolved_from) == (C3, True, "main")
    pinned = entry(catalog, EXACT)
    assert (pinned["revision"], pinned["sha256"], pinned["size"]) == (C3, *history["v2"])
    looked = [r.path.rsplit("/", 1)[1] for r in hub.requests if "/paths-info/" in r.path]
    assert looked == [C4, C3]  # newest first, stopped at the first commit holding it
    assert [r.method for r in hub.requests if "/commits/" in r.path] == ["GET"]


def test_trusted_sha256_of_the_first_build(catalog: Path, hub: HfStandin, history: dict) -> None:
    set_sha256(catalog, EXACT, history["v1"][0])
    result = pin(catalog, hub, name=EXACT, revision="")
    assert (result.revision, result.sha256, result.size, result.walked) == (C1, *history["v1"], 4)


def test_the_walk_starts_at_the_given_revision(catalog: Path, hub: HfStandin, history: dict) -> None:
    set_sha256(catalog, EXACT, history["v1"][0])
    assert pin(catalog, hub, name=EXACT, revision=C2).revision == C1
    set_sha256(catalog, EXACT, history["v3"][0])
    with pytest.raises(PinError, match=f"no commit of .* @ {C2} holds"):
        pin(catalog, hub, name=EXACT, revision=C2)  # v3 came later than c2


def test_commit_pages_are_followed(
    catalog: Path, hub: HfStandin, history: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hf_api, "COMMITS_PER_PAGE", 2)
    set_sha256(catalog, EXACT, history["v1"][0])
    assert pin(catalog, hub, name=EXACT, revision="").revision == C1
    assert len([r for r in hub.requests if "/commits/" in r.path]) == 2  # c4 c3 | c2 c1 through Link: rel="next"


def test_trusted_sha256_no_commit_holds_is_refused_with_the_list(catalog: Path, hub: HfStandin, history: dict) -> None:
    wanted = hashlib.sha256(b"the file nobody published").hexdigest()
    set_sha256(catalog, EXACT, wanted, 2620370912)
    text = catalog.read_text()
    with pytest.raises(PinError) as refused:
        pin(catalog, hub, name=EXACT, revision="")
    message = str(refused.value)
    assert f"no commit of {entry(CATALOG, EXACT)['repo']} @ main holds" in message and wanted in message
    rows = [line.split() for line in message.splitlines() if line.startswith("  ")]
    assert [(row[0], row[3], int(row[5])) for row in rows] == [
        (C4, *history["v3"]),
        (C3, *history["v2"]),
        (C2, *history["v2"]),
        (C1, *history["v1"]),
    ]
    assert catalog.read_text() == text


def test_a_commit_without_the_file_is_listed_as_absent(catalog: Path, hub: HfStandin) -> None:
    exact = entry(CATALOG, EXACT)
    hub.add_commit(exact["repo"], C1, {"README.md": b"empty repository"})
    with pytest.raises(PinError, match=f"{C1}  2026-01-01  file absent"):
        pin(catalog, hub, name=EXACT, revision="")


# ------------------------------------------------------------------ one command per rig
def inventory_copy(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the repo's inventory (hosts, group and host variables): (hosts.yml, its catalog)."""
    copy = tmp_path / "inventory"
    shutil.copytree(REPO / "inventory", copy)
    return copy / "hosts.yml", copy / "group_vars" / "all" / "model_catalog.yml"


def test_make_pin_host_pins_target_and_drafter(tmp_path: Path, hub: HfStandin, history: dict) -> None:
    hosts, copy = inventory_copy(tmp_path)
    drafter = entry(CATALOG, DRAFTER)
    hub.add_commit(
        drafter["repo"],
        C1,
        {drafter["filename"]: b"GGUF" + b"d" * 900},
        sha256={drafter["filename"]: drafter["sha256"]},
    )
    args = f"--catalog {copy} --endpoint {hub.base_url} --allow-insecure-http"
    before = CATALOG.read_text()
    done = run(
        ["make", "--no-print-directory", "pin", "host=desktop3050", f"ARGS={args}"], ANSIBLE_INVENTORY=str(hosts)
    )
    assert done.returncode == 0, done.output
    assert f"{EXACT}: pinned" in done.output and f"{DRAFTER}: pinned" in done.output
    assert "next: make check host=desktop3050" in done.output
    assert (entry(copy, EXACT)["revision"], entry(copy, EXACT)["size"]) == (C3, history["v2"][1])
    assert (entry(copy, DRAFTER)["revision"], entry(copy, DRAFTER)["size"]) == (C1, 904)
    assert CATALOG.read_text() == before  # the repo's own catalog is never the one written

    # With those pins, `make check` passes validation on the copy; only the connection to the rig fails.
    check = run(
        [
            "make",
            "--no-print-directory",
            "check",
            "host=desktop3050",
            "ARGS=-e ansible_host=127.0.0.1 -e ansible_port=1",
        ],
        ANSIBLE_INVENTORY=str(hosts),
    )
    counters = recap(check.output)["desktop3050"]
    assert (counters["failed"], counters["unreachable"]) == (0, 1), check.tail()
    assert "make pin" not in check.output

    again = run(
        ["make", "--no-print-directory", "pin", "host=desktop3050", f"ARGS={args}"], ANSIBLE_INVENTORY=str(hosts)
    )
    assert again.returncode == 0 and f"{EXACT}: already pinned" in again.output

    wrong = run(["make", "--no-print-directory", "pin", "host=desktop3050", "revision=main", f"ARGS={args}"])
    assert wrong.returncode == 2 and "apply to one model" in wrong.output
    neither = run(["make", "--no-print-directory", "pin"])
    assert neither.returncode != 0 and "make pin host=RIG" in neither.output


def test_pin_host_stops_at_the_first_entry_it_cannot_pin(tmp_path: Path, hub: HfStandin, history: dict) -> None:
    _, copy = inventory_copy(tmp_path)
    with pytest.raises(
        PinError, match=rf"desktop3050: cannot pin '{DRAFTER}' \(pinned before it: {EXACT}\).*no such repository"
    ):
        pin_host(
            "desktop3050", [EXACT, DRAFTER], catalog_path=str(copy), api=HubApi(hub.base_url, allow_insecure_http=True)
        )
    assert entry(copy, EXACT)["revision"] == C3  # kept: a re-run continues with the drafter


# ------------------------------------------------------------------ the token stays with the endpoint
def test_a_redirect_to_another_host_carries_no_token(
    catalog: Path, body: bytes, tls_files: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    target = entry(CATALOG, TARGET)
    ca, cert, key = tls_files
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))
    with (
        HfStandin(tls_cert=cert, tls_key=key) as other,
        HfStandin(require_token=TOKEN, tls_cert=cert, tls_key=key) as origin,
    ):
        other.add_commit(target["repo"], COMMIT, {target["filename"]: body})
        origin.add_commit(target["repo"], COMMIT, {target["filename"]: body})  # its header is read from the origin
        origin.redirect_api_to = f"https://127.0.0.1:{other.port}"  # another port: another origin
        result = pin(catalog, origin, revision="", token=TOKEN)
        assert result.revision == COMMIT
        assert origin.headers_seen and all(h.get("Authorization") == f"Bearer {TOKEN}" for h in origin.headers_seen)
        assert other.headers_seen and not any("Authorization" in h for h in other.headers_seen)
        assert [r.method for r in other.requests if "/paths-info/" in r.path] == ["POST"]  # 307 keeps the POST


def test_a_redirect_to_plain_http_is_refused(
    catalog: Path, body: bytes, tls_files: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    ca, cert, key = tls_files
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))  # trust the throwaway CA, as a real endpoint's is trusted
    target = entry(CATALOG, TARGET)
    with HfStandin() as plain, HfStandin(tls_cert=cert, tls_key=key, require_token=TOKEN) as secure:
        plain.add_commit(target["repo"], COMMIT, {target["filename"]: body})
        secure.redirect_api_to = f"http://127.0.0.1:{plain.port}"
        for insecure_ok in (False, True):  # no downgrade, whatever --allow-insecure-http says
            with pytest.raises(PinError, match=r"refusing a redirect to plain http://.*from https://") as refused:
                pin_entry(
                    TARGET,
                    "",
                    catalog_path=str(catalog),
                    api=HubApi(secure.base_url, token=TOKEN, allow_insecure_http=insecure_ok),
                )
            assert TOKEN not in str(refused.value)
        assert plain.requests == [] and plain.headers_seen == []
        assert all(h.get("Authorization") == f"Bearer {TOKEN}" for h in secure.headers_seen)


def test_redirects_are_bounded(catalog: Path, hub: HfStandin) -> None:
    hub.redirect_api_to = hub.base_url  # every API request answers 307 to itself
    with pytest.raises(PinError, match=r"more than 10 redirects"):
        pin(catalog, hub, revision="")
    assert len(hub.requests) == 11


@pytest.mark.parametrize(
    ("status", "location", "method", "kept_token", "next_method"),
    [
        (307, "http://127.0.0.1:1/x", "POST", True, "POST"),  # same origin
        (308, "http://127.0.0.1:2/x", "POST", False, "POST"),  # another port is another origin
        (302, "http://localhost:1/x", "GET", False, "GET"),  # another name for the same address: another host
        (303, "/x", "POST", True, "GET"),
        (301, "/x", "POST", True, "GET"),
    ],
)
def test_the_redirect_policy(status: int, location: str, method: str, kept_token: bool, next_method: str) -> None:
    hop = next_hop(
        current_url="http://127.0.0.1:1/api/a",
        origin_url="http://127.0.0.1:1/api/a",
        status=status,
        location=location,
        method=method,
        headers={"Authorization": "Bearer x", "Content-Type": "application/x-www-form-urlencoded"},
        body=b"paths=x" if method == "POST" else None,
        allow_insecure_http=True,
    )
    assert ("Authorization" in hop.headers, hop.method) == (kept_token, next_method)
    assert (hop.body is None) == (next_method == "GET")
    with pytest.raises(UrlRefused, match="refusing a redirect to plain http://"):
        next_hop(
            current_url="https://h/a",
            origin_url="https://h/a",
            status=status,
            location="http://h/a",
            method=method,
            headers={},
            body=None,
            allow_insecure_http=True,
        )


# ------------------------------------------------------------------ shape facts from the GGUF header
GOOGLE = "gemma-4-E4B-it-qat-q4_0-google"  # pinned (revision, sha256, size), no shape: facts


def test_pin_host_measures_the_shape_of_a_pinned_entry_from_its_header_by_range_requests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The header is read from the file's first bytes, more of them while it is cut short, never the whole file;
    what is recorded gives the memory model the figures of the header itself."""
    from ansible.module_utils.gguf_metadata import read_gguf_metadata
    from ansible.module_utils.preflight.server import estimate_memory

    from rigkit.validation.catalog_shape import catalog_meta, shape_facts

    _, copy = inventory_copy(tmp_path)
    google = entry(CATALOG, GOOGLE)
    assert "shape" not in google and google["revision"]
    gguf = write_target(tmp_path / "target.gguf")
    monkeypatch.setattr(hf_api, "HEADER_READS", (256, 4096, 1 << 20))  # the tiny header spans the first two reads
    with HfStandin() as hub:
        hub.add_commit(
            google["repo"],
            google["revision"],
            {google["filename"]: gguf.read_bytes()},
            sha256={google["filename"]: google["sha256"]},
            size={google["filename"]: google["size"]},
        )
        done, already = pin_host(
            "laptop1650ti", [GOOGLE], catalog_path=str(copy), api=HubApi(hub.base_url, allow_insecure_http=True)
        )
        ranges = [r.range for r in hub.requests if "/resolve/" in r.path]
    assert already == [] and [result.name for result in done] == [GOOGLE]
    assert ranges[:2] == ["bytes=0-255", "bytes=0-4095"] and all(r and r.startswith("bytes=0-") for r in ranges)
    recorded = entry(copy, GOOGLE)
    assert {key: recorded[key] for key in ("revision", "sha256", "size")} == {
        key: google[key] for key in ("revision", "sha256", "size")
    }
    real = read_gguf_metadata(gguf)
    assert recorded["shape"] == shape_facts(real)[1] and recorded["architecture"] == "gemma4"
    settings = {"ctx_size": 512, "parallel": 1, "flash_attn": "on", "gpu_layers": "all", "headroom_mib": 256}
    assert estimate_memory(catalog_meta(GOOGLE, recorded), None, **settings).as_dict() == (
        estimate_memory(real, None, **settings).as_dict()
    )
    assert "attention.sliding_window_pattern: [" in copy.read_text()  # a per-layer list on one line
    # measured once: the next run has nothing to do
    with HfStandin() as hub:
        assert pin_host(
            "laptop1650ti", [GOOGLE], catalog_path=str(copy), api=HubApi(hub.base_url, allow_insecure_http=True)
        ) == ([], [GOOGLE])


def test_a_hub_that_ignores_range_is_refused_without_reading_the_file(tmp_path: Path) -> None:
    from tests.fixtures.hf_standin import Fault

    _, copy = inventory_copy(tmp_path)
    google = entry(CATALOG, GOOGLE)
    with HfStandin() as hub:
        body = write_arch_gguf(tmp_path / "big.gguf", "gemma4", padding_bytes=20 << 20).read_bytes()
        hub.add_commit(
            google["repo"],
            google["revision"],
            {google["filename"]: body},
            sha256={google["filename"]: google["sha256"]},
            size={google["filename"]: google["size"]},
        )
        hub.add_fault(google["repo"], google["revision"], google["filename"], Fault("ignore_range"))
        with pytest.raises(PinError, match="answered more than 8388608 bytes"):
            pin_entry(GOOGLE, None, catalog_path=str(copy), api=HubApi(hub.base_url, allow_insecure_http=True))
    assert "shape" not in entry(copy, GOOGLE)


def test_the_pin_line_says_what_was_measured(capsys: pytest.CaptureFixture[str]) -> None:
    from rigkit.cli.pin import _print_pin
    from rigkit.pinning.models import PinResult

    google = entry(CATALOG, GOOGLE)
    pins = {key: google[key] for key in ("revision", "sha256", "size")}
    shape = {"block_count": 42, "context_length": 131072, "weights_bytes": 5 << 30, "gpu_weights_bytes": 3 << 30}
    common = {"name": GOOGLE, "catalog": "c.yml", "repo": google["repo"], "filename": google["filename"], **pins}
    _print_pin(PinResult(**common, changed=True, previous=pins, shape=shape))
    printed = capsys.readouterr().out.splitlines()
    where = f"{google['repo']} @ {google['revision']} : {google['filename']}"
    assert printed[0] == f"{GOOGLE}: already pinned to {where}; recorded its shape facts"
    assert printed[1] == (
        "  shape  2 header facts, weights 5,120 MiB (3,072 MiB of them on the GPU with every layer offloaded), read "
        "from the GGUF's first bytes"
    )


def test_make_provision_pins_trusted_entries_on_first_use(tmp_path: Path, tls_files: tuple[Path, Path, Path]) -> None:
    """The seed rigs in one command: entries with a trusted sha256 but no revision are pinned by make provision as
    make pin would, said and left for the user to commit; without the Hub the validation's refusal stays."""
    hosts, copy = inventory_copy(tmp_path)
    ca, cert, key = tls_files
    exact, drafter = entry(CATALOG, EXACT), entry(CATALOG, DRAFTER)
    assert not exact["revision"] and not drafter["revision"]
    unreachable_rig = "ARGS=-e ansible_host=127.0.0.1 -e ansible_port=1"
    offline = run(
        ["make", "--no-print-directory", "provision", "host=desktop3050", unreachable_rig],
        ANSIBLE_INVENTORY=str(hosts),
        HF_ENDPOINT="https://127.0.0.1:9",
    )
    assert offline.returncode != 0 and f"rigkit: {EXACT} (desktop3050) not pinned on first use: cannot reach" in (
        offline.output
    )
    assert "make pin host=desktop3050" in offline.output and entry(copy, EXACT)["revision"] is None
    with HfStandin(tls_cert=cert, tls_key=key) as hub:
        name = exact["filename"]
        reported = {"sha256": {name: exact["sha256"]}, "size": {name: exact["size"]}}
        hub.add_commit(exact["repo"], C2, {name: b"GGUF" + b"e" * 900}, **reported)
        name = drafter["filename"]
        hub.add_commit(drafter["repo"], C1, {name: b"GGUF" + b"d" * 900}, sha256={name: drafter["sha256"]})
        done = run(
            ["make", "--no-print-directory", "provision", "host=desktop3050", unreachable_rig],
            ANSIBLE_INVENTORY=str(hosts),
            HF_ENDPOINT=hub.base_url,
            SSL_CERT_FILE=str(ca),
        )
    shown = os.path.relpath(copy, REPO)
    assert f"rigkit: {EXACT} (desktop3050) pinned on first use to {exact['repo']} @ {C2}" in done.output, done.tail()
    assert f"in {shown}: commit it (git commit {shown})" in done.output
    assert (entry(copy, EXACT)["revision"], entry(copy, DRAFTER)["revision"], entry(copy, DRAFTER)["size"]) == (
        C2,
        C1,
        904,
    )
    counters = recap(done.output)["desktop3050"]  # past the validation: only the rig itself is not there
    assert (counters["failed"], counters["unreachable"]) == (0, 1), done.tail()
    again = run(["python", "bin/rigkit", "pin", "--first-use", "--host", "desktop3050"], ANSIBLE_INVENTORY=str(hosts))
    assert again.returncode == 0 and again.output == ""  # nothing left to pin: silent, and no Hub asked
