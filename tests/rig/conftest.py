"""The rig suite: run against the sandbox in CI and against real rigs through the Ansible inventory.

    pytest tests/rig --hosts='ansible://sandbox' --ansible-inventory=inventory/hosts.yml
    pytest tests/rig --hosts='ansible://gpu_rigs' --ansible-inventory=inventory/hosts.yml

Expectations come from the rig's host variables over the llama_server role's defaults.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

import pytest
import yaml
from ansible.module_utils.llama_server.paths import container_name, tls_cert_path, unit_name
from ansible.module_utils.net_address import serves_tls

from tests.support import REPO, plain

DEFAULTS = yaml.safe_load((REPO / "roles/llama_server/defaults/main.yml").read_text())

REQUEST = (
    "import json, ssl, sys, urllib.request as u\n"
    "url, body, key, ca = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]\n"
    "ctx = ssl.create_default_context(cafile=ca) if ca else None\n"
    "if ctx: ctx.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN\n"
    "headers = {'Content-Type': 'application/json'}\n"
    "if key: headers['Authorization'] = 'Bearer ' + key\n"
    "req = u.Request(url, data=body.encode() if body else None, headers=headers)\n"
    "print(u.urlopen(req, timeout=300, context=ctx).read().decode())\n"
)


ALLOWED_ORIGIN = (
    "import ssl, sys, urllib.request as u\n"
    "url, origin, ca = sys.argv[1], sys.argv[2], sys.argv[3]\n"
    "ctx = ssl.create_default_context(cafile=ca) if ca else None\n"
    "if ctx: ctx.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN\n"
    "req = u.Request(url, headers={'Origin': origin})\n"
    "print(u.urlopen(req, timeout=60, context=ctx).headers.get('Access-Control-Allow-Origin') or '-')\n"
)


class Rig:
    """One rig's server as the suite sees it: its settings and a client that runs on the rig itself."""

    def __init__(self, host: Any) -> None:
        self.host = host
        hostvars = plain(host.ansible.get_variables())  # values tagged !unsafe (make discover, make tune) unwrapped
        self.settings = {
            key: hostvars.get(key, value) for key, value in DEFAULTS.items() if key.startswith("llama_server_")
        }
        self.hostvars = hostvars
        instance = self.settings["llama_server_instance"]
        self.unit = unit_name(instance)
        self.container = container_name(instance)
        bind = self.settings["llama_server_host"]
        self.address = "127.0.0.1" if bind in ("0.0.0.0", "::") else bind
        self.tls = serves_tls(self.settings.get("llama_server_tls", "auto"), bind)
        # With TLS the client on the rig verifies the server against the rig's own certificate.
        self.ca_file = tls_cert_path(instance) if self.tls else ""
        scheme = "https" if self.tls else "http"
        host_part = f"[{self.address}]" if ":" in self.address and not self.address.startswith("[") else self.address
        self.url = f"{scheme}://{host_part}:{self.settings['llama_server_port']}"

    def call(self, path: str, body: dict | None = None, raw: bool = False) -> Any:
        key = self.settings.get("llama_server_api_key") or ""
        command = f"python3 -c {shlex.quote(REQUEST)} {shlex.quote(self.url + path)} "
        command += f"{shlex.quote(json.dumps(body) if body is not None else '')} {shlex.quote(key)} "
        command += shlex.quote(self.ca_file)
        out = self.host.check_output(command)
        return out if raw else json.loads(out)

    def allowed_origin(self, origin: str) -> str:
        """The Access-Control-Allow-Origin the server answers a browser page from ``origin`` with ('-': none)."""
        command = f"python3 -c {shlex.quote(ALLOWED_ORIGIN)} {shlex.quote(self.url + '/health')} "
        command += f"{shlex.quote(origin)} {shlex.quote(self.ca_file)}"
        return self.host.check_output(command).strip()

    def complete(self, prompt: str, n_predict: int = 48) -> dict:
        body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0, "cache_prompt": False, "seed": 1}
        return self.call("/completion", body)

    def journal(self) -> str:
        return self.host.check_output(f"journalctl --unit {self.unit} --output cat --no-pager")

    def current_run_log(self) -> str:
        """The journal lines of the unit's current run only (its invocation ID): the server's load log."""
        invocation = self.host.check_output(f"systemctl show --property=InvocationID --value {self.unit}").strip()
        assert invocation, f"{self.unit} has no current run"
        return self.host.check_output(
            f"journalctl --unit {self.unit} --output cat --no-pager _SYSTEMD_INVOCATION_ID={invocation}"
        )

    def container_pid(self) -> int:
        """The host PID of the server's container's main process (llama-server, the image's entrypoint)."""
        return int(self.host.check_output(f"docker inspect --format '{{{{.State.Pid}}}}' {self.container}").strip())

    @property
    def require_gpu(self) -> bool:
        """llama_server_require_gpu as the role reads it: set, or true whenever the container gets a GPU."""
        value = self.settings.get("llama_server_require_gpu")
        if isinstance(value, str) and "{{" in value:  # the role's default, not templated here
            return self.settings["llama_server_gpu_access"] != "none"
        return str(value).strip().lower() in ("true", "yes", "on", "1")

    def server_args(self) -> list[str]:
        """argv of the llama-server process (visible from the rig: the container is its child)."""
        for pid in self.host.check_output("pgrep -f /app/llama-server").split():
            args = self.host.file(f"/proc/{pid}/cmdline").content.split(b"\0")
            if args and args[0].endswith(b"/app/llama-server"):
                return [arg.decode() for arg in args if arg]
        raise AssertionError("no llama-server process on the rig")

    def arg(self, flag: str) -> str:
        args = self.server_args()
        return args[args.index(flag) + 1]


@pytest.fixture(scope="module")
def rig(host) -> Rig:
    return Rig(host)
