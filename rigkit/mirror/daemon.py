"""The model mirror as a detached process: start it (wait until it answers), serve, stop it by its pidfile.

`rigkit mirror` (playbooks/models.yml) starts one per run; the HTTP side is rigkit/mirror/models.py.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import pathlib
import re
import secrets
import select
import signal
import socket
import subprocess
import sys
import threading
import time

from rigkit.mirror.models import MirrorError, ModelMirror
from rigkit.paths import RIGKIT_BIN, UnsafeDirectoryError, private_dir

MIRROR_START_TIMEOUT_S = 30.0
MIRROR_STOP_TIMEOUT_S = 15.0
# How long a run waits for another run's mirror on the same port (that run's models play) before it gives up.
MIRROR_WAIT_TIMEOUT_S = 3600.0


def _read_pid(pidfile: pathlib.Path) -> int | None:
    try:
        return int(pidfile.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid: int) -> bool:
    """Running and not a zombie."""
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _is_our_mirror(pid: int) -> bool:
    """Alive, not a zombie, and a `rigkit mirror` process (a recycled pid is never signalled)."""
    try:
        cmdline = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return _alive(pid) and b"mirror" in cmdline and any(part.endswith(b"rigkit") for part in cmdline)


def _serves_run(pid: int) -> int | None:
    """The ansible-playbook run a mirror serves (its --watch-pid), None when it watches none."""
    try:
        cmdline = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        return int(cmdline[cmdline.index(b"--watch-pid") + 1])
    except (OSError, ValueError, IndexError):
        return None


def _wait_for_another_runs_mirror(pidfile: pathlib.Path, own_run: int | None, timeout: float) -> float:
    """While the mirror of ``pidfile`` serves another live run (a second provision on this controller: one port, one
    run directory), wait for it to stop, as it does when that run's models play ends; the seconds waited. A mirror of
    this run, of no run, or of a run that is gone is replaced instead (``_stop_mirror``)."""
    started = time.monotonic()
    announced = False
    while True:
        pid = _read_pid(pidfile)
        if pid is None or not _is_our_mirror(pid):
            return time.monotonic() - started
        run = _serves_run(pid)
        if run is None or run == own_run or not _alive(run):
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise TimeoutError(
                f"the mirror of another run (ansible-playbook pid {run}) has held {pidfile.parent} for "
                f"{timeout:.0f} s: let that run finish or stop it, or give this run a RIGKIT_CACHE_DIR and "
                "models_mirror_port of its own"
            )
        if not announced:
            print(f"rigkit mirror: waiting for the mirror of another run (ansible-playbook pid {run})", file=sys.stderr)
            announced = True
        time.sleep(0.2)


def _stop_mirror(pidfile: pathlib.Path) -> bool:
    """Stop the mirror of ``pidfile``; True when one was running."""
    pid = _read_pid(pidfile)
    running = pid is not None and _is_our_mirror(pid)
    if running:
        assert pid is not None
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + MIRROR_STOP_TIMEOUT_S
        while _is_our_mirror(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _is_our_mirror(pid):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(FileNotFoundError):
        pidfile.unlink()
    return running


def _answers(host: str, port: int) -> bool:
    if host in ("0.0.0.0", ""):  # noqa: S104 - naming the wildcard, not binding it
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


def _log_tail(logfile: pathlib.Path, lines: int = 5) -> str:
    try:
        return "\n".join(logfile.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _ansible_run_pid() -> int | None:
    """The outermost ansible-playbook process above this one (its forked workers share its command line)."""
    found = None
    pid = os.getppid()
    while pid > 1:
        try:
            cmdline = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:3]
            ppid = int(pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
        if any(os.path.basename(part) == b"ansible-playbook" for part in cmdline):
            found = pid
        pid = ppid
    return found


def _write_secret(path: pathlib.Path) -> None:
    """A fresh random secret for this run, readable by this user only (never on a command line or in a log)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_urlsafe(24) + "\n")


def mirror(args: argparse.Namespace) -> int:
    pidfile = pathlib.Path(args.pidfile).absolute()
    if args.stop:
        was_running = _stop_mirror(pidfile)
        print(json.dumps({"changed": was_running, "stopped": was_running, "pidfile": str(pidfile)}))
        return 0
    if args.foreground:
        return _serve(args, pidfile)
    if args.watch_ansible:
        args.watch_pid = _ansible_run_pid()
        if args.watch_pid is None:
            print(
                "rigkit mirror: --watch-ansible, but no ansible-playbook process started this command", file=sys.stderr
            )
            return 1
    logfile = pathlib.Path(args.logfile).absolute()
    # The run files (pid, log, stats, secret) live in directories no other user can change: nobody can plant a
    # symlink where the mirror writes, or read the secret (a shared RIGKIT_CACHE_DIR is refused with what to do).
    run_files = [pidfile, logfile, *(pathlib.Path(p).absolute() for p in (args.stats_file, args.secret_file) if p)]
    try:
        for directory in dict.fromkeys(path.parent for path in run_files):
            private_dir(directory)
    except UnsafeDirectoryError as exc:
        print(f"rigkit mirror: refusing its run directory: {exc}", file=sys.stderr)
        return 1
    # One start at a time per pidfile: two runs that both waited for a third run's mirror must not both start.
    lock = os.open(
        pidfile.with_name(f".{pidfile.name}.lock"), os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
    )
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _start(args, pidfile, logfile)
    finally:
        os.close(lock)


def _start(args: argparse.Namespace, pidfile: pathlib.Path, logfile: pathlib.Path) -> int:
    """Wait for another run's mirror, replace a stale one, start this one detached and wait until it answers."""
    try:
        waited = _wait_for_another_runs_mirror(pidfile, args.watch_pid, MIRROR_WAIT_TIMEOUT_S)
    except TimeoutError as exc:
        print(f"rigkit mirror: {exc}", file=sys.stderr)
        return 1
    replaced = _stop_mirror(pidfile)  # a mirror left by an interrupted run, or this run's own: start afresh
    if args.secret_file:
        _write_secret(pathlib.Path(args.secret_file).absolute())
    ready_r, ready_w = os.pipe()
    argv = [sys.executable, str(RIGKIT_BIN), "mirror", "--foreground", "--ready-fd", str(ready_w)]
    args.bind = args.bind or ["127.0.0.1"]
    for address in args.bind:
        argv += ["--bind", address]
    options = ("root", "port", "pidfile", "logfile", "idle_timeout", "max_age", "watch_pid", "stats_file")
    for option in (*options, "secret_file"):
        value = getattr(args, option)
        if value is not None and option in ("root", "pidfile", "logfile", "stats_file", "secret_file"):
            value = pathlib.Path(value).absolute()  # the detached process runs from /
        if value is not None:
            argv += [f"--{option.replace('_', '-')}", str(value)]
    for allowed in args.allow or []:
        argv += ["--allow", allowed]
    for client in args.client or []:
        argv += ["--client", client]
    log_fd = os.open(logfile, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(log_fd, "ab") as log:
        child = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            pass_fds=(ready_w,),
            start_new_session=True,
            cwd="/",
        )
    os.close(ready_w)
    port = None
    try:
        ready, _, _ = select.select([ready_r], [], [], MIRROR_START_TIMEOUT_S)
        if ready:
            line = os.read(ready_r, 64).decode().strip()
            port = int(line) if re.fullmatch(r"[0-9]{1,5}", line) else None
    finally:
        os.close(ready_r)
    if port is None:
        with contextlib.suppress(ProcessLookupError):
            child.terminate()
        print(
            f"rigkit mirror: the mirror did not start (see {logfile}):\n{_log_tail(logfile)}",
            file=sys.stderr,
        )
        return 1
    deadline = time.monotonic() + MIRROR_START_TIMEOUT_S
    while not _answers(args.bind[0], port):
        if child.poll() is not None or time.monotonic() > deadline:
            print(f"rigkit mirror: port {port} never answered (see {logfile}):\n{_log_tail(logfile)}", file=sys.stderr)
            return 1
        time.sleep(0.05)
    host = f"[{args.bind[0]}]" if ":" in args.bind[0] else args.bind[0]
    print(
        json.dumps(
            {
                "changed": True,
                "pid": child.pid,
                "port": port,
                "url": f"http://{host}:{port}",  # never with the secret: that stays in --secret-file
                "secret_file": str(pathlib.Path(args.secret_file).absolute()) if args.secret_file else None,
                "root": str(pathlib.Path(args.root).absolute()),
                "replaced": replaced,
                "waited_s": round(waited, 1),
            }
        )
    )
    return 0


def _serve(args: argparse.Namespace, pidfile: pathlib.Path) -> int:
    """The detached process itself: bind, write the pidfile, tell the starter the port, serve until SIGTERM."""
    try:
        secret = pathlib.Path(args.secret_file).read_text().strip() if args.secret_file else None
    except OSError as exc:
        print(f"rigkit mirror: cannot read the secret file {args.secret_file}: {exc.strerror}", file=sys.stderr)
        return 1
    try:
        server = ModelMirror(
            args.root,
            bind=args.bind or ["127.0.0.1"],
            port=args.port,
            secret=secret,
            allow=args.allow,
            clients=args.client,
            idle_timeout=args.idle_timeout or 0.0,
            max_age=args.max_age or 0.0,
            watch_pid=args.watch_pid,
            stats_file=args.stats_file,
            log=sys.stderr,
        )
    except MirrorError as exc:
        print(f"rigkit mirror: {exc}", file=sys.stderr)
        return 1
    tmp = pidfile.with_name(f".{pidfile.name}.{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(f"{os.getpid()}\n")
    tmp.replace(pidfile)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # stop from a thread: never block in a handler
        signal.signal(signum, lambda *_: threading.Thread(target=server.stop, daemon=True).start())
    server.start()
    if args.ready_fd is not None:
        with contextlib.suppress(OSError):
            os.write(args.ready_fd, f"{server.port}\n".encode())
            os.close(args.ready_fd)
    try:
        server.wait()
    finally:
        server.stop()
        if _read_pid(pidfile) == os.getpid():
            with contextlib.suppress(FileNotFoundError):
                pidfile.unlink()
    return 0
