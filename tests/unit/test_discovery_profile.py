"""`make discover` (rigkit/discovery/profile.py, `rigkit discover`) on canned outputs of real machines: the
profiles of the seed rigs agree with their hand-written host_vars; profiles of other cards, written by the real
command into a copy of the inventory, resolve there and pass `make check` up to the point where the rig must be
contacted; bad input ends in a message that says what was found and what to do."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.module_utils.gguf_metadata import read_gguf_metadata
from ansible.module_utils.preflight.memory import memory_headroom_mib
from ansible.module_utils.preflight.server import MIB, estimate_memory

from rigkit.discovery.facts import (
    DiscoverError,
    parse_df,
    parse_gather,
    parse_lspci,
    parse_nvidia_smi,
    parse_secure_boot,
)
from rigkit.discovery.profile import (
    Unsafe,
    add_inventory_line,
    catalog_meta,
    plan_profile,
    read_host_vars,
    render_host_vars,
    yaml_lines,
)
from tests.fixtures.discovery_facts import GTX1650TI, INTEL_IGPU, RTX3050, gathered
from tests.fixtures.gemma4_headers import E2B, assistant_header, gemma4_header
from tests.support import REPO, model_catalog, plain, recap, run, templated_var

LLAMA_DEFAULTS = (REPO / "roles/llama_server/defaults/main.yml").read_text()

CATALOG = model_catalog()


MACHINES: dict[str, dict[str, Any]] = {
    "rtx3060": {
        "text": gathered("ubuntu2404", smi="NVIDIA GeForce RTX 3060, 12288, 8.6, 580.95.05, Yes"),
        "gpu": {"name": "NVIDIA GeForce RTX 3060", "vram_mib": 12288, "compute_capability": "8.6", "headless": False},
        "driver": ("580", ""),
        "target": "gemma-4-E4B-it-qat-q4_0-exact",
        "draft": 2,
    },
    "rtx2060": {  # an older driver: the display column is display_mode (Enabled/Disabled)
        "text": gathered("debian13", smi="NVIDIA GeForce RTX 2060, 6144, 7.5, 550.163.01, Disabled"),
        "gpu": {"name": "NVIDIA GeForce RTX 2060", "vram_mib": 6144, "compute_capability": "7.5", "headless": True},
        "driver": ("550", "550.163.01"),
        "target": "gemma-4-E2B-it-qat-q4_0-exact",
        "draft": 2,
    },
    "rtx4090": {
        "text": gathered("ubuntu2204", smi="NVIDIA GeForce RTX 4090, 24564, 8.9, 580.95.05, Yes"),
        "gpu": {"name": "NVIDIA GeForce RTX 4090", "vram_mib": 24564, "compute_capability": "8.9", "headless": False},
        "driver": ("580", ""),
        "target": "gemma-4-E4B-it-qat-q4_0-exact",
        "draft": 2,
    },
    "nodriver": {  # a fresh Debian 12 with no NVIDIA driver: lspci only; the iGPU drives the display
        "text": gathered(
            lspci=INTEL_IGPU + "\n01:00.0 VGA compatible controller [0300]: NVIDIA Corporation GA106 [GeForce RTX "
            "3060 Lite Hash Rate] [10de:2504] (rev a1)\n01:00.1 Audio device [0403]: NVIDIA Corporation GA106 High "
            "Definition Audio Controller [10de:228e] (rev a1)"
        ),
        "gpu": {"name": "NVIDIA GeForce RTX 3060", "vram_mib": 12288, "compute_capability": "8.6", "headless": True},
        "driver": ("535", "535.309.01"),
        "target": "gemma-4-E4B-it-qat-q4_0-exact",
        "draft": 2,
    },
}


def plan(text: str, kind: str = "gpu", **options: Any) -> dict[str, Any]:
    profile = plan_profile(
        parse_gather(text),
        CATALOG,
        host="newrig",
        address="newrig.local" if kind == "gpu" else "docker:newrig",
        user=None,
        kind=kind,
        llama_defaults=LLAMA_DEFAULTS,
        **options,
    )
    written = read_host_vars(render_host_vars(profile))
    assert isinstance(written, dict)
    return written


# ------------------------------------------------------------------------------------------ the seed rigs
SHARED_KEYS = (
    "rig_gpu",
    "nvidia_driver_branch",
    "nvidia_driver_version",
    "models_target",
    "models_drafter",
    "llama_server_ctx_size",
    "llama_server_spec_type",
    "llama_server_spec_draft_n_max",
    "llama_server_flash_attn",
    "llama_server_gpu_layers",
    "llama_server_gpu_layers_draft",
)


@pytest.mark.parametrize(("host", "text"), [("desktop3050", RTX3050), ("laptop1650ti", GTX1650TI)])
def test_seed_rigs_get_their_hand_written_profiles(host: str, text: str) -> None:
    repo = yaml.safe_load((REPO / f"inventory/host_vars/{host}.yml").read_text())
    written = plan(text)
    assert {key: written[key] for key in SHARED_KEYS} == {key: repo[key] for key in SHARED_KEYS}
    assert written["rig_os"] == "debian12"  # the release its driver pin is checked against


@pytest.mark.parametrize(("host", "text"), [("desktop3050", RTX3050), ("laptop1650ti", GTX1650TI)])
def test_seed_rigs_without_a_driver_read_the_same_from_lspci(host: str, text: str) -> None:
    """The same machines before the driver is installed: the PCI ID table gives the same GPU facts."""
    lspci = text.split("@@lspci\n", 1)[1].split("\n@@end", 1)[0]
    repo = yaml.safe_load((REPO / f"inventory/host_vars/{host}.yml").read_text())
    written = plan(gathered(lspci=lspci))
    assert {key: written[key] for key in SHARED_KEYS} == {key: repo[key] for key in SHARED_KEYS}


def test_the_context_comment_shows_the_estimate_and_where_it_came_from() -> None:
    text = render_host_vars(
        plan_profile(
            parse_gather(RTX3050),
            CATALOG,
            host="desktop3050",
            address="desktop3050.local",
            user="me",
            kind="gpu",
            llama_defaults=LLAMA_DEFAULTS,
        )
    ).replace("\n# ", " ")  # the comments as sentences, whatever their wrapping
    assert "ansible_user: me" in text
    assert "start here, then make bench host=desktop3050 + make tune host=desktop3050" in text.lower()
    assert "fits up to 131,072 tokens" in text and "capped at max_ctx=8192" in text
    # E2B + drafter at 8k: the estimate the llama_server defaults were calibrated with (seed: 2,875 MiB measured)
    assert "headroom 1,536 MiB = 2,887 MiB" in text
    assert "nvidia-smi display_attached: yes" in text and "Debian 12's bookworm-security non-free" in text


# ------------------------------------------------------------------------------------------ memory model
def test_catalog_shapes_estimate_like_the_header_only_gguf_files(tmp_path: Path) -> None:
    """The catalog's shape facts feed the preflight the same numbers as a GGUF header of that shape."""
    target = read_gguf_metadata(gemma4_header(tmp_path / "e2b.gguf", **E2B), read_tensors=True)
    drafter = read_gguf_metadata(assistant_header(tmp_path / "d.gguf", out=1536, n_head_kv=1), read_tensors=True)
    from_catalog = (
        catalog_meta("gemma-4-E2B-it-qat-q4_0-exact", CATALOG["gemma-4-E2B-it-qat-q4_0-exact"]),
        catalog_meta("gemma-4-E2B-it-qat-assistant-q4_0-exact", CATALOG["gemma-4-E2B-it-qat-assistant-q4_0-exact"]),
    )
    for settings in ({"flash_attn": "on", "ctx_size": 8192}, {"flash_attn": "off", "ctx_size": 65536}):
        settings["headroom_mib"] = 512
        for layers in ("all", 0):
            a = estimate_memory(target, drafter, gpu_layers=layers, **settings)
            b = estimate_memory(*from_catalog, gpu_layers=layers, **settings)
            assert a.parts() == b.parts(), (settings, layers)


def test_an_entry_without_shape_facts_says_what_to_add() -> None:
    with pytest.raises(DiscoverError, match=r"lacks shape facts .* add its GGUF header facts there"):
        catalog_meta("unsloth-gemma-4-E4B-it-Q4_K_M", CATALOG["unsloth-gemma-4-E4B-it-Q4_K_M"])


def test_context_is_the_largest_that_fits_rounded_down_to_1024() -> None:
    """A CPU machine with 1.2 GB of RAM: the sandbox's pair fits, but not at its full 32k context."""
    written = plan(gathered(mem_kib=1200 * 1024), kind="cpu", max_ctx=32768)
    ctx = written["llama_server_ctx_size"]
    assert ctx % 1024 == 0 and 1024 <= ctx < 32768
    target = catalog_meta("gemma-3-270m-it-q4_k_m", CATALOG["gemma-3-270m-it-q4_k_m"])
    headroom = memory_headroom_mib("auto", on_gpu=False)  # the role's default on a CPU rig
    settings = {"gpu_layers": 0, "flash_attn": "off", "headroom_mib": headroom, "parallel": 1}
    assert estimate_memory(target, target, ctx_size=ctx, **settings).total <= 1200 * MIB
    assert estimate_memory(target, target, ctx_size=ctx + 1024, **settings).total > 1200 * MIB


def test_cpu_rig_gets_the_sandbox_profile() -> None:
    sandbox = yaml.safe_load((REPO / "inventory/host_vars/sandbox.yml").read_text())
    written = plan(gathered(), kind="cpu")
    for key in ("models_target", "models_drafter", "llama_server_ctx_size", "llama_server_spec_type",
                "llama_server_spec_draft_n_max", "llama_server_flash_attn", "llama_server_gpu_layers",
                "llama_server_gpu_layers_draft"):  # fmt: skip
        assert written[key] == sandbox[key], key
    assert written["ansible_host"] == "newrig" and "rig_gpu" not in written


# ------------------------------------------------------------------------------------------ written for real
@pytest.fixture
def inventory_copy(tmp_path: Path) -> Path:
    """A copy of the kit's inventory (never the repository's own)."""
    copy = tmp_path / "inventory"
    shutil.copytree(REPO / "inventory", copy)
    return copy


def discover(inventory: Path, name: str, address: str, text: str, *extra: str) -> Any:
    source = inventory.parent / f"{name}.gathered"
    source.write_text(text)
    argv = ["python", "bin/rigkit", "discover", name, address, "--gathered", str(source)]
    return run([*argv, "--inventory-dir", str(inventory), *extra])


def hostvars(inventory: Path) -> dict[str, Any]:
    result = run(["ansible-inventory", "-i", str(inventory / "hosts.yml"), "--list"])
    assert result.returncode == 0, result.tail()
    listed = plain(json.loads(result.output[result.output.index("{") :]))
    assert isinstance(listed, dict)
    return listed


def test_profiles_of_other_cards_resolve_in_the_inventory(inventory_copy: Path) -> None:
    for name, machine in MACHINES.items():
        done = discover(inventory_copy, name, f"{name}.lan", machine["text"], "--user", "admin")
        assert done.returncode == 0, done.output
        assert f"+++ b/inventory/host_vars/{name}.yml" in done.output and f"+            {name}:" in done.output
    listed = hostvars(inventory_copy)
    assert set(listed["gpu_rigs"]["hosts"]) == {"desktop3050", "laptop1650ti", *MACHINES}
    for name, machine in MACHINES.items():
        hv = listed["_meta"]["hostvars"][name]
        assert hv["rig_gpu"] == machine["gpu"], name
        assert (hv["nvidia_driver_branch"], hv["nvidia_driver_version"]) == machine["driver"], name
        assert hv["models_target"] == machine["target"] and hv["models_drafter"] in CATALOG, name
        assert CATALOG[hv["models_drafter"]]["pairs_with"] == hv["models_target"], name
        assert hv["llama_server_spec_draft_n_max"] == machine["draft"], name
        assert hv["llama_server_ctx_size"] == 8192 and hv["llama_server_spec_type"] == "draft-mtp", name
        assert hv["llama_server_flash_attn"] == ("off" if "E4B" in machine["target"] else "on"), name
        assert (hv["ansible_host"], hv["ansible_user"], hv["rig_kind"]) == (f"{name}.lan", "admin", "gpu"), name
        assert hv["rig_os"] in ("debian12", "debian13", "ubuntu22.04", "ubuntu24.04"), name
    for path in (inventory_copy / "host_vars").glob("*.yml"):
        lint = run(["yamllint", "--strict", "-c", str(REPO / ".yamllint"), str(path)])
        assert lint.returncode == 0, lint.output


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_make_check_stops_only_where_the_rig_must_be_contacted(inventory_copy: Path, name: str, tmp_path: Path) -> None:
    """As for the seed rigs (test_inventory.py): with its models pinned, validation passes and only the
    connection fails."""
    done = discover(inventory_copy, name, "127.0.0.1", MACHINES[name]["text"])
    assert done.returncode == 0, done.output
    catalog = json.loads(json.dumps(CATALOG))
    target = MACHINES[name]["target"]
    for entry in (target, next(n for n, e in catalog.items() if e.get("pairs_with") == target and "exact" in n)):
        catalog[entry].update(revision="0" * 40, sha256=catalog[entry]["sha256"] or "1" * 64, size=1000)
    pins = tmp_path / "pins.json"
    pins.write_text(json.dumps({"model_catalog": catalog}))
    result = run(
        ["make", "--no-print-directory", "check", f"host={name}", f"ARGS=-e ansible_port=1 -e @{pins}"],
        log_name=f"discover-check-{name}",
        ANSIBLE_INVENTORY=str(inventory_copy / "hosts.yml"),
    )
    counters = recap(result.output)[name]
    assert counters["failed"] == 0 and counters["unreachable"] == 1, result.tail()
    assert "ssh: connect to host 127.0.0.1 port 1" in result.output


def test_an_existing_profile_is_replaced_only_with_force(inventory_copy: Path) -> None:
    path = inventory_copy / "host_vars/desktop3050.yml"
    before = path.read_text()
    refused = discover(inventory_copy, "desktop3050", "desktop3050.local", RTX3050)
    assert refused.returncode == 1 and "exists and differs (diff above): rerun with force=1" in refused.output
    assert "-# RTX 3050 OEM desktop" in refused.output and "+# Written by make discover" in refused.output
    assert path.read_text() == before
    forced = discover(inventory_copy, "desktop3050", "desktop3050.local", RTX3050, "--force")
    assert forced.returncode == 0, forced.output
    assert path.read_text() != before and read_host_vars(path.read_text())["llama_server_ctx_size"] == 8192
    again = discover(inventory_copy, "desktop3050", "desktop3050.local", RTX3050)
    assert again.returncode == 0 and "desktop3050.yml: unchanged" in again.output
    assert (inventory_copy / "hosts.yml").read_text() == (REPO / "inventory/hosts.yml").read_text()


def test_a_name_from_the_other_group_is_refused(inventory_copy: Path) -> None:
    done = discover(inventory_copy, "sandbox", "box.lan", RTX3050)
    assert done.returncode == 1
    assert "sandbox is already a rig of sandbox_rigs" in done.output and "pick another name" in done.output


def test_an_address_that_could_be_an_option_is_refused(inventory_copy: Path) -> None:
    for address in ("-oProxyCommand=touch /tmp/x", "docker:-it", "docker:"):
        done = run(["python", "bin/rigkit", "discover", "--inventory-dir", str(inventory_copy), "--", "x", address])
        assert done.returncode == 1 and "give a host name or IP address" in done.output, address


def test_make_discover_needs_host_and_address() -> None:
    done = run(["make", "--no-print-directory", "discover", "host=x"])
    assert done.returncode == 2 and "usage: make discover host=NAME address=HOST" in done.output
    script = run(["python", "bin/rigkit", "discover", "--print-script"])
    assert script.returncode == 0 and script.output.startswith("echo '@@os-release'")
    assert run(["python", "bin/rigkit", "discover", "x"]).returncode == 2


def test_the_gather_script_reads_this_machine() -> None:
    """The script itself, run by a real sh on this machine (a CPU-only VM): every section parses."""
    from rigkit.discovery.facts import GATHER_SCRIPT

    done = subprocess.run(["sh", "-s"], input=GATHER_SCRIPT, capture_output=True, text=True, check=True)
    facts = parse_gather(done.stdout)
    assert facts.os_id and facts.kernel and facts.cpu_cores >= 1 and facts.mem_mib > 0 and facts.disk_free_mib > 0
    assert facts.secure_boot != "unknown" and facts.cpu_model != "unknown"


# ------------------------------------------------------------------------------------------ hostile machines
# A name nvidia-smi could print on a machine someone else controls: no comma, so the CSV
# split keeps it whole; as a plain YAML value in the inventory it is a template Ansible runs on the controller.
def payload(marker: Path) -> str:
    return "NVIDIA GeForce RTX 3050 {{ lookup(*'pipe|touch " + str(marker) + "'.split('|')) }}"


def test_a_machine_printing_a_template_cannot_run_code_on_the_controller(inventory_copy: Path, tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    hostile = gathered(smi=f"{payload(marker)}, 8192, 8.6, 535.261.03, Yes")
    done = discover(inventory_copy, "hostile", "192.0.2.10", hostile)
    # What `make check host=hostile` would make of the inventory now: Ansible templates rig_gpu for real.
    if (inventory_copy / "host_vars/hostile.yml").exists():
        templated_var(inventory_copy / "hosts.yml", "hostile", "rig_gpu")
    assert not marker.exists(), "the GPU name ran a command on the controller"
    assert done.returncode == 1, done.output
    assert 'the machine reports the GPU name "NVIDIA GeForce RTX 3050 {{ lookup(' in done.output
    assert "nvidia-smi --query-gpu=name" in done.output and "Nothing was written" in done.output
    assert not (inventory_copy / "host_vars/hostile.yml").exists()
    assert (inventory_copy / "hosts.yml").read_text() == (REPO / "inventory/hosts.yml").read_text()


@pytest.mark.parametrize(
    ("field", "text"),
    [
        ("os-release PRETTY_NAME", gathered().replace("(bookworm)", "\x1b]0;owned\x07")),
        ("os-release ID", gathered().replace("ID=debian", "ID=debian{{x}}")),
        ("the kernel release", gathered().replace("6.1.0-27-amd64", "6.1.0-27-amd64{{x}}")),
        ("the CPU model", gathered().replace("AMD Ryzen", "AMD {% x %} Ryzen")),
        ("the driver version", gathered(smi="NVIDIA GeForce RTX 3060, 12288, 8.6, 535.{{x}}, Yes")),
        ("a display controller", gathered(lspci=INTEL_IGPU.replace("UHD Graphics", "UHD \u202e Graphics"))),
    ],
)
def test_every_machine_reported_value_is_checked_against_what_it_can_be(field: str, text: str) -> None:
    with pytest.raises(DiscoverError) as caught:
        parse_gather(text)
    message = str(caught.value)
    assert message.startswith(f"the machine reports {field} ") and "Nothing was written" in message
    assert message.isascii() and "\x1b" not in message  # shown with its escapes visible, never sent to the terminal


def test_unicode_digits_are_not_numbers() -> None:
    """'²'.isdigit() and '٣'.isdigit() are True (and int('٣') is 3): the parsers take ASCII digits only."""
    with pytest.raises(DiscoverError, match="instead of GPU rows"):
        parse_nvidia_smi("NVIDIA GeForce RTX 3060, \u0663\u0663\u0663, 8.6, 535.261.03, Yes")
    with pytest.raises(DiscoverError, match="instead of GPU rows"):
        parse_nvidia_smi("NVIDIA GeForce RTX 3060, 12288, \u0668.\u0666, 535.261.03, Yes")
    facts = parse_gather(gathered().replace("\n12\n", "\n\u00b2\n").replace("MemTotal:       ", "MemTotal: \u0663"))
    assert (facts.cpu_cores, facts.mem_mib) == (0, 0)
    assert parse_df("/var/lib\nFilesystem 1024-blocks Used Available\n/dev/x 10 5 \u0663\u0663 50% /")[1] == 0


def test_written_machine_text_is_tagged_unsafe_and_never_templated(inventory_copy: Path, tmp_path: Path) -> None:
    """Behind the check, the serializer: what the machine said is written `!unsafe`, which Ansible shows as it
    is. Proven with a value no check would let through, written by the same serializer into host_vars."""
    marker = tmp_path / "PWNED"
    profile = plan_profile(
        parse_gather(RTX3050), CATALOG, host="tagged", address="192.0.2.11", user=None, kind="gpu",
        llama_defaults=LLAMA_DEFAULTS,
    )  # fmt: skip
    text = render_host_vars(profile)
    assert '  name: !unsafe "NVIDIA GeForce RTX 3050 OEM"' in text.splitlines()
    lines = yaml_lines("rig_gpu", {"name": Unsafe(payload(marker)), "vram_mib": 8192})
    (inventory_copy / "host_vars/tagged.yml").write_text("\n".join(["---", *lines]) + "\n")
    hosts = inventory_copy / "hosts.yml"
    hosts.write_text(add_inventory_line(hosts.read_text(), "tagged", "gpu_rigs"))
    value, printed = templated_var(hosts, "tagged", "rig_gpu")
    assert not marker.exists(), printed
    assert plain(value) == {"name": payload(marker), "vram_mib": 8192}, printed  # shown literally
    with pytest.raises(DiscoverError, match="the machine reports the GPU name"):
        profile.values["rig_gpu"]["name"] = payload(marker)
        render_host_vars(profile)  # the serializer checks again: nothing reaches it unchecked


# ------------------------------------------------------------------------------------------ bad input
def test_unreachable_address_says_what_to_check(inventory_copy: Path) -> None:
    argv = ["python", "bin/rigkit", "discover", "far", "far-away.invalid", "--inventory-dir", str(inventory_copy)]
    done = run(argv)
    assert done.returncode == 1
    assert "cannot reach the machine (SSH to far-away.invalid exited 255" in done.output
    assert "ssh-copy-id far-away.invalid" in done.output
    assert not (inventory_copy / "host_vars/far.yml").exists()


# A window title, a screen clear and a carriage return: what a hostile machine (or its sshd banner) can print.
ESCAPES = "\x1b]0;pwned\x07\x1b[2J\rowned"


def test_what_ssh_says_of_an_unreachable_machine_is_shown_not_obeyed(inventory_copy: Path, tmp_path: Path) -> None:
    fake = tmp_path / "bin" / "ssh"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\nprintf '{ESCAPES}\\n' >&2\nexit 255\n")
    fake.chmod(0o755)
    argv = ["python", "bin/rigkit", "discover", "far", "far-away.invalid", "--inventory-dir", str(inventory_copy)]
    done = run(argv, PATH=f"{fake.parent}:{REPO / '.venv' / 'bin'}:{os.environ['PATH']}")
    assert done.returncode == 1
    assert "\x1b" not in done.output and "\r" not in done.output, repr(done.output)
    assert "\\x1b]0;pwned\\x07\\x1b[2J" in done.output


def test_an_answer_that_stops_early_is_shown_not_obeyed() -> None:
    with pytest.raises(DiscoverError) as caught:
        parse_gather(f"@@os-release\nNAME={ESCAPES}\n")
    assert "\x1b" not in str(caught.value) and "\\x1b]0;pwned" in str(caught.value)


def test_missing_container_says_what_to_check(inventory_copy: Path) -> None:
    argv = ["python", "bin/rigkit", "discover", "gone", "docker:discover-no-such-container"]
    done = run([*argv, "--inventory-dir", str(inventory_copy)])
    assert done.returncode == 1
    assert "docker exec into container discover-no-such-container" in done.output
    assert "docker start discover-no-such-container" in done.output


def test_no_nvidia_gpu() -> None:
    with pytest.raises(DiscoverError) as caught:
        plan(gathered(lspci=INTEL_IGPU))
    message = str(caught.value)
    assert "found no NVIDIA GPU on this machine: nvidia-smi absent, lspci shows no NVIDIA GPU" in message
    assert "Intel Corporation CometLake-H GT2 [UHD Graphics] [8086:9bc4]" in message
    assert "address=docker:NAME" in message
    with pytest.raises(DiscoverError, match="lspci absent \\(install pciutils\\)"):
        plan(gathered(lspci=None))


def test_unsupported_os() -> None:
    with pytest.raises(DiscoverError) as caught:
        plan(gathered("fedora", smi="NVIDIA GeForce RTX 3060, 12288, 8.6, 560.35.03, Yes"))
    assert str(caught.value) == (
        "the machine runs Fedora Linux 41 (Workstation Edition) (ID=fedora, VERSION_ID=41); the kit provisions "
        "Debian 12, Debian 13, Ubuntu 22.04, Ubuntu 24.04: install one of those, then run make discover again"
    )


def test_unknown_pci_id() -> None:
    line = "01:00.0 VGA compatible controller [0300]: NVIDIA Corporation GB202 [GeForce RTX 5090] [10de:2b85] (rev a1)"
    with pytest.raises(DiscoverError) as caught:
        plan(gathered(lspci=line))
    assert "not in the kit's table (rigkit/discovery/facts.py PCI_GPUS)" in str(caught.value)
    assert line in str(caught.value) and "install the driver (nvidia-smi)" in str(caught.value)


def test_a_pci_id_with_memory_variants_asks_which() -> None:
    line = "01:00.0 VGA compatible controller [0300]: NVIDIA Corporation GA104 [GeForce RTX 3060] [10de:2487] (rev a1)"
    with pytest.raises(DiscoverError) as caught:
        plan(gathered(lspci=line))
    assert "NVIDIA GeForce RTX 3060 (PCI 10de:2487) comes with 8192 or 12288 MiB" in str(caught.value)
    assert "vram=8192" in str(caught.value)
    written = plan(gathered(lspci=line), vram_override=12288)
    assert written["rig_gpu"]["vram_mib"] == 12288 and written["models_target"] == "gemma-4-E4B-it-qat-q4_0-exact"


def test_a_broken_driver_falls_back_to_lspci_and_says_so() -> None:
    failure = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    text = gathered(smi=failure, smi_failed=True, lspci=RTX3050.split("@@lspci\n", 1)[1].split("\n@@end", 1)[0])
    profile = plan_profile(
        parse_gather(text), CATALOG, host="h", address="a", user=None, kind="gpu", llama_defaults=LLAMA_DEFAULTS
    )
    assert profile.values["rig_gpu"]["name"] == "NVIDIA GeForce RTX 3050 OEM"
    assert any(failure in warning and "read from lspci instead" in warning for warning in profile.warnings)


def test_pre_turing_cards_get_the_proprietary_modules() -> None:
    written = plan(gathered(smi="NVIDIA GeForce GTX 1050 Ti, 4096, 6.1, 535.261.03, Yes"))
    assert written["nvidia_driver_kernel_modules"] == "proprietary" and written["llama_server_spec_draft_n_max"] == 1
    with pytest.raises(DiscoverError, match=r"compute capability 3\.0;.*5\.0 \(Maxwell\) or newer"):
        plan(gathered(smi="NVIDIA GeForce GTX 680, 2048, 3.0, 470.256.02, Yes"))


def test_secure_boot_enabled_is_a_warning_with_the_fix() -> None:
    text = gathered(smi="NVIDIA GeForce RTX 3060, 12288, 8.6, 535.261.03, Yes", secure_boot="SecureBoot enabled")
    profile = plan_profile(
        parse_gather(text), CATALOG, host="h", address="a", user=None, kind="gpu", llama_defaults=LLAMA_DEFAULTS
    )
    assert any("mokutil --import /var/lib/dkms/mok.pub" in warning for warning in profile.warnings)


# ------------------------------------------------------------------------------------------ parsers
def test_parsers() -> None:
    assert parse_secure_boot("SecureBoot enabled") == "enabled"
    assert parse_secure_boot("efivar 0") == "disabled"
    assert parse_secure_boot("efi without SecureBoot variable").startswith("not available")
    assert parse_secure_boot("no EFI (legacy BIOS boot)") == "not available (no EFI)"
    assert parse_secure_boot("EFI variables are not supported on this system") == "not available (no EFI)"
    [gpu] = parse_nvidia_smi("NVIDIA GeForce RTX 4090, 24564, 8.9, 580.95.05, [N/A]\n")
    assert (gpu.vram_mib, gpu.compute_capability, gpu.display_attached) == (24564, "8.9", None)
    with pytest.raises(DiscoverError, match="driver is installed but not working"):
        parse_nvidia_smi("Failed to initialize NVML: Driver/library version mismatch")
    known, unknown, others = parse_lspci(GTX1650TI.split("@@lspci\n", 1)[1])
    assert [(g.name, g.display_attached) for g in known] == [("NVIDIA GeForce GTX 1650 Ti", False)]
    assert unknown == [] and others == ["Intel Corporation CometLake-H GT2 [UHD Graphics] [8086:9bc4]"]
    facts = parse_gather(GTX1650TI)
    assert (facts.cpu_model, facts.cpu_cores, facts.mem_mib, facts.disk_free_mib) == (
        "AMD Ryzen 5 5600G with Radeon Graphics",
        12,
        32768,
        331234567 // 1024,
    )
    with pytest.raises(DiscoverError, match="no @@end marker"):
        parse_gather(GTX1650TI.replace("@@end", ""))


def test_inventory_line_goes_under_its_group_once() -> None:
    hosts = (REPO / "inventory/hosts.yml").read_text()
    added = add_inventory_line(hosts, "newbox", "sandbox_rigs")
    data = yaml.safe_load(added)["all"]["children"]["rigs"]["children"]
    assert list(data["sandbox_rigs"]["hosts"]) == ["sandbox", "sandbox-mtp", "newbox"]
    assert list(data["gpu_rigs"]["hosts"]) == ["desktop3050", "laptop1650ti"]
    assert add_inventory_line(added, "newbox", "sandbox_rigs") == added
    assert add_inventory_line(hosts, "desktop3050", "gpu_rigs") == hosts


def section(path: str, heading: str) -> str:
    """The text under a markdown heading (`## Title`), up to the next heading of the same level."""
    level = heading.split(" ", 1)[0]
    return (REPO / path).read_text().split(f"{heading}\n", 1)[1].split(f"\n{level} ", 1)[0]


@pytest.mark.parametrize(
    ("path", "heading"),
    [("README.md", "## Your GPU rig"), ("docs/rigs.md", "## Adding a rig")],
)
def test_adding_a_rig_starts_with_make_discover(path: str, heading: str) -> None:
    """The README's GPU rig steps and the full walkthrough in docs/ both begin with `make discover`, before any
    host_vars file is written by hand."""
    text = section(path, heading)
    first_command = next(line for line in text.splitlines() if line.startswith("make "))
    assert first_command.startswith("make discover host=")
    assert text.index("make discover") < text.index("host_vars")
