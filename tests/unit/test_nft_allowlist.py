"""llama-server's optional client allow-list: the kit's own nftables table, rendered by the
role's filter, checked on the controller, and proven for real - loaded with ``nft -f`` inside an unprivileged
user + network namespace (``unshare -Urn``, never this machine's own network namespace, which the sandbox rigs
share), where a client on an allowed address connects and one on another address is reset."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.module_utils.nft_allowlist import AllowListError, normalise_networks, render_ruleset, table_name

from tests.support import REPO, render_server_files, unavailable

PORT = 18437  # inside the private network namespace only


def test_networks_are_normalised_and_split_by_family() -> None:
    networks = normalise_networks(["192.168.1.0/24", " 10.0.0.7 ", "fd00::/8", "192.168.1.0/24", "2001:db8::1"])
    assert networks.ipv4 == ("192.168.1.0/24", "10.0.0.7/32")
    assert networks.ipv6 == ("fd00::/8", "2001:db8::1/128")
    assert not normalise_networks([])


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ("192.168.1.5/24", "'192.168.1.5/24' has host bits set; did you mean 192.168.1.0/24?"),
        ("10.0.0.0/33", "'10.0.0.0/33' is not a network"),
        ("lan", "'lan' is not a network"),
        ("0.0.0.0/0", "allows every address; leave llama_server_allowed_networks empty"),
        ("", "is not a network"),
    ],
)
def test_bad_entries_are_refused_naming_the_variable(entry: str, expected: str) -> None:
    with pytest.raises(AllowListError) as caught:
        normalise_networks([entry])
    assert str(caught.value).startswith("llama_server_allowed_networks: ")
    assert expected in str(caught.value)


def test_a_string_instead_of_a_list_is_refused() -> None:
    with pytest.raises(AllowListError, match="must be a list of networks"):
        normalise_networks("192.168.1.0/24")  # type: ignore[arg-type]


def test_the_table_is_the_kits_own_and_replaced_atomically() -> None:
    assert table_name("main") == "rigkit_llama_main" and table_name("e2b-fast") == "rigkit_llama_e2b_fast"
    text = render_ruleset("e2b-fast", 8080, normalise_networks(["192.168.1.0/24"]))
    lines = text.splitlines()
    # create-if-missing, delete, create: one nft -f transaction that replaces only this table
    assert lines[2:5] == [
        "table inet rigkit_llama_e2b_fast",
        "delete table inet rigkit_llama_e2b_fast",
        "table inet rigkit_llama_e2b_fast {",
    ]
    assert "flush ruleset" not in text
    assert "\t\ttcp dport 8080 counter reject with tcp reset" in lines
    with pytest.raises(AllowListError):
        render_ruleset("main", 0, normalise_networks(["192.168.1.0/24"]))


# --- controller validation ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (
            {"llama_server_allowed_networks": ["192.168.1.5/24"]},
            "llama_server_allowed_networks is [\"192.168.1.5/24\"]; '192.168.1.5/24' has host bits set; did you mean",
        ),
        (
            {"llama_server_allowed_networks": ["192.168.1.0/24"], "llama_server_host": "127.0.0.1"},
            'llama_server_allowed_networks is ["192.168.1.0/24"]; llama_server_host is 127.0.0.1, so no other',
        ),
    ],
    ids=["host-bits", "loopback-bind"],
)
def test_controller_refuses_bad_allow_lists(extra: dict[str, Any], expected: str, tmp_path: Path) -> None:
    from rigkit.inventory_files import Sources
    from rigkit.validation.rules import load_specs, rig_problems

    values = {"rig_kind": "sandbox", **yaml.safe_load((REPO / "inventory/host_vars/sandbox-mtp.yml").read_text())}
    values.update(llama_server_host="192.0.2.7", llama_server_api_key="k" * 32)
    good = {**values, "llama_server_allowed_networks": ["192.168.1.0/24", "fd00::/8"]}
    host_file = tmp_path / "host_vars" / "lan.yml"
    host_file.parent.mkdir()
    specs = load_specs(str(REPO / "roles"))
    host_file.write_text(yaml.safe_dump(good))
    sources = Sources(str(tmp_path), "lan", ["sandbox_rigs", "rigs"])
    assert rig_problems("lan", good, specs=specs, sources=sources, catalog={}) == []
    bad = {**values, **extra}
    host_file.write_text(yaml.safe_dump(bad))
    sources = Sources(str(tmp_path), "lan", ["sandbox_rigs", "rigs"])
    problems = rig_problems("lan", bad, specs=specs, sources=sources, catalog={})
    assert len(problems) == 1 and problems[0].startswith(f"{host_file}: {expected}"), problems


# --- rendered by the role, loaded for real in a private network namespace -------------------------------------
HOSTS: dict[str, dict[str, Any]] = {
    "lan": {
        "llama_server_host": "0.0.0.0",
        "llama_server_api_key": "k" * 32,
        "llama_server_port": PORT,
        "llama_server_allowed_networks": ["10.9.0.2/32", "192.168.77.0/24", "fd00:9::/64"],
    },
    "lan_bad": {
        "llama_server_host": "0.0.0.0",
        "llama_server_api_key": "k" * 32,
        "llama_server_allowed_networks": ["10.9.0.2/24"],
    },
    "local": {},
}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    return render_server_files(tmp_path_factory.mktemp("render-nft"), HOSTS)


def test_the_role_renders_the_ruleset_and_the_unit_requires_it(rendered: tuple[Path, dict[str, Any]]) -> None:
    out, _ = rendered
    ruleset = (out / "lan.nft").read_text()
    assert "elements = { 10.9.0.2/32, 192.168.77.0/24 }" in ruleset and "elements = { fd00:9::/64 }" in ruleset
    assert f"tcp dport {PORT} counter reject with tcp reset" in ruleset
    unit = (out / "lan.service").read_text()
    assert "Requires=rigkit-llama-main-firewall.service" in unit.splitlines()
    # no list, no table and no requirement
    assert not (out / "local.nft").exists()
    assert "firewall" not in (out / "local.service").read_text()


def test_a_bad_entry_is_refused_by_the_role_before_rendering(rendered: tuple[Path, dict[str, Any]]) -> None:
    out, result = rendered
    messages = [
        outcome.get("msg", "")
        for task in result["plays"][0]["tasks"]
        for host, outcome in task["hosts"].items()
        if host == "lan_bad" and outcome.get("failed")
    ]
    assert messages and "'10.9.0.2/24' has host bits set; did you mean 10.9.0.0/24?" in messages[0], messages
    assert not (out / "lan_bad.service").exists() and not (out / "lan_bad.nft").exists()


# Runs as root of a fresh user + network namespace (unshare -Urn): a veth pair to a second namespace (the
# "LAN") whose interface holds an allowed address (10.9.0.2) and a denied one (10.9.0.3).
NAMESPACE_SETUP = textwrap.dedent(
    """
    import json, socket, subprocess, sys, threading, time

    ruleset, table, port = sys.argv[1], sys.argv[2], int(sys.argv[3])

    def sh(*argv, check=True):
        return subprocess.run(argv, capture_output=True, text=True, check=check, timeout=30)

    sh("ip", "link", "set", "lo", "up")
    lan = subprocess.Popen(["unshare", "-n", "sleep", "120"])
    time.sleep(0.5)
    in_lan = ["nsenter", "-t", str(lan.pid), "-n"]
    sh("ip", "link", "add", "v0", "type", "veth", "peer", "name", "v1", "netns", str(lan.pid))
    sh("ip", "addr", "add", "10.9.0.1/24", "dev", "v0")
    sh("ip", "link", "set", "v0", "up")
    for argv in (["ip", "link", "set", "lo", "up"], ["ip", "addr", "add", "10.9.0.2/24", "dev", "v1"],
                 ["ip", "addr", "add", "10.9.0.3/24", "dev", "v1"], ["ip", "link", "set", "v1", "up"]):
        sh(*in_lan, *argv)

    servers = []
    for p in (port, port + 1):  # the server's port, and another port the table must leave alone
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", p))
        s.listen(16)
        servers.append(s)
        def serve(s=s):
            while True:
                try:
                    conn, _ = s.accept()
                except OSError:
                    return
                conn.sendall(b"hello")
                conn.close()
        threading.Thread(target=serve, daemon=True).start()

    CLIENT = (
        "import socket, sys\\n"
        "s = socket.socket(); s.settimeout(3); s.bind((sys.argv[1], 0))\\n"
        "try:\\n"
        "    s.connect(('10.9.0.1', int(sys.argv[2]))); print(s.recv(5).decode())\\n"
        "except OSError as exc:\\n"
        "    print(type(exc).__name__)\\n"
    )

    def from_lan(source, p):
        return sh(*in_lan, sys.executable, "-c", CLIENT, source, str(p)).stdout.strip()

    def loopback(p):
        with socket.create_connection(("127.0.0.1", p), timeout=3) as c:
            return c.recv(5).decode()

    def probe():
        return {
            "allowed": from_lan("10.9.0.2", port),
            "denied": from_lan("10.9.0.3", port),
            "denied_other_port": from_lan("10.9.0.3", port + 1),
            "loopback": loopback(port),
        }
    """
)
NAMESPACE_SCRIPT = NAMESPACE_SETUP + textwrap.dedent(
    """
    result = {"before": probe()}
    result["load"] = sh("nft", "-f", ruleset, check=False).returncode
    result["loaded"] = probe()
    result["listing"] = sh("nft", "list", "table", "inet", table).stdout
    result["reload"] = sh("nft", "-f", ruleset, check=False).returncode  # ExecReload / a changed list
    result["tables"] = sh("nft", "list", "tables").stdout.split()
    result["delete"] = sh("nft", "delete", "table", "inet", table, check=False).returncode  # the unit's ExecStop
    result["deleted"] = probe()
    lan.kill()
    print(json.dumps(result))
    """
)


def need_namespaces() -> None:
    for tool in ("unshare", "nsenter", "nft", "ip"):
        if shutil.which(tool) is None:
            unavailable(f"{tool} is not installed (apt-get install util-linux nftables iproute2)")
    probe = subprocess.run(["unshare", "-Urn", "true"], capture_output=True, text=True, timeout=30, check=False)
    if probe.returncode != 0:
        unavailable(f"unprivileged user namespaces are not permitted here ({probe.stderr.strip()}); see the README")


def test_the_ruleset_lets_allowed_clients_in_and_resets_the_others(
    rendered: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    out, _ = rendered
    need_namespaces()
    script = tmp_path / "netns.py"
    script.write_text(NAMESPACE_SCRIPT)
    done = subprocess.run(
        ["unshare", "-Urn", sys.executable, str(script), str(out / "lan.nft"), "rigkit_llama_main", str(PORT)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    everyone = {"allowed": "hello", "denied": "hello", "denied_other_port": "hello", "loopback": "hello"}
    assert result["before"] == everyone  # the namespace works before any rule
    assert result["load"] == 0 and result["reload"] == 0
    assert result["loaded"] == {
        "allowed": "hello",
        "denied": "ConnectionRefusedError",  # the TCP reset
        "denied_other_port": "hello",  # only the server's port is filtered
        "loopback": "hello",
    }
    assert result["tables"] == ["table", "inet", "rigkit_llama_main"]  # reloading replaced it, did not add one
    assert "counter packets 1 " in result["listing"]  # exactly the one denied connection attempt
    assert result["delete"] == 0 and result["deleted"] == everyone


# --- a flushed ruleset ------------------------------------------------------------------------------------------
# Debian's /etc/nftables.conf as the package ships it: what `systemctl reload nftables` (and start, restart, or an
# `nft -f /etc/nftables.conf` by hand) loads. It begins with `flush ruleset`, which removes every table.
ADMIN_RULESET = """#!/usr/sbin/nft -f
flush ruleset
table inet filter {
\tchain input {
\t\ttype filter hook input priority filter;
\t}
}
"""

# nftables.service's own commands (Debian's unit: ExecStart= and ExecReload= `nft -f /etc/nftables.conf`, ExecStop=
# `nft flush ruleset`), then the kit's drop-in's, in the order systemd runs them; the fast path's view of the table
# (module_utils/rig_state.nft_tables) after each.
FLUSH_SCRIPT = NAMESPACE_SETUP + textwrap.dedent(
    """
    import shlex
    dropin_path, kit_path, admin, repo = sys.argv[4], sys.argv[5], sys.argv[6], sys.argv[7]
    sys.path.insert(0, repo)
    import rigkit  # noqa: F401 (module_utils as ansible.module_utils)
    from ansible.module_utils.rig_state import nft_tables

    def dropin(setting):
        argvs = []
        for line in open(dropin_path).read().splitlines():
            if line.startswith(setting + "="):
                argv = shlex.split(line.split("=", 1)[1])
                assert argv == ["/usr/sbin/nft", "-f", kit_path], argv
                argvs.append(["nft", "-f", ruleset])  # the rendered file, where the rig has it at kit_path
        return argvs

    def run(argvs):
        return [sh(*argv, check=False).returncode for argv in argvs]

    def seen():
        return {"probe": probe(), "state": nft_tables(["inet " + table]), "tables": sh("nft", "list", "tables").stdout}

    result = {"load": run([["nft", "-f", ruleset]]), "loaded": seen()}
    result["flush"] = run([["nft", "-f", admin]])  # what nftables.service alone runs on a reload
    result["flushed"] = seen()
    result["reload"] = run([["nft", "-f", admin]] + dropin("ExecReload"))  # systemctl reload nftables
    result["reloaded"] = seen()
    result["restart"] = run([["nft", "flush", "ruleset"], ["nft", "-f", admin]] + dropin("ExecStartPost"))
    result["restarted"] = seen()
    lan.kill()
    print(json.dumps(result))
    """
)


def test_a_flushed_ruleset_is_noticed_and_nftables_itself_loads_the_table_again(
    rendered: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    """`nft -f` of a ruleset that flushes removes the kit's table and changes no file: the fast path's state
    sees it gone (so the rig converges, and the role reloads a missing table), and nftables.service's drop-in
    loads it again after the package's own ruleset on every reload and (re)start."""
    from ansible.module_utils.rig_state import compare, part_digests

    out, _ = rendered
    need_namespaces()
    dropin = (out / "lan.nftables-dropin.conf").read_text()
    assert "[Service]" in dropin.splitlines()
    unit = (out / "lan.firewall.service").read_text()
    assert "PartOf=nftables.service" in unit and "After=nftables.service" in unit
    admin = tmp_path / "nftables.conf"
    admin.write_text(ADMIN_RULESET)
    script = tmp_path / "flush.py"
    script.write_text(FLUSH_SCRIPT)
    argv = ["unshare", "-Urn", sys.executable, str(script), str(out / "lan.nft"), "rigkit_llama_main", str(PORT)]
    argv += [str(out / "lan.nftables-dropin.conf"), "/etc/rigkit/llama-main.nft", str(admin), str(REPO)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    guarded = {
        "allowed": "hello",
        "denied": "ConnectionRefusedError",
        "denied_other_port": "hello",
        "loopback": "hello",
    }
    assert result["load"] == [0] and result["loaded"]["probe"] == guarded
    assert result["loaded"]["state"] == ["inet rigkit_llama_main loaded"]
    # The attack: one flushing `nft -f` and the allow-list is gone, every file untouched.
    assert result["flush"] == [0] and result["flushed"]["probe"]["denied"] == "hello"
    assert result["flushed"]["state"] == ["inet rigkit_llama_main not loaded"]
    recorded = part_digests({"nftables": result["loaded"]["state"]})
    reasons = compare(
        {"inputs": "i", "parts": recorded, "recorded_at": 0},
        "i",
        part_digests({"nftables": result["flushed"]["state"]}),
    )
    assert reasons == [
        "its nftables changed (a table the kit loaded, the client allow-list, is not loaded: a `flush ruleset`?)"
    ]
    # nftables.service with the kit's drop-in: the admin's ruleset, then the allow-list, every time.
    for step in ("reload", "restart"):
        after = result[f"{step}ed"]
        assert all(code == 0 for code in result[step]) and len(result[step]) >= 2, (step, result[step])
        assert after["probe"] == guarded, step
        assert after["state"] == ["inet rigkit_llama_main loaded"], step
        assert "table inet filter" in after["tables"] and "table inet rigkit_llama_main" in after["tables"], step


def test_the_role_reloads_a_missing_table_and_removes_the_drop_in() -> None:
    """A converge finds the table gone even though the unit is active and no file changed: it reloads it."""
    tasks = yaml.safe_load((REPO / "roles/llama_server/tasks/firewall.yml").read_text())
    look = next(t for t in tasks if "ansible.builtin.command" in t)
    assert look["ansible.builtin.command"]["argv"][:4] == ["/usr/sbin/nft", "list", "table", "inet"]
    assert look["check_mode"] is False and look["failed_when"] is False
    load = next(t for t in tasks if "ansible.builtin.systemd_service" in t)["ansible.builtin.systemd_service"]
    assert "__llama_server_nft_live.rc != 0" in load["state"] and "'reloaded'" in load["state"]
    assert tasks.index(next(t for t in tasks if "ansible.builtin.command" in t)) < tasks.index(
        next(t for t in tasks if "ansible.builtin.systemd_service" in t)
    )
    absent = yaml.safe_load((REPO / "roles/llama_server/tasks/firewall_absent.yml").read_text())
    removed = next(t for t in absent if "ansible.builtin.file" in t)["loop"]
    assert "{{ __llama_server_nftables_dropin_path }}" in removed
    settings = (REPO / "roles/llama_server/tasks/settings.yml").read_text()
    assert "nft_tables:" in settings
    record = yaml.safe_load((REPO / "roles/rig_state/tasks/record.yml").read_text())[0]["rig_converged"]
    assert record["nft_tables"] == "{{ rig_state_nft_tables }}"
