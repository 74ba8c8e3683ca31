"""Start, restart and stop a llama-server process on this machine (no container, no systemd).

    with LocalLlamaServer(Path("build/bin/llama-server"), ["-m", "t.gguf", "-md", "d.gguf"], port=18600,
                          log_path=Path("/tmp/server.log")) as server:
        for n_max in (1, 2, 3):
            endpoint = server.restart(["--spec-draft-n-max", str(n_max)])   # waits for /health 200
            ...                                                            # module_utils.llama_server.api calls
            print(server.log_text())                                       # this start's log lines

Each start appends to ``log_path`` after a ``=== start`` header line; ``log_text()`` returns the current (or last)
start's part. A start that dies or stays unhealthy raises ServerStartError with the log's tail. stop() sends
SIGTERM (llama-server then prints its memory breakdown) and SIGKILL after ``stop_timeout``.

The llama_server.api module is the one Ansible modules use (``ansible.module_utils.llama_server.api``, the kit's
module_utils registered as ansible.cfg does) when ansible is importable, else ``module_utils.llama_server.api``:
one module object either way, so its ServerApiError is the one callers catch.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType, TracebackType
from typing import TYPE_CHECKING

REPO = Path(__file__).resolve().parents[2]

if TYPE_CHECKING:
    from module_utils.llama_server.api import Endpoint


def kit_module_utils(name: str) -> ModuleType:
    """The kit's module_utils/<name>.py, imported once under the name Ansible modules use when ansible is present."""
    import importlib

    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    try:
        import rigkit  # noqa: F401  (the one place that wires module_utils/ as ansible.module_utils)
    except ImportError:  # no Ansible on the GPU machine: the same files under their own package name
        return importlib.import_module(f"module_utils.{name}")
    return importlib.import_module(f"ansible.module_utils.{name}")


api = kit_module_utils("llama_server.api")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (for a server started next)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


class ServerStartError(RuntimeError):
    """llama-server exited or did not answer /health 200 in time; the message ends with the log's tail."""


class LocalLlamaServer:
    """One llama-server process: ``binary`` ``base_args`` [``extra_args``] --host ``host`` --port ``port``."""

    def __init__(
        self,
        binary: Path,
        base_args: Sequence[str],
        *,
        host: str = "127.0.0.1",
        port: int,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        ready_timeout: float = 300.0,
        stop_timeout: float = 20.0,
        request_timeout: float = 120.0,
    ) -> None:
        self.binary = Path(binary)
        self.base_args = list(base_args)
        self.host = host
        self.port = int(port)
        self.log_path = Path(log_path)
        self.env = dict(os.environ if env is None else env)
        self.ready_timeout = ready_timeout
        self.stop_timeout = stop_timeout
        self.request_timeout = request_timeout
        self.argv: list[str] = []
        self.ready_seconds: float | None = None
        self.returncode: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_offset = 0

    # -------------------------------------------------------------------------------------------- state
    @property
    def endpoint(self) -> Endpoint:
        address = "127.0.0.1" if self.host in ("0.0.0.0", "") else "::1" if self.host == "::" else self.host
        if ":" in address:
            address = f"[{address}]"
        return api.Endpoint(f"http://{address}:{self.port}", timeout=self.request_timeout)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_text(self) -> str:
        """The log of the current (or last) start."""
        if not self.log_path.exists():
            return ""
        with self.log_path.open("rb") as handle:
            handle.seek(self._log_offset)
            return handle.read().decode(errors="replace")

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    # -------------------------------------------------------------------------------------------- control
    def restart(self, extra_args: Sequence[str] = ()) -> Endpoint:
        """Stop any running process, start with base_args + extra_args, return the endpoint once /health is 200."""
        self.stop()
        self.argv = [str(self.binary), *self.base_args, *extra_args, "--host", self.host, "--port", str(self.port)]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self._log_offset = log.tell()
            log.write(f"=== start {time.strftime('%Y-%m-%dT%H:%M:%S')}: {' '.join(self.argv)}\n".encode())
            log.flush()
            self.returncode = None
            self._proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=self.env
            )
        endpoint = self.endpoint

        def exited() -> str | None:
            if self._proc is not None and self._proc.poll() is not None:
                return f"llama-server exited with status {self._proc.returncode}"
            return None

        try:
            self.ready_seconds = api.wait_ready(endpoint, self.ready_timeout, exited, interval=0.25)
        except api.ServerApiError as exc:
            self.stop()
            raise ServerStartError(f"{exc}\n--- {self.log_path} (tail) ---\n{self.log_tail()}") from exc
        return endpoint

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after stop_timeout; returns the exit status (None when nothing ran)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.returncode = proc.returncode
        return self.returncode

    def __enter__(self) -> LocalLlamaServer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
