"""Benchmarks of the verified model fetch, measured side by side (ratios, not absolute times: the machine is noisy).

    .venv/bin/python tests/bench/bench_fetch.py [--work DIR] [--reps N] [--size-mib N] [--only SECTIONS]
        [--skip-fleet] [--out results.json] [--report-dir reports/perf]

Every contender runs interleaved with the ones it is compared to (a, b, c, a, b, c, ...) and the medians are
reported, with the load average before and after each section (the machine is shared).

1. ``hashing``: first-time hashing of a present GGUF of --size-mib (default 1 GiB): model_fetch's verification
   without a record (sha256 + GGUF header + record) and its bare ``sha256_file``, against ``openssl dgst -sha256``
   (goal >= 0.9x) and coreutils ``sha256sum`` on the same file, page cache warm for all;
2. ``rerun``: re-run on a present, verified 2.5 GB GGUF vs the 250 MB one, through ``fetch_model`` and through
   the Ansible module (goal ratio <= 1.2);
3. ``download``: loopback download of the --size-mib GGUF from the kit's mirror (``rigkit mirror``, a separate
   process, sendfile): ``fetch_model`` (streams, hashes in a second thread, fsyncs, checks the header, renames)
   against ``curl -o`` (goal >= 0.8x) and ``curl -o`` + ``sync --data`` (durable like the fetcher's result), and
   the disk's own floor for a durable write of that size (``dd if=/dev/zero conv=fdatasync``, no network, no
   hash): a durable writer cannot be faster than this, while ``curl -o`` never waits for the disk;
4. ``resume``: bytes re-sent on resume: a connection reset at 40 % (retry in the same run) and an interrupted run
   resumed by the next one, counted by the Hugging Face stand-in (goal <= 1 % extra);
5. ``fleet3``: fleet delivery without containers: the controller's cache is filled once from the upstream (the
   Hugging Face stand-in: bytes from upstream 1x), then 3 fetch processes (three rigs) pull the file from one
   mirror at once, against one alone: wall time of 3 vs 1, bytes the mirror served;
6. ``fleet``: a fleet of 3 sandbox rigs through the models play, fresh controller cache: bytes the upstream
   (sandbox hub) served per file (goal 1x). Needs the container harness (``make harness``); --skip-fleet skips it.

With --report-dir the results, the machine (CPU model, cores, disk, kernel) and a PNG are written there as
``fetch-<UTC time>.json`` and ``.png``. Big files are written under --work (default: a temporary directory
next to the gemma3 fixture) and deleted at the end, whatever happens.

Why one file (661 lines): the sections share one interleaving harness, one scratch file set and one report;
a benchmark read top to bottom is easier to trust than one spread over modules.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import rigkit  # first: it makes module_utils/ importable as ansible.module_utils (run with .venv/bin/python)

REPO = rigkit.REPO

from ansible.module_utils.fetch.model import (  # noqa: E402
    DownloadError,
    FetchOptions,
    fetch_model,
    record_path,
    sha256_file,
)

from rigkit.sandbox import gemma3_270m  # noqa: E402
from tests.fixtures.hf_standin import Fault, HfStandin  # noqa: E402
from tests.support import remove_rig  # noqa: E402

MB = 1e6
REV = "0123456789abcdef0123456789abcdef01234567"
REPO_ID = "rigkit-bench/bench-GGUF"
BIG_SIZE = 2_500_000_000


def median_time(fn: Callable[[], Any], reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def interleaved(a: Callable[[], Any], b: Callable[[], Any], reps: int) -> tuple[float, float]:
    """Medians of a and b run alternately (a, b, a, b, ...), so both see the same machine."""
    samples = interleaved_samples({"a": a, "b": b}, reps)
    return statistics.median(samples["a"]), statistics.median(samples["b"])


def interleaved_samples(contenders: dict[str, Callable[[], Any]], reps: int) -> dict[str, list[float]]:
    """Every contender's wall times, run in turn (a, b, c, a, b, c, ...) ``reps`` times."""
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(reps):
        for name, fn in contenders.items():
            start = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - start)
    return samples


def williams_order(count: int, row: int) -> list[int]:
    """Row ``row`` (mod ``count``) of a Williams square for an even ``count``: over ``count`` rows, each index
    follows each other index exactly once (0, 1, n-1, 2, n-2, ... shifted by the row)."""
    base, low, high = [0], 1, count - 1
    while len(base) < count:
        base.append(low)
        low += 1
        if len(base) < count:
            base.append(high)
            high -= 1
    return [(index + row) % count for index in base]


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def entry_for(path: Path, filename: str, architecture: str, sha256: str | None = None) -> dict[str, Any]:
    return {
        "repo": REPO_ID,
        "revision": REV,
        "filename": filename,
        "sha256": sha256 or sha256_file(str(path)),
        "size": path.stat().st_size,
        "architecture": architecture,
        "role": "target",
    }


def link_or_copy(source: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists():
        dest.unlink()
    try:
        os.link(source, dest)
    except OSError:
        shutil.copyfile(source, dest)


def forget_record(dest: Path) -> None:
    Path(record_path(str(dest))).unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------- the 2.5 GB GGUF
def write_big_gguf(path: Path, filler: Path, size: int = BIG_SIZE) -> Path:
    """A valid GGUF (architecture gemma3) of exactly ``size`` bytes: one I8 tensor filled with real model bytes."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFWriter

    def build(nbytes: int) -> int:
        writer = GGUFWriter(str(path), "gemma3")
        writer.add_name("bench-2.5GB")
        writer.add_tensor_info("padding.weight", [nbytes], np.dtype(np.int8), nbytes, GGMLQuantizationType.I8)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        fout = writer.fout[0]
        writer.write_padding(fout, fout.tell())
        header = fout.tell()
        fout.flush()
        writer.close()
        return header

    header = build(size)  # the header's length does not depend on the tensor's size: write it for real now
    nbytes = size - header
    build(nbytes)
    with open(filler, "rb") as src, open(path, "ab") as out:
        left = nbytes
        while left:
            block = src.read(min(left, 16 * 1024 * 1024))
            if not block:
                src.seek(0)
                continue
            out.write(block)
            left -= len(block)
    assert path.stat().st_size == size
    return path


# ---------------------------------------------------------------------------------------------- benchmarks
def bench_hashing(gguf: Path, work: Path, reps: int) -> dict[str, Any]:
    dest = work / "hash" / gguf.name
    link_or_copy(gguf, dest)
    entry = entry_for(dest, gguf.name, "gemma3")
    sha256_file(str(dest))  # warm the page cache for every contender alike

    def verify() -> None:
        forget_record(dest)
        result = fetch_model(entry, dest, FetchOptions())
        assert result.verification == "full" and not result.changed

    def openssl() -> None:
        subprocess.run(["openssl", "dgst", "-sha256", str(dest)], check=True, capture_output=True)

    def coreutils() -> None:
        subprocess.run(["sha256sum", str(dest)], check=True, capture_output=True)

    load_before = load()
    samples = interleaved_samples(
        {
            "openssl_dgst_sha256": openssl,
            "sha256_file": lambda: sha256_file(str(dest)),
            "fetch_model_first_verify": verify,
            "sha256sum": coreutils,
        },
        reps,
    )
    size = dest.stat().st_size
    med = {name: statistics.median(times) for name, times in samples.items()}
    return {
        "file_bytes": size,
        "reps": reps,
        "load_before": load_before,
        "load_after": load(),
        "samples_s": samples,
        "median_s": med,
        "MBps": {name: size / MB / t for name, t in med.items()},
        "sha256_file_vs_openssl": med["openssl_dgst_sha256"] / med["sha256_file"],
        "first_verify_vs_openssl": med["openssl_dgst_sha256"] / med["fetch_model_first_verify"],
        "sha256_file_vs_sha256sum": med["sha256sum"] / med["sha256_file"],
    }


def run_module(args: dict[str, Any]) -> float:
    cmd = [str(REPO / ".venv" / "bin" / "ansible"), "localhost", "-i", "localhost,", "-c", "local"]
    cmd += ["-e", f"ansible_python_interpreter={sys.executable}", "-m", "gguf_fetch", "-a", json.dumps(args)]
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg")}
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    if done.returncode != 0 or '"changed": false' not in done.stdout.replace("changed: false", '"changed": false'):
        raise RuntimeError(f"gguf_fetch re-run did not report unchanged:\n{done.stdout}\n{done.stderr}")
    return elapsed


def bench_rerun(gguf: Path, big: Path, work: Path, reps: int) -> dict[str, Any]:
    small_dest = work / "rerun" / "small" / gguf.name
    big_dest = work / "rerun" / "big" / big.name
    link_or_copy(gguf, small_dest)
    link_or_copy(big, big_dest)
    small_entry = entry_for(small_dest, gguf.name, "gemma3", gemma3_270m.SHA256)
    start = time.perf_counter()
    big_entry = entry_for(big_dest, big.name, "gemma3")
    big_hash_s = time.perf_counter() - start
    for dest, entry in ((small_dest, small_entry), (big_dest, big_entry)):  # the first verification writes records
        forget_record(dest)
        fetch_model(entry, dest, FetchOptions())

    def rerun(dest: Path, entry: dict[str, Any]) -> Callable[[], None]:
        def once() -> None:
            result = fetch_model(entry, dest, FetchOptions())
            assert result.verification == "fast" and not result.changed

        return once

    t_small, t_big = interleaved(rerun(small_dest, small_entry), rerun(big_dest, big_entry), max(reps * 20, 50))
    module_small, module_big = [], []
    for _ in range(max(3, reps)):
        module_small.append(run_module({"entry": small_entry, "dest": str(small_dest)}))
        module_big.append(run_module({"entry": big_entry, "dest": str(big_dest)}))
    m_small, m_big = statistics.median(module_small), statistics.median(module_big)
    return {
        "big_file_bytes": big_dest.stat().st_size,
        "big_file_first_hash_s": big_hash_s,
        "fetch_model_rerun_small_ms": t_small * 1000,
        "fetch_model_rerun_big_ms": t_big * 1000,
        "fetch_model_rerun_ratio_big_vs_small": t_big / t_small,
        "ansible_module_rerun_small_s": m_small,
        "ansible_module_rerun_big_s": m_big,
        "ansible_module_rerun_ratio_big_vs_small": m_big / m_small,
    }


def start_mirror(root: Path, run_dir: Path, stats: Path | None = None) -> dict[str, Any]:
    cmd = [sys.executable, str(REPO / "bin" / "rigkit"), "mirror", "--root", str(root), "--port", "0"]
    cmd += ["--pidfile", str(run_dir / "m.pid"), "--logfile", str(run_dir / "m.log")]
    if stats is not None:
        cmd += ["--stats-file", str(stats)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def stop_mirror(run_dir: Path) -> None:
    cmd = [sys.executable, str(REPO / "bin" / "rigkit"), "mirror", "--stop", "--pidfile", str(run_dir / "m.pid")]
    subprocess.run(cmd, capture_output=True, check=False)


def mirror_layout(root: Path, name: str) -> Path:
    return root / REPO_ID / "resolve" / REV / name


def bench_download(gguf: Path, work: Path, reps: int) -> dict[str, Any]:
    root = work / "mirror-root"
    served = mirror_layout(root, gguf.name)
    link_or_copy(gguf, served)
    entry = entry_for(served, gguf.name, "gemma3")
    out = work / "download"
    out.mkdir(exist_ok=True)
    dest = out / gguf.name
    curl_dest = out / "curl.gguf"
    info = start_mirror(root, work)
    url = f"{info['url']}/{REPO_ID}/resolve/{REV}/{gguf.name}"
    size = entry["size"]
    sha256_file(str(served))  # the served file in the page cache for every contender alike

    def ours() -> None:
        result = fetch_model(entry, dest, FetchOptions(base_url=info["url"], allow_insecure_http=True))
        assert result.bytes_downloaded == size and result.verification == "download"

    def curl() -> None:
        subprocess.run(["curl", "-sSf", "-o", str(curl_dest), url], check=True)

    def curl_then_sync() -> None:  # durable on disk, as fetch_model's result is
        curl()
        subprocess.run(["sync", "--data", str(curl_dest)], check=True)

    dd_dest = out / "dd.bin"

    def disk_floor() -> None:  # the same bytes made durable, from nowhere: what the disk alone costs
        count = f"count={size // (1 << 20)}"
        subprocess.run(
            ["dd", "if=/dev/zero", f"of={dd_dest}", "bs=1M", count, "conv=fdatasync", "status=none"], check=True
        )

    def clean() -> None:  # unlinked right after its run: its dirty pages never slow the next contender
        for path in (dest, curl_dest, dd_dest):
            path.unlink(missing_ok=True)
        forget_record(dest)

    load_before = load()
    try:
        runs = {"curl_o": curl, "fetch_model": ours, "curl_o_then_sync": curl_then_sync, "dd_fdatasync": disk_floor}
        samples: dict[str, list[float]] = {name: [] for name in runs}
        contenders = list(runs.items())
        # Each repetition runs them in another order of a Williams square (a b d c, b c a d, c d b a, d a c b):
        # over 4 repetitions every contender follows every other one exactly once. On this VM's disk (ext4 mounted
        # with discard) what came before matters: a durable write is fast right after another one rewrote the
        # same, just freed blocks (dd conv=fdatasync of 1 GiB: 0.6 s) and slow once they were discarded (1.7-4 s
        # after a sync and a pause); a plain turn of one order (a b c d, b c d a, ...) keeps each contender after
        # the same one. Use a multiple of 4 repetitions.
        for rep in range(reps):
            for index in williams_order(len(contenders), rep):
                name, fn = contenders[index]
                clean()
                start = time.perf_counter()
                fn()
                samples[name].append(time.perf_counter() - start)
                clean()
    finally:
        stop_mirror(work)
        clean()
    med = {name: statistics.median(times) for name, times in samples.items()}
    return {
        "file_bytes": size,
        "reps": reps,
        "load_before": load_before,
        "load_after": load(),
        "samples_s": samples,
        "median_s": med,
        "MBps": {name: size / MB / t for name, t in med.items()},
        "fetch_model_vs_curl": med["curl_o"] / med["fetch_model"],
        "fetch_model_vs_curl_then_sync": med["curl_o_then_sync"] / med["fetch_model"],
        "fetch_model_vs_disk_floor": med["dd_fdatasync"] / med["fetch_model"],
    }


def fetch_one(args: argparse.Namespace) -> int:
    """One rig's fetch (a process of its own, as on a rig): --fetch-one BASE_URL ENTRY_JSON DEST."""
    base_url, entry_json, dest = args.fetch_one
    result = fetch_model(json.loads(entry_json), dest, FetchOptions(base_url=base_url, allow_insecure_http=True))
    return 0 if result.verification == "download" else 1


def bench_fleet3(gguf: Path, work: Path, reps: int, rigs: int = 3) -> dict[str, Any]:
    """The controller's cache filled once from upstream, then ``rigs`` fetch processes from one mirror at once."""
    entry = entry_for(gguf, gguf.name, "gemma3")
    size = entry["size"]
    cache_root = work / "controller-cache"
    cached = mirror_layout(cache_root, gguf.name)
    cached.parent.mkdir(parents=True, exist_ok=True)
    with HfStandin() as upstream:
        upstream.add_file(REPO_ID, REV, gguf.name, gguf, sha256=entry["sha256"])
        start = time.perf_counter()
        fetch_model(entry, cached, FetchOptions(base_url=upstream.base_url, allow_insecure_http=True))
        fill_s = time.perf_counter() - start
        upstream_bytes = upstream.bytes_served(REPO_ID, REV, gguf.name)
    stats = work / "mirror.stats.json"
    info = start_mirror(cache_root, work, stats)
    rig_dirs = [work / f"rig{i + 1}" for i in range(rigs)]

    def served() -> int:
        data = json.loads(stats.read_text()) if stats.exists() else {"files": {}}
        return sum(counters["bytes"] for counters in data["files"].values())

    def clean() -> None:
        for directory in rig_dirs:
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir()

    def deliver(count: int) -> Callable[[], None]:
        def run() -> None:
            cmd = [sys.executable, str(Path(__file__).resolve()), "--fetch-one", info["url"], json.dumps(entry)]
            procs = [subprocess.Popen([*cmd, str(d / gguf.name)]) for d in rig_dirs[:count]]
            codes = [proc.wait() for proc in procs]
            if any(codes):
                raise RuntimeError(f"a rig's fetch failed: exit codes {codes}")

        return run

    load_before = load()
    samples: dict[str, list[float]] = {"one_rig": [], f"{rigs}_rigs": []}
    mirror_bytes: dict[str, list[int]] = {"one_rig": [], f"{rigs}_rigs": []}
    try:
        for _ in range(reps):
            for name, count in (("one_rig", 1), (f"{rigs}_rigs", rigs)):
                clean()
                before = served()
                start = time.perf_counter()
                deliver(count)()
                samples[name].append(time.perf_counter() - start)
                time.sleep(0.2)  # the mirror writes its stats after each body
                mirror_bytes[name].append(served() - before)
                clean()
    finally:
        stop_mirror(work)
        for directory in rig_dirs:
            shutil.rmtree(directory, ignore_errors=True)
        shutil.rmtree(cache_root, ignore_errors=True)
    med = {name: statistics.median(times) for name, times in samples.items()}
    return {
        "rigs": rigs,
        "file_bytes": size,
        "reps": reps,
        "load_before": load_before,
        "load_after": load(),
        "controller_cache_fill_s": fill_s,
        "upstream_bytes_over_file": upstream_bytes / size,
        "mirror_bytes_over_file": {name: [b / size for b in counts] for name, counts in mirror_bytes.items()},
        "samples_s": samples,
        "median_s": med,
        "wall_ratio_fleet_vs_one": med[f"{rigs}_rigs"] / med["one_rig"],
        "aggregate_MBps": {
            "one_rig": size / MB / med["one_rig"],
            f"{rigs}_rigs": rigs * size / MB / med[f"{rigs}_rigs"],
        },
    }


def bench_resume(gguf: Path, work: Path) -> dict[str, Any]:
    out = work / "resume"
    out.mkdir(exist_ok=True)
    entry = entry_for(gguf, gguf.name, "gemma3", gemma3_270m.SHA256)
    size = entry["size"]
    opts = {"allow_insecure_http": True, "backoff_initial": 0.01, "backoff_max": 0.05, "read_timeout": 10.0}
    results: dict[str, Any] = {"file_bytes": size}
    with HfStandin() as hub:
        hub.add_file(REPO_ID, REV, gguf.name, gguf, sha256=entry["sha256"])
        # a) the connection resets at 40 %; the same run resumes with a Range request
        hub.add_fault(REPO_ID, REV, gguf.name, Fault("reset", after_bytes=int(size * 0.4)))
        dest = out / "a.gguf"
        result = fetch_model(entry, dest, FetchOptions(base_url=hub.base_url, **opts))
        served = hub.bytes_served(REPO_ID, REV, gguf.name)
        results["reset_in_run"] = {
            "served_bytes": served,
            "extra_pct": (served - size) / size * 100,
            "resumed": result.operation == "resume" or result.attempts > 1,
        }
        dest.unlink()
        # b) the run dies at 40 % (reset, then the server is down); the next run resumes the kept part
        hub.reset_counters()
        hub.clear_faults()
        hub.add_fault(REPO_ID, REV, gguf.name, Fault("reset", after_bytes=int(size * 0.4)))
        hub.add_fault(REPO_ID, REV, gguf.name, Fault("status", status=503, times=None))
        dest = out / "b.gguf"
        with contextlib.suppress(DownloadError):
            fetch_model(entry, dest, FetchOptions(base_url=hub.base_url, retries=1, **opts))
        kept = Path(f"{dest}.part").stat().st_size
        hub.clear_faults()
        result = fetch_model(entry, dest, FetchOptions(base_url=hub.base_url, **opts))
        served = hub.bytes_served(REPO_ID, REV, gguf.name)
        results["interrupted_run_resumed"] = {
            "kept_part_bytes": kept,
            "served_bytes": served,
            "extra_pct": (served - size) / size * 100,
            "operation": result.operation,
        }
        dest.unlink()
    return results


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def bench_fleet(work: Path) -> dict[str, Any]:
    hosts = ("fleet1", "fleet2", "fleet3")
    cache = work / "fleet-cache"
    cache.mkdir()

    def remove_rigs() -> None:
        for host in hosts:
            remove_rig(f"rigkit-{host}")

    model = "gemma-3-270m-it-q4_k_m"
    cmd = [str(REPO / ".venv" / "bin" / "ansible-playbook"), "tests/integration/playbooks/models_fleet.yml"]
    cmd += ["-i", "inventory/hosts.yml", "-i", "tests/integration/inventories/fleet/hosts.yml", "--limit", "fleet"]
    cmd += ["-e", f"rig_controller_cache_dir={cache}", "-e", f"models_sandbox_hub_port={free_port()}"]
    cmd += ["-e", f"models_mirror_port={free_port()}", "-e", f"models_target={model}", "-e", f"models_drafter={model}"]
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "PATH": f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}",
    }
    remove_rigs()
    try:
        start = time.perf_counter()
        done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
        elapsed = time.perf_counter() - start
        if done.returncode != 0:
            raise RuntimeError(f"fleet provision failed:\n{done.stdout[-4000:]}")
        hub = json.loads((cache / "run" / "sandbox-hub.stats.json").read_text())["files"]
        mirror = json.loads((cache / "run" / "mirror.stats.json").read_text())["files"]
    finally:
        remove_rigs()
        shutil.rmtree(cache, ignore_errors=True)
    size = gemma3_270m.SIZE
    return {
        "rigs": len(hosts),
        "model_bytes": size,
        "upstream_served_per_file": {path: counters["bytes"] / size for path, counters in hub.items()},
        "upstream_requests_per_file": {path: counters["requests"] for path, counters in hub.items()},
        "controller_mirror_served_per_file": {path: counters["bytes"] / size for path, counters in mirror.items()},
        "playbook_s": elapsed,
    }


def machine(work: Path) -> dict[str, Any]:
    """The machine the figures come from: CPU, cores, disk under the scratch directory, kernel, load."""
    cpu = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    disk: dict[str, Any] = {}
    done = subprocess.run(
        ["findmnt", "-n", "-o", "SOURCE,FSTYPE", "--target", str(work)], capture_output=True, text=True, check=False
    )
    if done.returncode == 0 and done.stdout.split():
        source, fstype = [*done.stdout.split(), ""][:2]
        disk = {"source": source, "fstype": fstype}
        block = Path("/sys/class/block") / Path(source).name
        for key, rel in (("rotational", "queue/rotational"), ("model", "device/model"), ("size_512b", "size")):
            with contextlib.suppress(OSError):
                disk[key] = (block / rel).read_text().strip()
    return {
        "cpu": cpu or platform.processor(),
        "cores": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "disk": disk,
        "curl": subprocess.run(["curl", "--version"], capture_output=True, text=True, check=False).stdout.split("\n")[
            0
        ],
        "openssl": subprocess.run(["openssl", "version"], capture_output=True, text=True, check=False).stdout.strip(),
    }


def plot(results: dict[str, Any], path: Path) -> Path:
    """One PNG: download vs curl, hashing vs openssl, fleet of 3 vs one rig (medians, every sample as a dot)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    panels = [key for key in ("download", "hashing", "fleet3") if key in results]
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(5.2 * max(1, len(panels)), 4.6), dpi=100)
    axes = list(axes) if len(panels) > 1 else [axes]
    titles = {
        "download": "loopback download to disk (MB/s)",
        "hashing": "first-time sha256 of a present file (MB/s)",
        "fleet3": "fleet delivery from one mirror (s)",
    }
    for ax, key in zip(axes, panels, strict=False):
        section = results[key]
        names = list(section["samples_s"])
        if key == "fleet3":
            values = [section["median_s"][n] for n in names]
            dots = [section["samples_s"][n] for n in names]
            note = (
                f"{section['rigs']} rigs / 1 rig: {section['wall_ratio_fleet_vs_one']:.2f}x wall\n"
                f"upstream bytes: {section['upstream_bytes_over_file']:.2f}x file, "
                f"mirror: {statistics.median(section['mirror_bytes_over_file'][names[-1]]):.2f}x"
            )
        else:
            size = section["file_bytes"] / MB
            values = [section["MBps"][n] for n in names]
            dots = [[size / t for t in section["samples_s"][n]] for n in names]
            note = (
                f"fetch_model / curl -o: {section['fetch_model_vs_curl']:.2f}x"
                if key == "download"
                else f"sha256_file / openssl: {section['sha256_file_vs_openssl']:.2f}x, "
                f"first verify: {section['first_verify_vs_openssl']:.2f}x"
            )
        ax.bar(range(len(names)), values, color="#4c72b0")
        for i, points in enumerate(dots):
            ax.plot([i] * len(points), points, "k.", markersize=4)
        ax.set_xticks(range(len(names)), [n.replace("_", " ") for n in names], rotation=15, fontsize=8)
        ax.set_title(titles[key], fontsize=10)
        ax.text(0.02, 0.97, note, transform=ax.transAxes, va="top", fontsize=8)
        ax.set_ylim(0, max(max(p) for p in dots) * 1.3)
        ax.text(
            0.02, -0.22, f"load {section['load_before']} -> {section['load_after']}", transform=ax.transAxes, fontsize=7
        )
    meta = results.get("machine", {})
    fig.suptitle(
        f"rigkit fetch bench: {meta.get('cpu', '?')}, {meta.get('cores', '?')} cores, {meta.get('kernel', '?')}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, help="scratch directory (default: a temporary one)")
    parser.add_argument("--reps", type=int, default=5, help="repetitions per timed contender (default 5)")
    parser.add_argument("--size-mib", type=int, default=1024, help="the download/hash/fleet3 file (default 1 GiB)")
    parser.add_argument("--skip-fleet", action="store_true", help="skip the 3-rig fleet (needs the harness)")
    parser.add_argument("--out", type=Path, help="also write the results as JSON here")
    parser.add_argument("--report-dir", type=Path, help="write fetch-<time>.json and .png here (reports/perf)")
    parser.add_argument(
        "--only", default="", help="comma-separated sections: hashing,rerun,download,resume,fleet3,fleet"
    )
    parser.add_argument("--fetch-one", nargs=3, metavar=("BASE_URL", "ENTRY_JSON", "DEST"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.fetch_one:
        return fetch_one(args)
    wanted = set(filter(None, args.only.split(","))) or {"hashing", "rerun", "download", "resume", "fleet3", "fleet"}
    if args.skip_fleet:
        wanted.discard("fleet")

    gguf = gemma3_270m.gemma3_270m_gguf()
    work = Path(tempfile.mkdtemp(prefix="rigkit-bench-", dir=args.work or gguf.parent.parent))
    results: dict[str, Any] = {
        "command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        "started_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": machine(work),
    }
    try:
        print(f"scratch: {work}", flush=True)
        sized = gguf
        if wanted & {"hashing", "download", "fleet3"}:
            sized = write_big_gguf(work / f"bench-{args.size_mib}MiB.gguf", gguf, args.size_mib * 1024 * 1024)
        if "hashing" in wanted:
            results["hashing"] = bench_hashing(sized, work, args.reps)
            print(json.dumps(results["hashing"], indent=1), flush=True)
        if "download" in wanted:
            results["download"] = bench_download(sized, work, args.reps)
            print(json.dumps(results["download"], indent=1), flush=True)
        if "fleet3" in wanted:
            results["fleet3"] = bench_fleet3(sized, work, args.reps)
            print(json.dumps(results["fleet3"], indent=1), flush=True)
        if "rerun" in wanted:
            big = write_big_gguf(work / "bench-2.5GB.gguf", gguf)
            try:
                results["rerun"] = bench_rerun(gguf, big, work, args.reps)
            finally:
                for path in work.rglob("bench-2.5GB.gguf"):
                    path.unlink()
            print(json.dumps(results["rerun"], indent=1), flush=True)
        if "resume" in wanted:
            results["resume"] = bench_resume(gguf, work)
            print(json.dumps(results["resume"], indent=1), flush=True)
        if "fleet" in wanted:
            results["fleet"] = bench_fleet(work)
            print(json.dumps(results["fleet"], indent=1), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the big files never outlive the run
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    if args.report_dir:
        args.report_dir.mkdir(parents=True, exist_ok=True)
        stem = args.report_dir / f"fetch-{results['started_utc'].replace(':', '')}"
        stem.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
        print(f"wrote {stem.with_suffix('.json')} and {plot(results, stem.with_suffix('.png'))}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
