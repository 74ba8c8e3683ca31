"""rigkit/fleet/gateway.py: what the gateway fronts, and what it refuses on the controller (each refusal names the
variable, its value and the file to edit)."""

from __future__ import annotations

import pytest

from rigkit.fleet.gateway import (
    KeyFileError,
    alias_of,
    client_keys_file,
    key_file_problems,
    models_list,
    plan,
    rig_keys_file,
    upstream,
)
from tests.support import group_vars

CATALOG = group_vars("all/model_catalog")["model_catalog"]
MTP = {"models_target": "tiny-gemma4-target", "llama_server_port": 18081, "llama_server_host": "127.0.0.1"}


def test_loopback_rigs_are_fronted_only_from_their_own_network():
    found, problems = upstream("sandbox-mtp", MTP, CATALOG, shares_network=True, gateway="fleet")
    assert not problems and found is not None
    assert (found.address, found.port, found.tls, found.alias, found.keyed) == (
        "127.0.0.1",
        18081,
        False,
        "tiny-gemma4",
        False,
    )
    found, problems = upstream("sandbox-mtp", MTP, CATALOG, shares_network=False, gateway="nas")
    assert found is None
    assert problems == [
        "sandbox-mtp: llama_server_host is 127.0.0.1 (loopback), which the gateway on nas cannot reach: serve on an "
        "address the gateway reaches (llama_server_host, with llama_server_api_key from Vault) in "
        "inventory/host_vars/sandbox-mtp.yml, or leave sandbox-mtp out of fleet_gateway_rigs in "
        "inventory/host_vars/nas.yml"
    ]


def test_a_lan_rig_is_reached_over_tls_verified_by_its_inventory_name_with_its_own_key():
    rig = {
        **MTP,
        "llama_server_host": "0.0.0.0",
        "ansible_host": "192.168.1.20",
        "llama_server_tls": "auto",
        "llama_server_api_key": "k" * 32,
        "llama_server_parallel": 2,
        "llama_server_instance": "main",
    }
    found, problems = upstream("desktop3050", rig, CATALOG, shares_network=False, gateway="fleet")
    assert not problems and found is not None
    assert (found.address, found.tls, found.verify_name, found.keyed, found.max_connections) == (
        "192.168.1.20",
        True,
        "desktop3050",
        True,  # keyed: the plan never holds the key itself
        2,
    )
    assert "k" * 32 not in repr(found)
    assert found.cert_path == "/etc/rigkit/tls/main/server.crt"
    # a certificate the user issued is checked for the address the gateway connects to (a name), or pinned (an IP)
    given = {**rig, "llama_server_tls_cert": "-----BEGIN CERTIFICATE-----"}
    assert upstream("desktop3050", given, CATALOG, shares_network=False, gateway="fleet")[0].verify_name == ""
    named = {**given, "llama_server_host": "desktop.lan"}
    assert (
        upstream("desktop3050", named, CATALOG, shares_network=False, gateway="fleet")[0].verify_name == "desktop.lan"
    )


def test_a_rig_serving_plain_http_on_the_lan_is_refused():
    rig = {**MTP, "llama_server_host": "192.168.1.20", "llama_server_tls": False, "llama_server_api_key": "k" * 32}
    found, problems = upstream("laptop", rig, CATALOG, shares_network=False, gateway="fleet")
    assert found is None and len(problems) == 1
    assert "plain HTTP on 192.168.1.20 (llama_server_tls: False)" in problems[0]
    assert "inventory/host_vars/laptop.yml" in problems[0]


@pytest.mark.parametrize("key", ["short", "has a space in it somewhere", "x" * 257, "x" * 32 + "\n"])
def test_a_rig_key_the_gateway_cannot_send_is_refused(key):
    rig = {**MTP, "llama_server_api_key": key}
    found, problems = upstream("sandbox-mtp", rig, CATALOG, shares_network=True, gateway="fleet")
    assert found is None and "llama_server_api_key must be 16 to 256 printable ASCII characters" in problems[0]


def test_aliases_come_from_the_catalog_and_rigs_serving_one_alias_share_it():
    assert alias_of(CATALOG, "gemma-4-E2B-it-qat-q4_0-exact") == "gemma-4-e2b"
    assert alias_of(CATALOG, "gemma-4-E4B-it-qat-q4_0-exact") == "gemma-4-e4b"
    assert alias_of(CATALOG, "unknown-entry") == "unknown-entry"
    rigs = {
        "sandbox": {"models_target": "gemma-3-270m-it-q4_k_m", "llama_server_port": 18080},
        "sandbox-mtp": MTP,
        "gw-tls-rig": {**MTP, "llama_server_port": 18241, "llama_server_tls": True},
    }
    planned = plan(rigs, CATALOG, shares_network=True, gateway="fleet")
    assert planned["problems"] == []
    assert planned["aliases"] == ["gemma-3-270m", "tiny-gemma4"] and planned["default_alias"] == "gemma-3-270m"
    by_rig = {item["rig"]: item for item in planned["upstreams"]}
    assert by_rig["gw-tls-rig"]["backend"] == by_rig["sandbox-mtp"]["backend"] == "model_tiny-gemma4"
    assert by_rig["gw-tls-rig"]["tls"] and by_rig["gw-tls-rig"]["verify_name"] == "gw-tls-rig"


def test_a_default_model_no_rig_serves_and_an_empty_fleet_are_refused():
    planned = plan({"sandbox-mtp": MTP}, CATALOG, shares_network=True, gateway="fleet", default_alias="gemma-4-e4b")
    assert planned["problems"] == [
        "fleet_gateway_default_model is 'gemma-4-e4b', which no rig of fleet_gateway_rigs serves (they serve "
        "tiny-gemma4): fix it in inventory/host_vars/fleet.yml"
    ]
    assert "fleet_gateway_rigs is empty" in plan({}, CATALOG, shares_network=True, gateway="fleet")["problems"][0]


def test_the_model_list_has_openais_shape():
    assert models_list(["a", "b"]) == {
        "object": "list",
        "data": [
            {"id": "a", "object": "model", "created": 0, "owned_by": "rigkit"},
            {"id": "b", "object": "model", "created": 0, "owned_by": "rigkit"},
        ],
    }


def test_a_catalog_alias_is_for_targets_and_well_formed():
    from ansible.module_utils.model_catalog import entry_problems

    entry = dict(CATALOG["tiny-gemma4-assistant"])
    assert any("alias" in problem for problem in entry_problems("x", {**entry, "alias": "tiny"}))
    target = dict(CATALOG["tiny-gemma4-target"])
    assert not entry_problems("x", target)
    assert any("alias" in problem for problem in entry_problems("x", {**target, "alias": "Has Space"}))


KEY = "gw-client-key-" + "7f3a" * 5


@pytest.mark.parametrize("key", [KEY + "\n", KEY + "\nclient", f"{KEY} client", KEY[:15], "x" * 257, None, 12345])
def test_the_client_key_file_refuses_anything_but_one_token(key):
    with pytest.raises(KeyFileError) as refused:
        client_keys_file(key, "fleet")
    assert "fleet_gateway_api_key" in str(refused.value) and "inventory/host_vars/fleet.yml" in str(refused.value)
    assert KEY not in str(refused.value)


def test_key_files_hold_one_token_per_key_and_are_read_back_as_haproxy_reads_them():
    client = client_keys_file(KEY, "fleet")
    assert [line for line in client.splitlines() if not line.startswith("#")] == [KEY]
    rigs = rig_keys_file(
        [{"rig": "desktop", "keyed": True}, {"rig": "sandbox", "keyed": False}], {"desktop": "k" * 32, "sandbox": "x"}
    )
    assert [line for line in rigs.splitlines() if not line.startswith("#")] == ["desktop " + "k" * 32]
    with pytest.raises(KeyFileError):
        rig_keys_file([{"rig": "desktop", "keyed": True}], {"desktop": "k" * 32 + "\n"})
    with pytest.raises(KeyFileError):
        rig_keys_file([{"rig": "two words", "keyed": True}], {"two words": "k" * 32})
    with pytest.raises(KeyFileError):
        rig_keys_file([{"rig": "desktop", "keyed": True}], {})  # keyed in the plan, no key given
    assert key_file_problems(client, client, "/etc/haproxy/rigkit/client-keys.lst") == []
    # a file that holds one more line than was written is caught before the reload, without showing a key
    problems = key_file_problems(client + "client\n", client, "/etc/haproxy/rigkit/client-keys.lst")
    assert len(problems) == 1 and "client-keys.lst holds 2 entries" in problems[0] and KEY not in problems[0]
