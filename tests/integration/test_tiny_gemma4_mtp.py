"""The tiny gemma4 pair in the real llama-server image: on ``draft-mtp`` the drafter's drafts are accepted.

The server runs from the CPU image `make image host=sandbox` builds on this machine (rigkit/llama-server:*-cpu-*),
host network, loopback only, a free port. It is sent what the kit itself sends: the rig suite's and the probe's
prompts, and the bench's code, prose and chat requests (module_utils/bench_workload.py). Each answer must be the
cycle the fixture's weights encode (rigkit/sandbox/tiny_gemma4.py) and its drafts must be accepted >= 90 %.
"""

from __future__ import annotations

import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import yaml
from ansible.module_utils.bench_workload import request_body
from ansible.module_utils.llama_server.api import (
    Endpoint,
    ServerApiError,
    complete,
    metrics,
    speculative_slots,
    wait_ready,
)

from rigkit.sandbox.tiny_gemma4 import BYTE_TOKEN_BASE, expected_continuation, write_pair
from tests.support import REPO, free_port, unavailable

IMAGE_REPOSITORY = "rigkit/llama-server"
# The rig suite's threshold for the sandbox-mtp rig that serves this pair.
MIN_ACCEPTANCE = float(
    yaml.safe_load((REPO / "inventory" / "host_vars" / "sandbox-mtp.yml").read_text())["rig_expected_min_acceptance"]
)
N_PREDICT = 64
ACCEPTANCE_RE = re.compile(r"draft acceptance = ([0-9.]+) \(\s*(\d+) accepted /\s*(\d+) generated\)")

# What the kit sends: tests/rig/test_llama_server.py, library/llama_server_probe.py's canary default.
PROMPTS = {
    "rig-suite": "Write a Python function that adds two numbers. (1764553200.0)",
    "rig-metrics": "List three prime numbers:",
    "probe-canary": "def fibonacci(n):",
    "ends-in-the-cycle": "Hello",
}
BENCH_KINDS = ("code", "prose", "chat")  # "structured" is grammar-bound: the grammar, not the model, picks tokens


def docker(*argv: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *argv], capture_output=True, text=True, timeout=timeout, check=False)


def cpu_image() -> str:
    """The newest CPU llama-server image on this machine's engine, or skip (fail in CI) when there is none."""
    try:
        listed = docker("images", IMAGE_REPOSITORY, "--format", "{{.Repository}}:{{.Tag}}")
    except (FileNotFoundError, subprocess.TimeoutExpired) as exc:
        unavailable(f"no Docker engine to run {IMAGE_REPOSITORY} ({exc}); start it with `make harness`")
    if listed.returncode != 0:
        unavailable(
            f"no Docker engine to run {IMAGE_REPOSITORY}: {listed.stderr.strip()}; start it with `make harness`"
        )
    images = [line for line in listed.stdout.split() if "-cpu" in line.partition(":")[2]]
    if not images:
        unavailable(f"no CPU {IMAGE_REPOSITORY} image on this machine: build it with `make image host=sandbox`")
    return images[0]  # `docker images` lists the newest first


@dataclass
class Server:
    name: str
    endpoint: Endpoint

    def log(self) -> str:
        result = docker("logs", self.name)
        return result.stdout + result.stderr


def running(name: str) -> str | None:
    state = docker("inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", name)
    status = state.stdout.strip()
    return None if status.startswith("running") else f"container {name}: {status or state.stderr.strip()}"


@pytest.fixture(scope="module")
def mtp_server(llama_image, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    image = cpu_image()
    models = tmp_path_factory.mktemp("tiny-gemma4-mtp")
    models.chmod(0o755)  # the image runs as 10001:10001
    write_pair(models / "tiny-gemma4.gguf", models / "tiny-gemma4-assistant.gguf")
    port = free_port()
    name = f"rigkit-test-mtp-{uuid.uuid4().hex[:8]}"
    started = docker(
        "run", "-d", "--name", name, "--network", "host", "-v", f"{models}:/models:ro", image,
        "-m", "/models/tiny-gemma4.gguf", "-md", "/models/tiny-gemma4-assistant.gguf",
        "--spec-type", "draft-mtp", "--spec-draft-n-max", "3",
        "-c", "1024", "-np", "1", "-t", "2", "--metrics", "--host", "127.0.0.1", "--port", str(port),
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    server = Server(name, Endpoint(f"http://127.0.0.1:{port}", timeout=120.0))
    try:
        try:
            wait_ready(server.endpoint, timeout=120.0, still_alive=lambda: running(name))
        except ServerApiError as exc:
            pytest.fail(f"{exc}\n{server.log()[-4000:]}")
        yield server
    finally:
        docker("rm", "-f", name)


def expected_text(prompt: str, n: int) -> str:
    """The cycle after the prompt's last byte (the vocabulary is bytes; a space is stored as U+2581's bytes)."""
    last = prompt.replace(" ", "\u2581").encode()[-1]
    return bytes(token - BYTE_TOKEN_BASE for token in expected_continuation(BYTE_TOKEN_BASE + last, n)).decode()


@pytest.mark.parametrize("prompt", list(PROMPTS.values()), ids=list(PROMPTS))
def test_kit_prompts_answer_the_cycle_and_drafts_are_accepted(mtp_server: Server, prompt: str) -> None:
    answer = complete(mtp_server.endpoint, prompt, N_PREDICT, top_k=1)
    assert answer.content == expected_text(prompt, N_PREDICT)
    assert answer.draft_n >= N_PREDICT // 2, answer.timings  # drafts of 3, most of them accepted
    assert answer.acceptance is not None and answer.acceptance >= MIN_ACCEPTANCE, answer.timings


@pytest.mark.parametrize("kind", BENCH_KINDS)
def test_bench_requests_are_drafted_and_accepted(mtp_server: Server, kind: str) -> None:
    body = request_body(mtp_server.endpoint, kind, N_PREDICT, seed=1)
    answer = mtp_server.endpoint.get_json("/completion", body)
    timings = answer["timings"]
    assert answer["content"] == expected_text(body["prompt"], N_PREDICT)
    assert timings["predicted_n"] == N_PREDICT
    assert timings["draft_n"] > 0 and timings["draft_n_accepted"] / timings["draft_n"] >= MIN_ACCEPTANCE, timings


def test_server_reports_acceptance_in_its_log_metrics_and_slots(mtp_server: Server) -> None:
    before = metrics(mtp_server.endpoint)
    answer = complete(mtp_server.endpoint, "# a fresh prompt for the counters\n", N_PREDICT, top_k=1)
    after = metrics(mtp_server.endpoint)
    drafted = (
        after["llamacpp:spec_decode_num_draft_tokens_total"] - before["llamacpp:spec_decode_num_draft_tokens_total"]
    )
    accepted = (
        after["llamacpp:spec_decode_num_accepted_tokens_total"]
        - before["llamacpp:spec_decode_num_accepted_tokens_total"]
    )
    assert (drafted, accepted) == (answer.draft_n, answer.draft_n_accepted)
    assert speculative_slots(mtp_server.endpoint) == [True]
    reported: list[tuple[float, int, int]] = []
    for _ in range(20):  # the log may lag the response by a moment
        reported = [(float(rate), int(ok), int(made)) for rate, ok, made in ACCEPTANCE_RE.findall(mtp_server.log())]
        if reported and reported[-1][1:] == (answer.draft_n_accepted, answer.draft_n):
            break
        time.sleep(0.5)
    assert reported and reported[-1][1:] == (answer.draft_n_accepted, answer.draft_n), mtp_server.log()[-3000:]
    assert all(rate >= MIN_ACCEPTANCE for rate, _, _ in reported), reported
