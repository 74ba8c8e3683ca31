"""The wildcard rule has one home (module_utils/net_address.py): where the rig itself reaches a service bound to a
wildcard, a loopback or a specific address, and that service's URL. The roles' URLs (llama_server,
node_exporter, fleet_gateway) are rendered here from their own vars files and must equal what the rule says."""

from __future__ import annotations

from pathlib import Path

from ansible.module_utils.net_address import probe_address, service_url

from tests import support

BINDS = ["0.0.0.0", "::", "127.0.0.1", "::1", "192.168.1.20", "fe80::20", "rig.local"]
PLAYBOOK = f"""
- hosts: all
  gather_facts: false
  tasks:
    - name: Read each role's own vars
      ansible.builtin.include_vars: "{{{{ item }}}}"
      loop:
        - {support.REPO}/roles/llama_server/vars/main.yml
        - {support.REPO}/roles/node_exporter/vars/main.yml
        - {support.REPO}/roles/fleet_gateway/vars/main.yml
    - name: The URLs the roles probe
      ansible.builtin.set_fact:
        urls:
          llama_server: "{{{{ __llama_server_url }}}}"
          node_exporter: "{{{{ __node_exporter_url }}}}"
          fleet_gateway: "{{{{ __fleet_gateway_url }}}}"
"""


def test_every_roles_probe_url_follows_the_one_rule(tmp_path: Path) -> None:
    hosts = {
        f"bind{number}": {
            "llama_server_host": bind,
            "llama_server_port": 8080,
            "llama_server_tls": "auto",
            "llama_server_instance": "main",
            "node_exporter_host": bind,
            "node_exporter_port": 9100,
            "node_exporter_tls": "auto",
            "fleet_gateway_bind": bind,
            "fleet_gateway_port": 8443,
        }
        for number, bind in enumerate(BINDS)
    }
    document = support.local_play(tmp_path, PLAYBOOK, hosts)
    results = document["plays"][0]["tasks"][-1]["hosts"]
    for name, values in hosts.items():
        bind = values["llama_server_host"]
        tls = bind not in ("127.0.0.1", "::1")  # auto: TLS off loopback
        assert results[name]["ansible_facts"]["urls"] == {
            "llama_server": service_url(probe_address(bind), 8080, tls),
            "node_exporter": service_url(probe_address(bind), 9100, tls, "/metrics"),
            "fleet_gateway": service_url(probe_address(bind), 8443, True),
        }, bind
    # the rule itself: a wildcard is reached on loopback, an IPv6 address in brackets
    assert service_url(probe_address("::"), 8080, False) == "http://127.0.0.1:8080"
    assert service_url(probe_address("fe80::20"), 9100, "True", "/metrics") == "https://[fe80::20]:9100/metrics"


def test_a_change_of_the_rule_in_its_home_reaches_every_role(tmp_path: Path) -> None:
    """The rule changed in module_utils/net_address.py alone (a copy that shadows it): every role's URL follows."""
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    rule = (support.REPO / "module_utils/net_address.py").read_text()
    changed = rule.replace('return "127.0.0.1" if is_wildcard(host)', 'return "127.0.0.9" if is_wildcard(host)')
    assert changed != rule
    (shadow / "net_address.py").write_text(changed)
    # Python runs sitecustomize at start: the copy is found before the repository's module_utils
    (shadow / "sitecustomize.py").write_text(
        f"import ansible.module_utils\nansible.module_utils.__path__.insert(0, {str(shadow)!r})\n"
    )
    hosts = {
        "wild": {
            "llama_server_host": "0.0.0.0",
            "llama_server_port": 8080,
            "llama_server_tls": "false",
            "llama_server_instance": "main",
            "node_exporter_host": "::",
            "node_exporter_port": 9100,
            "node_exporter_tls": "false",
            "fleet_gateway_bind": "0.0.0.0",
            "fleet_gateway_port": 8443,
        }
    }
    document = support.local_play(tmp_path, PLAYBOOK, hosts, PYTHONPATH=str(shadow))
    assert document["plays"][0]["tasks"][-1]["hosts"]["wild"]["ansible_facts"]["urls"] == {
        "llama_server": "http://127.0.0.9:8080",
        "node_exporter": "http://127.0.0.9:9100/metrics",
        "fleet_gateway": "https://127.0.0.9:8443",
    }
