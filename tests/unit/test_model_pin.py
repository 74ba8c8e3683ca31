"""`make pin` / `rigkit pin` (module_utils/model_pin.py) against the Hugging Face stand-in, on a copy of the catalog."""

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
from ansible.module_utils.model_pin import PinError, pin_entry

from tests.fixtures.hf_standin import HfStandin
from tests.support import run

REPO = Path(__file__).resolve().parents[2]
CATALOG = REPO / "inventory" / "group_vars" / "all" / "model_catalog.yml"
COMMIT = "a1b2c3d4e5f60718293a4b5c6d7e8f9012345678"
NEWER = "fedcba9876543210fedcba9876543210fedcba98"
TARGET = "gemma-4-E2B-it-qat-q4_0-exact"  # listed with repo and filename, nothing pinned
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
def body() -> bytes:
    return b"GGUF" + os.urandom(5000)


@pytest.fixture
def hub(body: bytes) -> Iterator[HfStandin]:
    with HfStandin() as server:
        target = entry(CATALOG, TARGET)
        server.add_file(target["repo"], COMMIT, target["filename"], body)
        server.add_ref(target["repo"], "main", COMMIT)
        yield server


def pin(catalog: Path, hub: HfStandin, name: str = TARGET, revision: str = COMMIT, **kw: object):
    return pin_entry(name, revision, catalog_path=str(catalog), endpoint=hub.base_url, allow_insecure_http=True, **kw)


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
    assert len(changed) == 6, changed  # revision, sha256, size: three lines out, three in
    assert all(line.lstrip("+-").strip().split(":")[0] in ("revision", "sha256", "size") for line in changed)
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
    with pytest.raises(PinError, match="refusing to replace the pin") as refused:
        pin(catalog, hub, revision=NEWER)
    message = str(refused.value)
    for old, new in ((COMMIT, NEWER), (hashlib.sha256(body).hexdigest(), hashlib.sha256(newer).hexdigest())):
        assert f"{old} -> {new}" in message
    assert f"size: {len(body)} -> {len(newer)}" in message
    assert "force=1" in message
    assert catalog.read_text() == text  # untouched

    result = pin(catalog, hub, revision=NEWER, force=True)
    assert result.changed and result.previous["revision"] == COMMIT
    assert entry(catalog, TARGET)["sha256"] == hashlib.sha256(newer).hexdigest()


def test_a_recorded_sha256_that_disagrees_is_never_replaced_silently(catalog: Path, hub: HfStandin) -> None:
    drafter = entry(CATALOG, DRAFTER)
    hub.add_file(drafter["repo"], COMMIT, drafter["filename"], b"GGUF not the article's file")
    with pytest.raises(PinError, match=f"sha256: {drafter['sha256']} -> "):
        pin(catalog, hub, name=DRAFTER)
    assert entry(catalog, DRAFTER) == drafter


def test_a_recorded_sha256_that_agrees_is_completed(catalog: Path, hub: HfStandin) -> None:
    drafter = entry(CATALOG, DRAFTER)
    # The stand-in reports the sha256 it is told (as HF reports the LFS oid), so the article's value can match.
    hub.add_file(drafter["repo"], COMMIT, drafter["filename"], b"x" * 777, sha256=drafter["sha256"])
    result = pin(catalog, hub, name=DRAFTER)
    assert result.changed
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
        (TARGET, "", "give the revision"),
        ("gemma-4-e4b-it-mtp-assistant-ultralight-f16", COMMIT, "has no repo"),
    ],
)
def test_bad_requests_fail_clearly(catalog: Path, hub: HfStandin, name: str, revision: str, message: str) -> None:
    with pytest.raises(PinError, match=message):
        pin(catalog, hub, name=name, revision=revision)


def test_unknown_repository(catalog: Path, hub: HfStandin) -> None:
    # Another entry whose repository the stand-in does not know.
    with pytest.raises(PinError, match=r"repository xbill9/gemma-4-E4B-it-qat-q4_0-exact-gguf not found.*HF_TOKEN"):
        pin(catalog, hub, name="gemma-4-E4B-it-qat-q4_0-exact")


def test_unknown_file(catalog: Path, hub: HfStandin) -> None:
    target = entry(CATALOG, TARGET)
    hub.add_file(target["repo"], NEWER, "some-other.gguf", b"GGUF")
    with pytest.raises(PinError, match=f"{target['filename']} does not exist in {target['repo']} at {NEWER}"):
        pin(catalog, hub, revision=NEWER)


def test_gated_repository_needs_the_token(catalog: Path, body: bytes) -> None:
    target = entry(CATALOG, TARGET)
    with HfStandin(require_token=TOKEN) as gated:
        gated.add_file(target["repo"], COMMIT, target["filename"], body)
        with pytest.raises(PinError, match=r"HTTP 401.*set HF_TOKEN"):
            pin(catalog, gated)
        with pytest.raises(PinError, match="HTTP 403"):
            pin(catalog, gated, token="hf_wrong")  # noqa: S106 - a deliberately wrong token
        assert pin(catalog, gated, token=TOKEN).changed


def test_plain_http_endpoint_needs_the_flag(catalog: Path, hub: HfStandin) -> None:
    with pytest.raises(PinError, match="refusing http://"):
        pin_entry(TARGET, COMMIT, catalog_path=str(catalog), endpoint=hub.base_url)


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
    assert "refusing to replace the pin" in refused.output and f"{COMMIT} -> {NEWER}" in refused.output
    forced = run(
        ["make", "--no-print-directory", "pin", f"model={TARGET}", f"revision={NEWER}", "force=1", f"ARGS={args}"]
    )
    assert forced.returncode == 0, forced.output
    assert entry(catalog, TARGET)["revision"] == NEWER
    assert CATALOG.read_text() != catalog.read_text()  # the real catalog was never the one written
