"""Benchmarks of the verified model fetch, measured side by side (ratios, not absolute times: the machine is noisy).

    .venv/bin/python tests/bench/bench_fetch.py [--work DIR] [--reps N] [--skip-fleet] [--out results.json]

1. first-time hashing: model_fetch's verification of a present 250 MB GGUF without a record (sha256 + GGUF
   header + record) and its bare ``sha256_file``, against ``sha256sum`` on the same file (goal >= 0.9x);
2. re-run on a present, verified 2.5 GB GGUF vs the 250 MB one, through ``fetch_model`` and through the Ansible
   module (goal ratio <= 1.2);
3. loopback download of the 250 MB GGUF from the kit's mirror (a separate process): ``fetch_model`` (streams,
   hashes, fsyncs, checks the header) against ``curl -o`` (goal >= 0.8x);
4. bytes re-sent on resume: a connection reset at 40 % (retry in the same run) and an interrupted run resumed
   by the next one, counted by the Hugging Face stand-in (goal <= 1 % extra);
5. a fleet of 3 sandbox rigs, all on the 250 MB model, fresh controller cache: bytes the upstream (sandbox hub)
   served per file (goal 1x). Needs the container harness (``make harness``); --skip-fleet skips it.

The 2.5 GB file is written under --work (default: a temporary directory next to the gemma3 fixture) and
deleted at the end, whatever happens.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
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

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
import ansible.module_utils  # noqa: E402

if str(REPO / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(REPO / "module_utils"))

from ansible.module_utils.model_fetch import (  # noqa: E402
    DownloadError,
    FetchOptions,
    fetch_model,
    record_path,
    sha256_file,
)

from rigkit.sandbox import gemma3_270m  # noqa: E402
from tests.fixtures.hf_standin import Fault, HfStandin  # noqa: E402

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
    ta, tb = [], []
    for _ in range(reps):
        for fn, out in ((a, ta), (b, tb)):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
    return statistics.median(ta), statistics.median(tb)


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
    entry = entry_for(dest, gguf.name, "gemma3", gemma3_270m.SHA256)
    sha256_file(str(dest))  # warm the page cache for every contender alike

    def verify() -> None:
        forget_record(dest)
        result = fetch_model(entry, dest, FetchOptions())
        assert result.verification == "full" and not result.changed

    def coreutils() -> None:
        subprocess.run(["sha256sum", str(dest)], check=True, capture_output=True)

    t_verify, t_sum = interleaved(verify, coreutils, reps)
    t_bare, t_sum2 = interleaved(lambda: sha256_file(str(dest)), coreutils, reps)
    size = dest.stat().st_size
    return {
        "file_bytes": size,
        "sha256sum_MBps": size / MB / t_sum,
        "fetch_model_first_verify_MBps": size / MB / t_verify,
        "first_verify_vs_sha256sum": t_sum / t_verify,
        "sha256_file_MBps": size / MB / t_bare,
        "sha256_file_vs_sha256sum": t_sum2 / t_bare,
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


def start_mirror(root: Path, run_dir: Path) -> dict[str, Any]:
    cmd = [sys.executable, str(REPO / "bin" / "rigkit"), "mirror", "--root", str(root), "--port", "0"]
    cmd += ["--pidfile", str(run_dir / "m.pid"), "--logfile", str(run_dir / "m.log")]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def stop_mirror(run_dir: Path) -> None:
    cmd = [sys.executable, str(REPO / "bin" / "rigkit"), "mirror", "--stop", "--pidfile", str(run_dir / "m.pid")]
    subprocess.run(cmd, capture_output=True, check=False)


def bench_download(gguf: Path, work: Path, reps: int) -> dict[str, Any]:
    root = work / "mirror-root"
    served = root / REPO_ID / "resolve" / REV / gguf.name
    link_or_copy(gguf, served)
    entry = entry_for(served, gguf.name, "gemma3", gemma3_270m.SHA256)
    out = work / "download"
    out.mkdir(exist_ok=True)
    dest = out / gguf.name
    curl_dest = out / "curl.gguf"
    info = start_mirror(root, work)
    url = f"{info['url']}/{REPO_ID}/resolve/{REV}/{gguf.name}"
    try:

        def ours() -> None:
            dest.unlink(missing_ok=True)
            forget_record(dest)
            result = fetch_model(entry, dest, FetchOptions(base_url=info["url"], allow_insecure_http=True))
            assert result.bytes_downloaded == entry["size"]

        def curl() -> None:
            curl_dest.unlink(missing_ok=True)
            subprocess.run(["curl", "-sSf", "-o", str(curl_dest), url], check=True)

        def curl_then_sha256sum() -> None:
            curl()
            subprocess.run(["sha256sum", str(curl_dest)], check=True, capture_output=True)

        def curl_then_fsync() -> None:  # durable on disk, as fetch_model's result is
            curl()
            subprocess.run(["sync", "--data", str(curl_dest)], check=True)

        t_ours, t_curl = interleaved(ours, curl, reps)
        t_ours2, t_curl_hash = interleaved(ours, curl_then_sha256sum, max(2, reps // 2))
        t_ours3, t_curl_sync = interleaved(ours, curl_then_fsync, max(2, reps // 2))
    finally:
        stop_mirror(work)
        dest.unlink(missing_ok=True)
        curl_dest.unlink(missing_ok=True)
    size = entry["size"]
    return {
        "file_bytes": size,
        "curl_MBps": size / MB / t_curl,
        "fetch_model_MBps": size / MB / t_ours,
        "fetch_model_vs_curl": t_curl / t_ours,
        "curl_plus_sha256sum_MBps": size / MB / t_curl_hash,
        "fetch_model_vs_curl_plus_sha256sum": t_curl_hash / t_ours2,
        "curl_plus_fsync_MBps": size / MB / t_curl_sync,
        "fetch_model_vs_curl_plus_fsync": t_curl_sync / t_ours3,
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
            subprocess.run(["docker", "rm", "-f", f"rigkit-{host}"], capture_output=True, check=False)
            subprocess.run(["docker", "volume", "rm", "-f", f"rigkit-{host}-docker"], capture_output=True, check=False)

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, help="scratch directory (default: a temporary one)")
    parser.add_argument("--reps", type=int, default=5, help="repetitions per timed contender (default 5)")
    parser.add_argument("--skip-fleet", action="store_true", help="skip the 3-rig fleet (needs the harness)")
    parser.add_argument("--out", type=Path, help="also write the results as JSON here")
    parser.add_argument("--only", default="", help="comma-separated sections: hashing,rerun,download,resume,fleet")
    args = parser.parse_args()
    wanted = set(filter(None, args.only.split(","))) or {"hashing", "rerun", "download", "resume", "fleet"}
    if args.skip_fleet:
        wanted.discard("fleet")

    gguf = gemma3_270m.gemma3_270m_gguf()
    work = Path(tempfile.mkdtemp(prefix="rigkit-bench-", dir=args.work or gguf.parent.parent))
    results: dict[str, Any] = {}
    try:
        print(f"scratch: {work}", flush=True)
        if "hashing" in wanted:
            results["hashing"] = bench_hashing(gguf, work, args.reps)
            print(json.dumps(results["hashing"], indent=1), flush=True)
        if "rerun" in wanted:
            big = write_big_gguf(work / "bench-2.5GB.gguf", gguf)
            try:
                results["rerun"] = bench_rerun(gguf, big, work, args.reps)
            finally:
                for path in work.rglob("bench-2.5GB.gguf"):
                    path.unlink()
            print(json.dumps(results["rerun"], indent=1), flush=True)
        if "download" in wanted:
            results["download"] = bench_download(gguf, work, args.reps)
            print(json.dumps(results["download"], indent=1), flush=True)
        if "resume" in wanted:
            results["resume"] = bench_resume(gguf, work)
            print(json.dumps(results["resume"], indent=1), flush=True)
        if "fleet" in wanted:
            results["fleet"] = bench_fleet(work)
            print(json.dumps(results["fleet"], indent=1), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the 2.5 GB file never outlives the run
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
