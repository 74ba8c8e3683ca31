"""module_utils/fetch/model.py and library/gguf_fetch.py against a real HTTP(S) stand-in for Hugging Face.

Every failure test also checks the invariant: the final path holds the previous good file, byte-identical
(or nothing, when there was none), and no stray .part is left unless the failure is a resumable one.

The stand-in server and model fixtures are tests/unit/conftest.py's, the helpers tests/support.py's; the
hardening, thread and resume tests have files of their own.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import secrets
import shutil
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import ansible.module_utils.fetch.model as model_fetch
import pytest
import yaml
from ansible.module_utils.fetch.model import (
    DiskSpaceError,
    DownloadError,
    EntryError,
    HttpStatusError,
    InsecureUrlError,
    LockedError,
    TlsError,
    VerificationError,
    fetch_model,
)

from rigkit.sandbox.gemma3_270m import SHA256 as GEMMA3_SHA256
from rigkit.sandbox.tiny_gemma4 import write_arch_gguf
from tests.fixtures.hf_standin import Fault, HfStandin
from tests.support import (
    HF_REPO,
    REV,
    MiB,
    Served,
    assert_installed,
    assert_untouched,
    describe,
    options,
    part_of,
    run_gguf_fetch,
    seed_previous,
    sha256,
    tls_options,
)

REPO = Path(__file__).resolve().parents[2]
TOKEN = f"hf_{secrets.token_hex(12)}"  # generated: a literal would look like a leaked secret
OTHER_TOKEN = f"hf_{secrets.token_hex(12)}"


# ------------------------------------------------------------------------------------------ success paths
def test_happy_path(hub: HfStandin, tiny: Served, models: Path) -> None:
    tiny.publish(hub)
    dest = models / tiny.filename
    result = fetch_model(tiny.entry(), dest, options(hub))
    assert result.changed and result.operation == "download" and result.verification == "download"
    assert result.bytes_downloaded == tiny.size and result.resumed_from == 0 and result.attempts == 1
    assert_installed(dest, tiny, result)
    assert tiny.served_by(hub) == tiny.size


def test_second_run_changes_nothing_and_downloads_nothing(
    hub: HfStandin, tiny: Served, models: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tiny.publish(hub)
    dest = models / tiny.filename
    fetch_model(tiny.entry(), dest, options(hub))
    hub.reset_counters()
    hashed: list[str] = []
    real = model_fetch.sha256_file
    monkeypatch.setattr(model_fetch, "sha256_file", lambda p, *a: hashed.append(p) or real(p, *a))
    again = fetch_model(tiny.entry(), dest, options(hub))
    assert (again.changed, again.bytes_downloaded, again.verification, again.operation) == (False, 0, "fast", "none")
    assert hashed == [] and hub.requests == []
    assert_installed(dest, tiny, again)


def test_existing_file_without_record_is_hashed_once_then_fast(hub: HfStandin, tiny: Served, models: Path) -> None:
    dest = models / tiny.filename
    shutil.copyfile(tiny.path, dest)  # e.g. copied in by hand
    first = fetch_model(tiny.entry(), dest, options(hub))
    assert (first.changed, first.verification, first.bytes_downloaded) == (False, "full", 0)
    assert fetch_model(tiny.entry(), dest, options(hub)).verification == "fast"
    assert hub.requests == []


def test_hf_style_cdn_redirect_is_followed(tiny: Served, models: Path) -> None:
    with HfStandin(cdn_redirect=True) as hub:
        tiny.publish(hub)
        result = fetch_model(tiny.entry(), models / tiny.filename, options(hub))
        assert [r.status for r in hub.requests] == [302, 200]
    assert_installed(models / tiny.filename, tiny, result)


def test_token_is_sent_and_dropped_on_cross_host_redirect(
    tiny: Served, models: Path, tls_files: tuple[Path, Path, Path]
) -> None:
    ca, cert, key = tls_files
    with (
        HfStandin(require_token=TOKEN, tls_cert=cert, tls_key=key) as origin,
        HfStandin(tls_cert=cert, tls_key=key) as cdn,
    ):
        tiny.publish(origin)
        tiny.publish(cdn)
        tiny.fault(origin, Fault("redirect", location=cdn.file_url(tiny.repo, tiny.revision, tiny.filename)))
        result = fetch_model(tiny.entry(), models / tiny.filename, tls_options(origin, ca, token=TOKEN))
        assert [r.authorized for r in origin.requests] == [True]
        assert [r.authorized for r in cdn.requests] == [False]
        assert TOKEN not in json.dumps(result.as_dict())
    assert_installed(models / tiny.filename, tiny, result)


def test_https_with_custom_ca_file(tiny: Served, models: Path, tls_files: tuple[Path, Path, Path]) -> None:
    ca, cert, key = tls_files
    with HfStandin(tls_cert=cert, tls_key=key) as hub:
        assert hub.base_url.startswith("https://")
        tiny.publish(hub)
        dest = models / tiny.filename
        with pytest.raises(TlsError, match=r"not trusted.*ca_file"):
            fetch_model(tiny.entry(), dest, options(hub, allow_insecure_http=False))
        assert_untouched(dest, None)
        result = fetch_model(tiny.entry(), dest, options(hub, allow_insecure_http=False, ca_file=str(ca)))
    assert_installed(dest, tiny, result)


# ------------------------------------------------------------------------------------------ resume & retry
def test_connection_reset_mid_body_resumes_with_little_resent(hub: HfStandin, medium: Served, models: Path) -> None:
    medium.publish(hub)
    medium.fault(hub, Fault("reset", after_bytes=3 * MiB))
    dest = models / medium.filename
    previous = seed_previous(dest)
    result = fetch_model(medium.entry(), dest, options(hub))
    assert_installed(dest, medium, result)
    assert result.operation == "replace" and result.attempts == 2
    assert any("connection lost" in e for e in result.events)
    ranges = [r.range for r in hub.requests]
    assert ranges[0] is None and ranges[1] is not None and ranges[1].startswith("bytes=")
    resent = medium.served_by(hub) - medium.size
    assert 0 <= resent <= medium.size // 100, f"{resent} bytes sent twice"
    assert previous != medium.sha256


def test_part_from_interrupted_run_is_resumed(hub: HfStandin, medium: Served, models: Path) -> None:
    medium.publish(hub)
    medium.fault(hub, Fault("reset", after_bytes=3 * MiB), Fault("status", status=503, times=None))
    dest = models / medium.filename
    previous = seed_previous(dest)
    with pytest.raises(DownloadError, match=r"HTTP 503.*partial file \(\d+ bytes\) is kept"):
        fetch_model(medium.entry(), dest, options(hub, retries=1))
    assert_untouched(dest, previous, part_kept=True)
    kept = part_of(dest).stat().st_size
    assert 0 < kept <= 3 * MiB

    hub.clear_faults()
    result = fetch_model(medium.entry(), dest, options(hub))
    assert_installed(dest, medium, result)
    assert (result.operation, result.resumed_from, result.restarted) == ("resume", kept, False)
    assert result.bytes_downloaded == medium.size - kept
    assert hub.requests[-1].range == f"bytes={kept}-"
    assert medium.served_by(hub) - medium.size <= medium.size // 100


def interrupted_download(hub: HfStandin, medium: Served, models: Path) -> tuple[Path, int]:
    """A download cut after 2 MiB with every retry refused: (its destination, the bytes of the part it kept)."""
    medium.publish(hub)
    medium.fault(hub, Fault("reset", after_bytes=2 * MiB), Fault("status", status=500, times=None))
    dest = models / medium.filename
    with pytest.raises(DownloadError):
        fetch_model(medium.entry(), dest, options(hub, retries=0))
    return dest, part_of(dest).stat().st_size


def test_server_ignoring_range_restarts_cleanly(hub: HfStandin, medium: Served, models: Path) -> None:
    dest, kept = interrupted_download(hub, medium, models)
    hub.clear_faults()
    hub.reset_counters()
    medium.fault(hub, Fault("ignore_range", times=None))
    result = fetch_model(medium.entry(), dest, options(hub))
    assert_installed(dest, medium, result)
    assert (result.resumed_from, result.restarted, result.bytes_downloaded) == (kept, True, medium.size)
    assert [r.status for r in hub.requests] == [200]


def test_truncated_bodies_are_resumed_until_complete(hub: HfStandin, medium: Served, models: Path) -> None:
    """The server closes every response early (lying Content-Length); each resume makes progress."""
    medium.publish(hub)
    medium.fault(hub, Fault("truncate", after_bytes=medium.size // 3 + 1, times=None))
    dest = models / medium.filename
    result = fetch_model(medium.entry(), dest, options(hub, retries=1))
    assert_installed(dest, medium, result)
    assert result.attempts == 3
    assert medium.served_by(hub) == medium.size


def test_truncated_body_without_progress_gives_up(hub: HfStandin, tiny: Served, models: Path) -> None:
    tiny.publish(hub)
    tiny.fault(hub, Fault("truncate", after_bytes=0, times=None))
    dest = models / tiny.filename
    previous = seed_previous(dest)
    with pytest.raises(DownloadError, match=r"failed after 3 attempts.*connection closed after 0 of"):
        fetch_model(tiny.entry(), dest, options(hub, retries=2))
    assert_untouched(dest, previous)  # nothing received: no part worth keeping


def test_500_then_success(hub: HfStandin, tiny: Served, models: Path) -> None:
    tiny.publish(hub)
    tiny.fault(hub, Fault("status", status=500, times=2))
    result = fetch_model(tiny.entry(), models / tiny.filename, options(hub))
    assert_installed(models / tiny.filename, tiny, result)
    assert result.attempts == 3 and sum("HTTP 500" in e for e in result.events) == 2


def test_500_forever_gives_up_after_bounded_attempts(hub: HfStandin, tiny: Served, models: Path) -> None:
    tiny.publish(hub)
    tiny.fault(hub, Fault("status", status=502, times=None))
    dest = models / tiny.filename
    previous = seed_previous(dest)
    with pytest.raises(DownloadError, match=rf"{HF_REPO} @ {REV} : {tiny.filename} failed after 4 attempts"):
        fetch_model(tiny.entry(), dest, options(hub, retries=3))
    assert len(hub.requests) == 4
    assert_untouched(dest, previous)


def test_stalled_server_times_out_and_keeps_part(hub: HfStandin, tiny: Served, models: Path) -> None:
    tiny.publish(hub)
    tiny.fault(
        hub, Fault("stall", after_bytes=1000, seconds=30), Fault("stall", after_bytes=10, seconds=30, times=None)
    )
    dest = models / tiny.filename
    previous = seed_previous(dest)
    started = time.monotonic()
    with pytest.raises(DownloadError, match="read timeout"):
        fetch_model(tiny.entry(), dest, options(hub, read_timeout=0.3, retries=1))
    assert time.monotonic() - started < 10
    assert_untouched(dest, previous, part_kept=True)
    assert part_of(dest).stat().st_size == 1010  # 1000 bytes, then 10 on the retry: too little to count

    hub.clear_faults()
    result = fetch_model(tiny.entry(), dest, options(hub))
    assert_installed(dest, tiny, result)
    assert result.resumed_from == 1010


def test_stall_once_then_success(hub: HfStandin, tiny: Served, models: Path) -> None:
    tiny.publish(hub)
    tiny.fault(hub, Fault("stall", after_bytes=50_000, seconds=30))
    result = fetch_model(tiny.entry(), models / tiny.filename, options(hub, read_timeout=0.3))
    assert_installed(models / tiny.filename, tiny, result)
    assert result.attempts == 2 and tiny.served_by(hub) == tiny.size


# ------------------------------------------------------------------------------------------ hard failures
@pytest.mark.parametrize(
    ("status", "match"),
    [(404, "HTTP 404.*no such file at that revision"), (403, "HTTP 403.*access denied"), (401, "HTTP 401.*gated")],
)
def test_http_errors_fail_at_once_naming_the_file(
    hub: HfStandin, tiny: Served, models: Path, status: int, match: str
) -> None:
    tiny.publish(hub)
    tiny.fault(hub, Fault("status", status=status, times=None))
    dest = models / tiny.filename
    previous = seed_previous(dest)
    with pytest.raises(HttpStatusError, match=match) as err:
        fetch_model(tiny.entry(), dest, options(hub))
    assert err.value.status == status
    assert f"{HF_REPO} @ {REV} : {tiny.filename}" in str(err.value)
    assert len(hub.requests) == 1  # no retries
    assert_untouched(dest, previous)


def test_a_missing_file_answers_404_and_an_unknown_repo_401(hub: HfStandin, tiny: Served, models: Path) -> None:
    """Without a token the Hub answers 401 for a repository it will not show (absent, private or gated)."""
    tiny.publish(hub)
    with pytest.raises(HttpStatusError, match=r"EntryNotFound.*no such file at that revision") as missing:
        fetch_model(tiny.entry(filename="nope.gguf"), models / "nope.gguf", options(hub))
    with pytest.raises(HttpStatusError, match=r"RepoNotFound.*no such repository, or it is private or gated") as absent:
        fetch_model(tiny.entry(repo="rigkit-test/absent"), models / "x.gguf", options(hub))
    assert (missing.value.status, absent.value.status) == (404, 401)
    assert list(models.iterdir()) in ([], [models / ".rigkit-verified"])


def test_gated_repo_without_and_with_wrong_token(
    tiny: Served, models: Path, tls_files: tuple[Path, Path, Path]
) -> None:
    ca, cert, key = tls_files
    with HfStandin(require_token=TOKEN, tls_cert=cert, tls_key=key) as hub:
        tiny.publish(hub)
        dest = models / tiny.filename
        with pytest.raises(HttpStatusError, match=r"HTTP 401.*GatedRepo.*the repository is gated.*set HF_TOKEN"):
            fetch_model(tiny.entry(), dest, tls_options(hub, ca))
        with pytest.raises(HttpStatusError, match="HTTP 403") as err:
            fetch_model(tiny.entry(), dest, tls_options(hub, ca, token=OTHER_TOKEN))
        assert OTHER_TOKEN not in str(err.value)
        assert_untouched(dest, None)
        assert_installed(dest, tiny, fetch_model(tiny.entry(), dest, tls_options(hub, ca, token=TOKEN)))


def test_the_token_never_travels_over_plain_http(tiny: Served, models: Path) -> None:
    """A plain-http endpoint (a local stand-in or mirror) gets no token, even one that is configured."""
    with HfStandin() as hub:
        tiny.publish(hub)
        result = fetch_model(tiny.entry(), models / tiny.filename, options(hub, token=TOKEN))
        assert hub.requests and not any(r.authorized for r in hub.requests)
    assert_installed(models / tiny.filename, tiny, result)


def test_wrong_sha256(hub: HfStandin, tiny: Served, models: Path) -> None:
    tiny.publish(hub)
    dest = models / tiny.filename
    previous = seed_previous(dest)
    wrong = "0" * 64
    with pytest.raises(VerificationError, match=f"sha256 mismatch.*expected {wrong}, got {tiny.sha256}") as err:
        fetch_model(tiny.entry(sha256=wrong), dest, options(hub))
    assert (err.value.what, err.value.expected, err.value.actual) == ("sha256", wrong, tiny.sha256)
    assert_untouched(dest, previous)


def test_served_file_of_wrong_size(hub: HfStandin, tiny: Served, models: Path) -> None:
    """The origin holds a truncated copy (honest Content-Length): refused before the body is kept."""
    hub.add_file(tiny.repo, tiny.revision, tiny.filename, tiny.path.read_bytes()[:-4096])
    dest = models / tiny.filename
    previous = seed_previous(dest)
    with pytest.raises(VerificationError, match=f"pinned {tiny.size} bytes.*says {tiny.size - 4096}"):
        fetch_model(tiny.entry(), dest, options(hub))
    assert_untouched(dest, previous)


def test_corrupted_part_is_discarded_and_next_run_recovers(hub: HfStandin, medium: Served, models: Path) -> None:
    medium.publish(hub)
    medium.fault(hub, Fault("reset", after_bytes=2 * MiB), Fault("status", status=500, times=None))
    dest = models / medium.filename
    previous = seed_previous(dest)
    with pytest.raises(DownloadError):
        fetch_model(medium.entry(), dest, options(hub, retries=0))
    with open(part_of(dest), "r+b") as fh:  # bit rot in the kept part
        fh.seek(1000)
        fh.write(b"\xff" * 16)
    hub.clear_faults()
    with pytest.raises(VerificationError, match="sha256 mismatch"):
        fetch_model(medium.entry(), dest, options(hub))
    assert_untouched(dest, previous)
    assert_installed(dest, medium, fetch_model(medium.entry(), dest, options(hub)))


def test_wrong_architecture(hub: HfStandin, tmp_path: Path, models: Path) -> None:
    llama = describe(write_arch_gguf(tmp_path / "llama.gguf", "llama", padding_bytes=4096), "llama.gguf", "llama")
    llama.publish(hub)
    dest = models / "llama.gguf"
    previous = seed_previous(dest)
    with pytest.raises(VerificationError, match=r"model_catalog says 'gemma4'.*general.architecture is 'llama'") as e:
        fetch_model(llama.entry(architecture="gemma4"), dest, options(hub))
    assert (e.value.what, e.value.expected, e.value.actual) == ("architecture", "gemma4", "llama")
    assert_untouched(dest, previous)


def test_pinned_file_that_is_not_gguf(hub: HfStandin, tmp_path: Path, models: Path) -> None:
    page = tmp_path / "page.gguf"
    page.write_bytes(b"<html>" + b"x" * 5000)
    served = describe(page, "page.gguf", "gemma4").publish(hub)
    dest = models / "page.gguf"
    with pytest.raises(VerificationError, match=r"not a usable GGUF.*magic"):
        fetch_model(served.entry(), dest, options(hub))
    assert_untouched(dest, None)


def test_plain_http_base_refused(hub: HfStandin, tiny: Served, models: Path) -> None:
    tiny.publish(hub)
    with pytest.raises(InsecureUrlError, match=r"refusing the base URL plain http://.*allow_insecure_http"):
        fetch_model(tiny.entry(), models / tiny.filename, options(hub, allow_insecure_http=False))
    assert hub.requests == []
    assert_untouched(models / tiny.filename, None)


def test_redirect_to_plain_http_refused(tiny: Served, models: Path, tls_files: tuple[Path, Path, Path]) -> None:
    ca, cert, key = tls_files
    with HfStandin(tls_cert=cert, tls_key=key) as secure, HfStandin() as plain:
        tiny.publish(secure)
        tiny.publish(plain)
        tiny.fault(secure, Fault("redirect", location=plain.file_url(tiny.repo, tiny.revision, tiny.filename)))
        dest = models / tiny.filename
        previous = seed_previous(dest)
        opts = options(secure, allow_insecure_http=False, ca_file=str(ca), token=TOKEN)
        with pytest.raises(InsecureUrlError, match="refusing a redirect to plain http://"):
            fetch_model(tiny.entry(), dest, opts)
        assert plain.requests == [] and tiny.served_by(plain) == 0
        assert_untouched(dest, previous)


def _catalog() -> dict[str, Any]:
    with open(REPO / "inventory/group_vars/all/model_catalog.yml") as fh:
        return yaml.safe_load(fh)["model_catalog"]


@pytest.mark.parametrize(
    "name", [n for n, e in _catalog().items() if not (e.get("sha256") and e.get("size") and e.get("revision"))]
)
def test_unpinned_catalog_entries_refused(hub: HfStandin, models: Path, name: str) -> None:
    entry = _catalog()[name]
    with pytest.raises(EntryError, match=rf"make pin model={name}`"):
        fetch_model(entry, models / "x.gguf", options(hub), name=name)
    with pytest.raises(EntryError, match="make pin"):
        fetch_model(entry, models / "x.gguf", options(hub, check_mode=True), name=name)
    assert hub.requests == [] and list(models.iterdir()) == []


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ({"revision": "main"}, "full 40-character commit"),
        ({"revision": None}, r"not pinned \(revision missing\)"),
        ({"sha256": None, "size": None}, r"not pinned \(sha256, size missing\)"),
        ({"sha256": "abc"}, "64 lowercase hex digits"),
        ({"size": 0}, "size must be a positive number of bytes"),
        ({"filename": "../../etc/passwd"}, "plain relative path"),
        ({"repo": None}, "set its repo"),
    ],
)
def test_malformed_entries_refused(hub: HfStandin, tiny: Served, models: Path, override: dict, match: str) -> None:
    with pytest.raises(EntryError, match=match):
        fetch_model(tiny.entry(**override), models / tiny.filename, options(hub), name="tiny")
    assert hub.requests == []


def test_disk_too_small_refused_before_download(hub: HfStandin, medium: Served, tiny_disk: Path) -> None:
    medium.publish(hub)
    dest = tiny_disk / medium.filename
    previous = seed_previous(dest)
    with pytest.raises(DiskSpaceError, match=rf"not enough free space in {tiny_disk}.*need {medium.size} bytes"):
        fetch_model(medium.entry(), dest, options(hub))
    assert hub.requests == []
    assert_untouched(dest, previous)


def test_disk_filling_up_mid_download(
    hub: HfStandin, medium: Served, tiny_disk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The space check passes (something else fills the disk meanwhile): ENOSPC removes the part."""
    monkeypatch.setattr(model_fetch, "_free_bytes", lambda directory: 1 << 40)
    medium.publish(hub)
    dest = tiny_disk / medium.filename
    previous = seed_previous(dest)
    with pytest.raises(DiskSpaceError, match="disk full while writing"):
        fetch_model(medium.entry(), dest, options(hub))
    assert_untouched(dest, previous)
    assert shutil.disk_usage(tiny_disk).free > 512 * 1024  # the part's space was given back


def test_concurrent_fetch_is_refused(hub: HfStandin, tiny: Served, models: Path) -> None:
    tiny.publish(hub)
    dest = models / tiny.filename
    (models / ".rigkit-verified").mkdir()
    with open(models / ".rigkit-verified" / f"{tiny.filename}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with pytest.raises(LockedError, match="another fetch is writing"):
            fetch_model(tiny.entry(), dest, options(hub))
    assert_untouched(dest, None)


def test_missing_dest_dir(hub: HfStandin, tiny: Served, tmp_path: Path) -> None:
    tiny.publish(hub)
    dest = tmp_path / "absent" / tiny.filename
    with pytest.raises(model_fetch.FetchError, match="does not exist: create it first"):
        fetch_model(tiny.entry(), dest, options(hub))
    planned = fetch_model(tiny.entry(), dest, options(hub, check_mode=True))
    assert planned.changed and planned.operation == "download"
    assert not dest.parent.exists()


# ------------------------------------------------------------------------------------------ verify modes
def test_full_verify_detects_in_place_corruption(hub: HfStandin, tiny: Served, models: Path) -> None:
    tiny.publish(hub)
    dest = models / tiny.filename
    fetch_model(tiny.entry(), dest, options(hub))
    st = dest.stat()
    with open(dest, "r+b") as fh:  # flip bytes in the tensor data, keep size and mtime
        fh.seek(tiny.size - 100)
        fh.write(b"\x00\x01\x02\x03")
    os.utime(dest, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert sha256(dest) != tiny.sha256

    fast = fetch_model(tiny.entry(), dest, options(hub))  # the documented blind spot of fast mode
    assert (fast.changed, fast.verification) == (False, "fast")

    planned = fetch_model(tiny.entry(), dest, options(hub, verify="full", check_mode=True))
    assert (planned.changed, planned.operation) == (True, "replace") and "sha256" in planned.reason
    assert sha256(dest) != tiny.sha256  # check mode changed nothing

    hub.reset_counters()
    repaired = fetch_model(tiny.entry(), dest, options(hub, verify="full"))
    assert (repaired.changed, repaired.operation, repaired.bytes_downloaded) == (True, "replace", tiny.size)
    assert "sha256" in repaired.reason
    assert_installed(dest, tiny, repaired)
    assert fetch_model(tiny.entry(), dest, options(hub, verify="full")).verification == "full"


def test_replaced_file_invalidates_record(hub: HfStandin, tiny: Served, models: Path) -> None:
    tiny.publish(hub)
    dest = models / tiny.filename
    fetch_model(tiny.entry(), dest, options(hub))
    seed_previous(dest)  # someone swapped the file: new inode/size/mtime
    result = fetch_model(tiny.entry(), dest, options(hub))
    assert result.changed and result.operation == "replace" and "size" in result.reason
    assert_installed(dest, tiny, result)


def test_fast_rerun_on_real_270m_model_does_not_rehash(
    hub: HfStandin, gemma3_270m_gguf: Path, models: Path, monkeypatch: pytest.MonkeyPatch, tiny: Served
) -> None:
    """Download the real 250 MB Gemma 3 270M from the stand-in, then re-run: no hashing, no request."""
    real = Served(gemma3_270m_gguf, "gemma-3-270m-it-Q4_K_M.gguf", GEMMA3_SHA256, 253_113_024, "gemma3")
    real.publish(hub)
    dest = models / real.filename
    started = time.perf_counter()
    result = fetch_model(real.entry(), dest, options(hub, read_timeout=30))
    download_s = time.perf_counter() - started
    assert result.bytes_downloaded == real.size and result.verification == "download"

    hashed: list[str] = []
    original = model_fetch.sha256_file
    monkeypatch.setattr(model_fetch, "sha256_file", lambda p, *a: hashed.append(p) or original(p, *a))
    hub.reset_counters()
    started = time.perf_counter()
    again = fetch_model(real.entry(), dest, options(hub))
    fast_s = time.perf_counter() - started
    assert (again.changed, again.verification, again.bytes_downloaded) == (False, "fast", 0)
    assert hashed == [] and hub.requests == []

    started = time.perf_counter()
    full = fetch_model(real.entry(), dest, options(hub, verify="full"))
    full_s = time.perf_counter() - started
    assert full.verification == "full" and hashed == [str(dest)]
    print(f"\n270M: download {download_s:.2f} s, fast re-run {fast_s * 1000:.1f} ms, full re-run {full_s:.2f} s")


# ------------------------------------------------------------------------------------------ check mode
def test_check_mode_reports_without_touching_anything(hub: HfStandin, tiny: Served, models: Path) -> None:
    tiny.publish(hub)
    dest = models / tiny.filename
    planned = fetch_model(tiny.entry(), dest, options(hub, check_mode=True))
    assert (planned.changed, planned.operation, planned.verification, planned.bytes_downloaded) == (
        True,
        "download",
        "none",
        0,
    )
    assert list(models.iterdir()) == [] and hub.requests == []
    fetch_model(tiny.entry(), dest, options(hub))
    after = fetch_model(tiny.entry(), dest, options(hub, check_mode=True))
    assert (after.changed, after.operation, after.verification) == (False, "none", "fast")


def test_check_mode_reports_resume(hub: HfStandin, medium: Served, models: Path) -> None:
    dest, kept = interrupted_download(hub, medium, models)
    planned = fetch_model(medium.entry(), dest, options(hub, check_mode=True))
    assert (planned.operation, planned.resumed_from) == ("resume", kept)
    assert part_of(dest).stat().st_size == kept


def test_stale_part_from_another_pin_is_discarded(hub: HfStandin, tiny: Served, models: Path) -> None:
    tiny.publish(hub)
    dest = models / tiny.filename
    part_of(dest).write_bytes(b"GGUF" + b"\x00" * 1000)  # left by some other tool / another revision
    result = fetch_model(tiny.entry(), dest, options(hub))
    assert result.resumed_from == 0 and hub.requests[0].range is None
    assert_installed(dest, tiny, result)


# ------------------------------------------------------------------------------------------ the stand-in's API
def test_standin_api_shapes_for_make_pin(hub: HfStandin, tiny: Served) -> None:
    tiny.publish(hub)
    hub.add_file(HF_REPO, REV, "MTP/drafter.gguf", b"GGUF-drafter")
    hub.add_ref(HF_REPO, "main", REV)
    form = urllib.parse.urlencode([("paths", tiny.filename), ("paths", "absent.gguf"), ("expand", "true")])
    url = f"{hub.base_url}/api/models/{HF_REPO}/paths-info/main"
    with urllib.request.urlopen(urllib.request.Request(url, data=form.encode(), method="POST")) as resp:
        info = json.load(resp)
        assert "X-Repo-Commit" not in resp.headers  # the Hub's paths-info names no commit; resolve does
    assert len(info) == 1
    assert info[0]["type"] == "file" and info[0]["path"] == tiny.filename and info[0]["size"] == tiny.size
    assert info[0]["lfs"]["oid"] == tiny.sha256 and info[0]["lfs"]["size"] == tiny.size
    assert len(info[0]["oid"]) == 40 and info[0]["lfs"]["pointerSize"] > 100
    body = json.dumps({"paths": ["MTP/drafter.gguf"]}).encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request) as resp:
        assert json.load(resp)[0]["lfs"]["oid"] == hashlib.sha256(b"GGUF-drafter").hexdigest()
    with urllib.request.urlopen(f"{hub.base_url}/api/models/{HF_REPO}/tree/{REV}") as resp:
        tree = json.load(resp)
    assert {(e["type"], e["path"]) for e in tree} == {("file", tiny.filename), ("directory", "MTP")}
    with urllib.request.urlopen(f"{hub.base_url}/api/models/{HF_REPO}/tree/{REV}?recursive=true") as resp:
        assert {e["path"] for e in json.load(resp)} == {tiny.filename, "MTP/drafter.gguf"}
    with urllib.request.urlopen(f"{hub.base_url}/api/models/{HF_REPO}/revision/main") as resp:
        assert json.load(resp)["sha"] == REV
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"{hub.base_url}/api/models/{HF_REPO}/revision/{'f' * 40}")
    assert err.value.code == 404 and err.value.headers["X-Error-Code"] == "RevisionNotFound"
    request = urllib.request.Request(f"{hub.file_url(HF_REPO, 'main', tiny.filename)}", method="HEAD")
    with urllib.request.urlopen(request) as resp:
        assert resp.headers["Content-Length"] == str(tiny.size) and resp.headers["X-Repo-Commit"] == REV
    request = urllib.request.Request(hub.file_url(HF_REPO, REV, tiny.filename), headers={"Range": "bytes=4-9"})
    with urllib.request.urlopen(request) as resp:
        assert resp.status == 206 and resp.headers["Content-Range"] == f"bytes 4-9/{tiny.size}"
        assert resp.read() == tiny.path.read_bytes()[4:10]


# ------------------------------------------------------------------------------------------ the Ansible module
def test_ansible_module_end_to_end(tiny: Served, models: Path, tls_files: tuple[Path, Path, Path]) -> None:
    token = TOKEN
    ca, cert, key = tls_files
    with HfStandin(require_token=token, tls_cert=cert, tls_key=key) as hub:
        tiny.publish(hub)
        dest = models / tiny.filename
        args = {
            "entry": tiny.entry(notes="catalog extras are ignored"),
            "name": "tiny-gemma4",
            "dest": str(dest),
            "base_url": hub.base_url,
            "ca_file": str(ca),
            "token": token,
            "mode": "0640",
        }
        first, printed = run_gguf_fetch(args)
        assert token not in printed
        assert not first.get("failed"), first.get("msg")
        assert first["changed"] and first["bytes_downloaded"] == tiny.size and first["verification"] == "download"
        assert first["invocation"]["module_args"]["token"] == "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER"  # noqa: S105
        assert sha256(dest) == tiny.sha256 and oct(dest.stat().st_mode & 0o777) == "0o640"

        second, printed = run_gguf_fetch(args)
        assert token not in printed
        assert (second["changed"], second["bytes_downloaded"], second["verification"]) == (False, 0, "fast")

        planned, printed = run_gguf_fetch({**args, "dest": str(models / "other.gguf")}, "--check")
        assert token not in printed
        assert (planned["changed"], planned["operation"]) == (True, "download")
        assert not (models / "other.gguf").exists()
        assert tiny.served_by(hub) == tiny.size  # downloaded exactly once


def test_ansible_module_failure_keeps_previous_file(hub: HfStandin, tiny: Served, models: Path) -> None:
    tiny.publish(hub)
    dest = models / tiny.filename
    previous = seed_previous(dest)
    wrong = "f" * 64
    args = {
        **tiny.entry(sha256=wrong),
        "dest": str(dest),
        "base_url": hub.base_url,
        "allow_insecure_http": True,
        "token": OTHER_TOKEN,
    }
    result, printed = run_gguf_fetch(args)
    assert result["failed"] and result["error_kind"] == "verification"
    assert f"expected {wrong}, got {tiny.sha256}" in result["msg"]
    assert (result["expected"], result["actual"]) == (wrong, tiny.sha256)
    assert OTHER_TOKEN not in printed
    assert_untouched(dest, previous)

    unpinned, _ = run_gguf_fetch({**args, "sha256": None, "size": None, "name": "tiny"})
    assert unpinned["failed"] and "make pin model=tiny`" in unpinned["msg"]


def test_standin_serves_a_directory_tree(tmp_path: Path, tiny: Served, models: Path) -> None:
    """root/<owner>/<name>/<revision>/<path...> is served as /<owner>/<name>/resolve/<revision>/<path...>."""
    root = tmp_path / "hub"
    nested = root / tiny.repo / tiny.revision / "sub" / tiny.filename
    nested.parent.mkdir(parents=True)
    shutil.copyfile(tiny.path, nested)
    with HfStandin(root) as hub:
        result = fetch_model(tiny.entry(filename=f"sub/{tiny.filename}"), models / tiny.filename, options(hub))
    assert_installed(models / tiny.filename, tiny, result)
