"""module_utils/fetch/model.py against hostile local files and slow servers."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from ansible.module_utils.fetch.model import DownloadError, FetchError, HttpStatusError, fetch_model

from tests.fixtures.hf_standin import Fault, HfStandin
from tests.support import Served, options, part_of, sha256


# -------------------------------------------------------------------------------------------------- planted links
def test_dangling_symlink_at_the_part_is_refused_not_followed(
    hub: HfStandin, tiny: Served, models: Path, tmp_path: Path
) -> None:
    tiny.publish(hub)
    dest = models / tiny.filename
    outside = tmp_path / "outside" / "planted.bin"
    outside.parent.mkdir()
    part_of(dest).symlink_to(outside)
    with pytest.raises(FetchError, match="is a symlink"):
        fetch_model(tiny.entry(), dest, options(hub))
    assert not outside.exists() and not dest.exists() and not dest.is_symlink()
    assert hub.requests == []


def test_symlink_at_the_part_to_an_existing_file_is_refused(hub: HfStandin, tiny: Served, models: Path) -> None:
    tiny.publish(hub)
    dest = models / tiny.filename
    victim = models.parent / "victim.txt"
    victim.write_bytes(b"keep me")
    part_of(dest).symlink_to(victim)
    with pytest.raises(FetchError, match="is a symlink"):
        fetch_model(tiny.entry(), dest, options(hub))
    assert victim.read_bytes() == b"keep me"


def test_fifo_at_the_part_is_refused_without_hanging(hub: HfStandin, tiny: Served, models: Path) -> None:
    tiny.publish(hub)
    dest = models / tiny.filename
    os.mkfifo(part_of(dest))
    with pytest.raises(FetchError, match="not a regular file"):
        fetch_model(tiny.entry(), dest, options(hub))


def test_symlink_at_the_lock_is_refused(hub: HfStandin, tiny: Served, models: Path, tmp_path: Path) -> None:
    tiny.publish(hub)
    dest = models / tiny.filename
    (models / ".rigkit-verified").mkdir()
    target = tmp_path / "lock-target"
    (models / ".rigkit-verified" / f"{tiny.filename}.lock").symlink_to(target)
    with pytest.raises(FetchError, match="lock file"):
        fetch_model(tiny.entry(), dest, options(hub))
    assert not target.exists()


def test_final_path_that_is_a_symlink_is_not_trusted(hub: HfStandin, tiny: Served, models: Path) -> None:
    tiny.publish(hub)
    dest = models / tiny.filename
    elsewhere = models.parent / "elsewhere.gguf"
    elsewhere.write_bytes(tiny.path.read_bytes())  # even the right bytes: not the kit's file
    dest.symlink_to(elsewhere)
    with pytest.raises(FetchError, match="is a symlink"):
        fetch_model(tiny.entry(), dest, options(hub))


def test_installed_file_is_a_regular_file(hub: HfStandin, tiny: Served, models: Path) -> None:
    tiny.publish(hub)
    dest = models / tiny.filename
    part_of(dest).write_bytes(b"")  # an empty part of the same name: replaced, not opened through
    fetch_model(tiny.entry(), dest, options(hub))
    assert dest.is_file() and not dest.is_symlink() and sha256(dest) == tiny.sha256


# --------------------------------------------------------------------------------------------------- pace, parts
MiB = 1024 * 1024


def test_a_server_that_sends_a_little_and_stalls_is_given_up_on(hub: HfStandin, medium: Served, models: Path) -> None:
    """Each attempt brings > 1 MiB (so the retry count resets), then stalls: the rate rule stops it."""
    medium.publish(hub)
    medium.fault(hub, Fault("stall", after_bytes=MiB + MiB // 4, seconds=30, times=None))
    dest = models / medium.filename
    started = time.monotonic()
    opts = options(hub, read_timeout=0.4, retries=3, min_rate=8 * MiB, rate_window=1.0)
    with pytest.raises(DownloadError, match="too slow") as caught:
        fetch_model(medium.entry(), dest, opts)
    assert time.monotonic() - started < 10
    message = str(caught.value)
    got = part_of(dest).stat().st_size
    assert MiB < got < medium.size
    assert f"got {got} of {medium.size} bytes" in message and "attempts" in message and "kept" in message


def test_the_deadline_stops_a_download_that_keeps_progressing(hub: HfStandin, medium: Served, models: Path) -> None:
    medium.publish(hub)
    medium.fault(hub, Fault("stall", after_bytes=MiB + MiB // 4, seconds=30, times=None))
    dest = models / medium.filename
    opts = options(hub, read_timeout=0.4, retries=3, min_rate=0, deadline=1.0)
    started = time.monotonic()
    with pytest.raises(DownloadError, match="deadline of 1 s") as caught:
        fetch_model(medium.entry(), dest, opts)
    assert time.monotonic() - started < 10
    assert f"of {medium.size} bytes" in str(caught.value)


def test_the_rate_rule_lets_a_healthy_download_through(hub: HfStandin, medium: Served, models: Path) -> None:
    medium.publish(hub)
    result = fetch_model(medium.entry(), models / medium.filename, options(hub, min_rate=MiB, rate_window=0.15))
    assert result.bytes_downloaded == medium.size and sha256(models / medium.filename) == medium.sha256


def test_a_complete_part_is_verified_not_downloaded_again(
    hub: HfStandin, tiny: Served, models: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Interrupted after the last byte, before the rename (Ctrl-C during fsync): the next run only verifies."""
    tiny.publish(hub)
    dest = models / tiny.filename
    real_replace = os.replace

    def interrupted(src: str, dst: str) -> None:
        if str(src).endswith(".part"):
            raise KeyboardInterrupt
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        fetch_model(tiny.entry(), dest, options(hub))
    monkeypatch.setattr(os, "replace", real_replace)
    assert part_of(dest).stat().st_size == tiny.size and not dest.exists()
    hub.reset_counters()
    result = fetch_model(tiny.entry(), dest, options(hub))
    assert hub.requests == [] and result.bytes_downloaded == 0
    assert sha256(dest) == tiny.sha256 and not part_of(dest).exists()


@pytest.mark.parametrize("status", [401, 403, 404])
def test_an_access_error_keeps_the_resumable_part(hub: HfStandin, medium: Served, models: Path, status: int) -> None:
    medium.publish(hub)
    medium.fault(hub, Fault("reset", after_bytes=3 * MiB), Fault("status", status=status, times=None))
    dest = models / medium.filename
    with pytest.raises(HttpStatusError, match="is kept") as caught:
        fetch_model(medium.entry(), dest, options(hub))
    assert caught.value.status == status
    kept = part_of(dest).stat().st_size
    assert kept >= 3 * MiB
    hub.clear_faults()
    hub.reset_counters()
    result = fetch_model(medium.entry(), dest, options(hub))
    assert result.resumed_from == kept and result.bytes_downloaded == medium.size - kept
    assert sha256(dest) == medium.sha256
