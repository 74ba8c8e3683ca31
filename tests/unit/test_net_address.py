"""One definition of a loopback bind (module_utils/net_address.py), used by the controller's validation, the
llama_server role (API key, TLS), the certificate's CN and the rig tests alike."""

from __future__ import annotations

import re

import pytest
from ansible.module_utils.net_address import is_loopback

from tests.support import REPO


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),  # all of 127.0.0.0/8 stays on the machine
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("LOCALHOST", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.0.2.7", False),
        ("rig.local", False),
        ("", False),
    ],
)
def test_loopback_binds(host, loopback):
    assert is_loopback(host) is loopback


def test_the_role_and_the_controller_use_the_one_definition():
    from filter_plugins.llama_server import FilterModule
    from rigkit.validation import rules as rig_validate

    assert FilterModule().filters()["rigkit_is_loopback"] is is_loopback
    assert rig_validate.is_loopback is is_loopback
    role_vars = (REPO / "roles/llama_server/vars/main.yml").read_text()
    assert re.search(
        r"^__llama_server_loopback: \"\{\{ llama_server_host \| rigkit_is_loopback \}\}\"$", role_vars, re.M
    )
    # no second list of loopback names anywhere in the product
    for path in [*REPO.glob("roles/*/vars/*.yml"), *REPO.glob("rigkit/**/*.py"), *REPO.glob("module_utils/**/*.py")]:
        assert "['127.0.0.1', '::1', 'localhost']" not in path.read_text(), path


@pytest.mark.parametrize(
    ("setting", "host", "tls"),
    [
        ("auto", "127.0.0.1", False),
        ("auto", "127.0.0.2", False),
        ("auto", "0.0.0.0", True),
        ("auto", "192.168.1.20", True),
        (True, "127.0.0.1", True),
        ("yes", "::1", True),
        (False, "0.0.0.0", False),
        ("off", "10.0.0.1", False),
    ],
)
def test_one_tls_rule_for_the_server_the_gateway_the_monitor_and_the_rig_suite(setting, host, tls):
    from ansible.module_utils.net_address import serves_tls

    from filter_plugins.llama_server import FilterModule

    assert serves_tls(setting, host) is tls
    assert FilterModule().filters()["rigkit_serves_tls"] is serves_tls
    role_vars = (REPO / "roles/llama_server/vars/main.yml").read_text()
    assert '__llama_server_tls: "{{ llama_server_tls | rigkit_serves_tls(llama_server_host) }}"' in role_vars
