"""Two runs on one controller that need the same missing llama.cpp image (two terminals, or a Molecule scenario
beside `make image`): each builds from a context of its own under the tag's lock, so the second waits for the
first build and then finds every layer cached, and neither loses its context to the other's clean-up.

The image is the sandbox's, built from a small Dockerfile (its own tag: the Dockerfile's digest is an input of the
tag), so the real role, its lock and `docker build` run without compiling llama.cpp."""

from __future__ import annotations

import re
import secrets
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support import CACHE_DIR, run

# Long enough that the second run reaches its build while the first still holds the lock.
DOCKERFILE = """\
ARG BUILD_BASE_IMAGE
FROM ${{BUILD_BASE_IMAGE}}
RUN sleep 20 && echo {nonce} > /built-once
"""
WAITED_RE = re.compile(r"flock: getting lock took ([0-9.]+) seconds")


@pytest.fixture
def small_dockerfile(harness, tmp_path: Path) -> Path:
    path = tmp_path / "Dockerfile"
    path.write_text(DOCKERFILE.format(nonce=secrets.token_hex(8)))
    return path


def build(dockerfile: Path, name: str) -> object:
    return run(
        [
            "ansible-playbook",
            "playbooks/image.yml",
            "--limit",
            "sandbox",
            "-e",
            f"llamacpp_image_dockerfile={dockerfile}",
        ],
        log_name=name,
    )


def test_two_runs_that_need_the_same_missing_image_build_it_once_in_turn(small_dockerfile: Path):
    nonce = re.search(r"echo (\w+)", small_dockerfile.read_text())[1]
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(build, small_dockerfile, "image-lock-first")
        time.sleep(2)
        second = pool.submit(build, small_dockerfile, "image-lock-second")
        results = [first.result(), second.result()]
    work = CACHE_DIR / "llamacpp"
    texts = {log: log.read_text() for log in work.glob("build-*.log")}
    logs = {log: text for log, text in texts.items() if nonce in text}
    tags = {re.search(r"--tag (\S+)", text)[1] for text in logs.values()}
    try:
        for result in results:
            assert result.returncode == 0, result.tail(60)
        assert len(logs) == 2 and len(tags) == 1, (list(logs), tags)
        builds = sorted((float(WAITED_RE.search(text)[1]), text) for text in logs.values())
        (first_wait, _), (second_wait, second_log) = builds
        assert second_wait >= 10, (first_wait, second_wait)  # it waited for the first build's 20 s step
        assert "Using cache" in second_log.split(nonce, 1)[1], second_log[-3000:]
        slug = re.sub(r"[^A-Za-z0-9_.-]", "_", next(iter(tags)))
        assert not list(work.glob(f"context-{slug}.*"))
    finally:
        for tag in tags:
            subprocess.run(["docker", "image", "rm", "--force", tag], capture_output=True, check=False)
        for log in logs:
            log.unlink()
