"""llama-server's optional client allow-list (issue 15, item 2): the kit's own nftables table, rendered by the
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
    from rigkit.rig_validate import load_specs, rig_problems

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
NAMESPACE_SCRIPT = textwrap.dedent(
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


def test_the_ruleset_lets_allowed_clients_in_and_resets_the_others(
    rendered: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    out, _ = rendered
    for tool in ("unshare", "nsenter", "nft", "ip"):
        if shutil.which(tool) is None:
            unavailable(f"{tool} is not installed (apt-get install util-linux nftables iproute2)")
    probe = subprocess.run(["unshare", "-Urn", "true"], capture_output=True, text=True, timeout=30, check=False)
    if probe.returncode != 0:
        unavailable(f"unprivileged user namespaces are not permitted here ({probe.stderr.strip()}); see the README")
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
