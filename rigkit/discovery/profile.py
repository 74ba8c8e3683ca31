"""`make discover`: turn what a machine reports about itself into a commented host profile.

Pure functions on command outputs (tested on canned outputs in tests/unit/test_discovery_profile.py); bin/rigkit
runs the read-only commands (GATHER_SCRIPT, rigkit/discovery/facts.py with the parsers) over SSH or `docker exec` and
writes the result.

    facts = parse_gather(text)                           # sections of GATHER_SCRIPT's output
    profile = plan_profile(facts, catalog, kind="gpu")   # raises DiscoverError with what to do next
    render_host_vars(profile)                            # inventory/host_vars/NAME.yml, every value commented

The context is the largest that fits by module_utils/preflight/server.py's memory model (the preflight the
llama_server role runs on the rig), fed with the shape facts catalog entries carry (`shape:`), never with
numbers of its own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import yaml
from ansible.module_utils.gguf_metadata import GgufMetadata
from ansible.module_utils.nvidia_compat import DRIVER_PINS, compute_capability, open_modules_problem
from ansible.module_utils.preflight.memory import HEADROOM_VARIABLE, memory_headroom_mib
from ansible.module_utils.preflight.server import estimate_memory, largest_fitting_ctx

from rigkit.discovery.facts import (
    COMPUTE_CAPABILITY_RE,
    GPU_NAME_RE,
    MODELS_DIR,
    DiscoverError,
    Facts,
    Gpu,
    checked,
    shown,
)
from rigkit.validation.catalog_shape import MissingShape
from rigkit.validation.catalog_shape import catalog_meta as shape_meta

__all__ = [
    "HostVarsLoader",
    "Profile",
    "Unsafe",
    "add_inventory_line",
    "catalog_meta",
    "plan_profile",
    "read_host_vars",
    "render_host_vars",
    "yaml_lines",
]

# ---------------------------------------------------------------------------------------------- driver plans
# What each supported OS carries that installs and builds today: DRIVER_PINS (module_utils/nvidia_compat.py, the
# same pins the roles, the validation and the inventory use). Every branch there serves Maxwell (5.0) and newer,
# and the llama.cpp image's CUDA 12 runtime (which wants >= 535).
MIN_COMPUTE_CAPABILITY = (5, 0)  # Maxwell: the oldest these branches and CUDA 12 support

# ---------------------------------------------------------------------------------------------- rig classes
# The seed article's rigs (shared/seeds/000): E2B exact Q4_0 + its exact drafter, draft length 2 on the 8 GB
# RTX 3050 desktop and 1 on the 4 GB GTX 1650 Ti laptop. Larger cards start on the E4B exact pair (same
# builder, same drafter design); E4B with its drafter runs with flash attention off (llama-server-facts.md:
# the CUDA flash-attention kernel aborts). (upper VRAM bound MiB, class, target, drafter, flash_attn, draft n)
VRAM_SLACK_MIB = 512  # nvidia-smi reports a little more or less than the box says (the role's verify tolerance)
E2B = ("gemma-4-E2B-it-qat-q4_0-exact", "gemma-4-E2B-it-qat-assistant-q4_0-exact", "on")
E4B = ("gemma-4-E4B-it-qat-q4_0-exact", "gemma-4-E4B-it-qat-assistant-q4_0-exact", "off")
RIG_CLASSES: tuple[tuple[int, str, tuple[str, str, str], int], ...] = (
    (4096 + VRAM_SLACK_MIB, "a 4 GB card like the seed's GTX 1650 Ti laptop", E2B, 1),
    (8192 + VRAM_SLACK_MIB, "an 8 GB card like the seed's RTX 3050 desktop", E2B, 2),
    (1 << 30, "a card larger than the seed's 8 GB", E4B, 2),
)
# A CPU rig is the sandbox's configuration (inventory/host_vars/sandbox.yml): the real Gemma 3 270M drafting
# for itself with draft-simple.
CPU_PAIR = ("gemma-3-270m-it-q4_k_m", "gemma-3-270m-it-q4_k_m", "off")
CPU_DRAFT_N = 4
DEFAULT_MAX_CTX = {"gpu": 8192, "cpu": 2048}  # the seed article's context; the sandbox's
SUPPORTED = ", ".join(f"{d.capitalize()} {v}" for d, v in DRIVER_PINS)


# ---------------------------------------------------------------------------------------------- memory model
def catalog_meta(name: str, entry: dict[str, Any]) -> GgufMetadata:
    """The entry's shape facts as a GGUF header (rigkit/validation/catalog_shape.py); discover says why it needs
    them."""
    try:
        return shape_meta(name, entry)
    except MissingShape as exc:
        raise DiscoverError(f"{exc} so discover can size its context") from None


# ---------------------------------------------------------------------------------------------- profile
@dataclass
class Profile:
    host: str
    kind: str  # gpu | cpu
    address: str
    user: str | None
    facts: Facts
    values: dict[str, Any]
    comments: dict[str, str]
    warnings: list[str] = field(default_factory=list)
    headline: str = ""


def _choose_gpu(facts: Facts, vram_override: int | None) -> Gpu:
    if not facts.gpus:
        if facts.unknown_nvidia:
            lines = "\n  ".join(facts.unknown_nvidia)
            raise DiscoverError(
                f"found an NVIDIA GPU whose PCI ID is not in the kit's table (rigkit/discovery/facts.py "
                f"PCI_GPUS) and no working driver to ask:\n  {lines}\nAdd its ID with name, memory sizes and "
                "compute capability to PCI_GPUS, or install the driver (nvidia-smi) and run make discover again"
            )
        seen = "nvidia-smi absent" if facts.nvidia_smi == "absent" else f"nvidia-smi {facts.nvidia_smi}"
        seen += ", lspci absent (install pciutils)" if facts.lspci == "absent" else ", lspci shows no NVIDIA GPU"
        others = f" (display controllers: {'; '.join(facts.other_displays)})" if facts.other_displays else ""
        raise DiscoverError(
            f"found no NVIDIA GPU on this machine: {seen}{others}. A GPU rig needs one (check that the card is "
            "seated and enabled in the firmware); for a CPU-only rig use a sandbox container (address=docker:NAME)"
        )
    gpu = facts.gpus[0]
    if vram_override is not None:
        gpu.vram_mib = vram_override
    elif gpu.vram_mib is None:
        choices = " or ".join(str(v) for v in gpu.vram_choices)
        raise DiscoverError(
            f"{gpu.name} (PCI {gpu.pci_id}) comes with {choices} MiB of memory and without a driver nothing says "
            f"which: check the box or the card's label, then run make discover again with vram={gpu.vram_choices[0]}"
            " (or the other size)"
        )
    return gpu


def _headroom(defaults_text: str, kind: str) -> int:
    """The llama_server role's default headroom (defaults/main.yml), resolved as the rig resolves it."""
    defaults = yaml.safe_load(defaults_text) or {}
    try:
        return memory_headroom_mib(defaults.get(HEADROOM_VARIABLE), on_gpu=kind == "gpu")
    except ValueError as exc:
        raise DiscoverError(
            f"roles/llama_server/defaults/main.yml: {exc}: restore it (auto) from the repository"
        ) from None


def _fit(
    catalog: dict[str, Any], pair: tuple[str, str, str], budget_mib: int, headroom_mib: int, *, gpu: bool, cap: int
) -> tuple[int, int, Any] | None:
    """(context, largest fitting context, estimate at that context) or None when not even 1,024 tokens fit."""
    target, drafter, flash = pair
    t_meta = catalog_meta(target, catalog.get(target, {}))
    d_meta = catalog_meta(drafter, catalog.get(drafter, {}))
    layers = "all" if gpu else 0
    estimate = estimate_memory(
        t_meta, d_meta, ctx_size=1024, parallel=1, flash_attn=flash, gpu_layers=layers, gpu_layers_draft=layers,
        headroom_mib=headroom_mib,
    )  # fmt: skip
    best = largest_fitting_ctx(estimate, budget_mib)
    if best is None or best < 1024:
        return None
    best = best // 1024 * 1024
    ctx = min(best, cap)
    return ctx, best, estimate.recompute(ctx_size=ctx)


def plan_profile(
    facts: Facts,
    catalog: dict[str, Any],
    *,
    host: str,
    address: str,
    user: str | None,
    kind: str,
    llama_defaults: str,
    vram_override: int | None = None,
    max_ctx: int | None = None,
) -> Profile:
    """The host variables for this machine, each with where it came from."""
    warnings: list[str] = list(facts.notes)
    values: dict[str, Any] = {}
    comments: dict[str, str] = {}
    if facts.os_id not in ("debian", "ubuntu") or (facts.os_id, facts.os_version) not in DRIVER_PINS:
        raise DiscoverError(
            f"the machine runs {facts.os_pretty or 'an unknown system'} (ID={facts.os_id or '?'}, VERSION_ID="
            f"{facts.os_version or '?'}); the kit provisions {SUPPORTED}: install one of those, then run make "
            "discover again"
        )
    headroom = _headroom(llama_defaults, kind)
    cap = max_ctx or DEFAULT_MAX_CTX[kind]
    if cap < 1024:
        raise DiscoverError(f"max_ctx={cap} is below 1024 tokens: give a larger max_ctx")
    where = "this machine's" if kind == "gpu" else "the container's"

    if kind == "cpu":
        if facts.gpus:
            warnings.append(f"a sandbox rig runs on the CPU: the visible {facts.gpus[0].name} is not used")
        budget = facts.mem_mib
        fit = _fit(catalog, CPU_PAIR, budget, headroom, gpu=False, cap=cap)
        if fit is None:
            raise DiscoverError(
                f"{budget} MiB of RAM cannot hold {CPU_PAIR[0]} with {headroom} MiB of headroom: give the machine "
                "more memory"
            )
        ctx, best, estimate = fit
        pair, draft_n, rig_class = CPU_PAIR, CPU_DRAFT_N, "a CPU rig like the sandbox"
        values.update(models_target=pair[0], models_drafter=pair[1])
        spec = "draft-simple"
        memory = f"RAM ({budget:,} MiB MemTotal)"
    else:
        gpu = _choose_gpu(facts, vram_override)
        if len(facts.gpus) > 1:
            warnings.append(
                f"{len(facts.gpus)} NVIDIA GPUs found; the profile is for the first ({gpu.name}), the server uses "
                "all of them with llama.cpp's default split"
            )
        assert gpu.vram_mib is not None
        if (compute_capability(gpu.compute_capability) or (0, 0)) < MIN_COMPUTE_CAPABILITY:
            raise DiscoverError(
                f"{gpu.name} has compute capability {gpu.compute_capability}; the drivers the kit installs and the "
                "llama.cpp image's CUDA 12 need 5.0 (Maxwell) or newer: use a newer card"
            )
        pin = DRIVER_PINS[(facts.os_id, facts.os_version)]
        branch, version, driver_source = pin.branch, pin.version, pin.source
        values["rig_os"] = f"{facts.os_id}{facts.os_version}"
        comments["rig_os"] = (
            f"The release (os-release: {facts.os_pretty}): the driver pins below are checked against it"
        )
        values["rig_gpu"] = {
            "name": gpu.name,
            "vram_mib": gpu.vram_mib,
            "compute_capability": gpu.compute_capability,
            "headless": not gpu.display_attached if gpu.display_attached is not None else False,
        }
        src = "nvidia-smi" if gpu.source == "nvidia-smi" else f"lspci (PCI {gpu.pci_id}) and the kit's PCI_GPUS table"
        vram_src = f"given as vram={vram_override}" if vram_override is not None else src
        if gpu.display_attached is None:
            display = (
                "unknown ("
                + ("nvidia-smi says N/A" if gpu.source == "nvidia-smi" else "no driver to ask")
                + "): assumed to drive the display (full desktop install)"
            )
        elif gpu.source == "nvidia-smi":
            display = "nvidia-smi display_attached: " + ("yes" if gpu.display_attached else "no")
        elif gpu.display_attached:
            display = "lspci: the only VGA controller, so it drives the display"
        else:
            display = "lspci: " + (
                "a 3D controller (never drives a display)" if not facts.other_displays
                else f"another VGA controller drives the display ({facts.other_displays[0]})"
            )  # fmt: skip
        sources = f"GPU and vram_mib from {src}" if vram_src == src else f"GPU from {src}; vram_mib {vram_src}"
        comments["rig_gpu"] = f"{sources}; headless from {display}" + (
            f"; driver {gpu.driver_version} loaded now" if gpu.driver_version else "; no driver loaded now"
        )
        values["nvidia_driver_branch"] = branch
        values["nvidia_driver_version"] = version
        comments["nvidia_driver_branch"] = (
            f"NVIDIA driver: {driver_source} ({facts.os_pretty}, roles/nvidia_driver README); it serves compute "
            f"capability {gpu.compute_capability} and the image's CUDA 12 runtime (>= 535). An upgrade is a change "
            "of these two lines"
        ) + (
            "; the version is empty: this archive keeps only the branch's newest build, so the branch is the pin and "
            "the build installed at the first provision is held and recorded in inventory/lock.yml"
            if not version
            else ""
        )
        modules = pin.kernel_modules
        why = f"{driver_source}: proprietary" if modules == "proprietary" else f"{driver_source}: open"
        if modules == "open":
            problem = open_modules_problem(branch, gpu.name, gpu.compute_capability)
            if problem:
                modules, why = "proprietary", problem.split(": set ", 1)[0]
        values["nvidia_driver_kernel_modules"] = modules
        comments["nvidia_driver_kernel_modules"] = f"kernel modules: {why}"
        if facts.secure_boot == "enabled":
            warnings.append(
                "Secure Boot is enabled: unsigned NVIDIA modules will not load. Enrol DKMS's key (mokutil --import "
                "/var/lib/dkms/mok.pub) and set nvidia_driver_secure_boot_signing: true in this file, or turn "
                "Secure Boot off in the firmware"
            )
        budget = gpu.vram_mib
        pair, draft_n, rig_class = next((c[2], c[3], c[1]) for c in RIG_CLASSES if gpu.vram_mib <= c[0])
        fit = _fit(catalog, pair, budget, headroom, gpu=True, cap=cap)
        if fit is None and pair != E2B:
            warnings.append(f"{pair[0]} does not fit {budget} MiB with its drafter; falling back to {E2B[0]}")
            pair = E2B
            fit = _fit(catalog, pair, budget, headroom, gpu=True, cap=cap)
        if fit is None:
            raise DiscoverError(
                f"{gpu.name} has {budget:,} MiB; not even {E2B[0]} with its drafter at 1,024 tokens of context fits "
                f"with the preflight's {headroom} MiB of headroom: this card is too small for the kit's models"
            )
        ctx, best, estimate = fit
        values.update(models_target=pair[0], models_drafter=pair[1])
        spec = "draft-mtp"
        memory = f"VRAM ({budget:,} MiB)"

    comments["models_target"] = (
        f"Models: the catalog pair for {rig_class} (rigkit/discovery/profile.py "
        f"{'RIG_CLASSES' if kind == 'gpu' else 'CPU_PAIR, as inventory/host_vars/sandbox.yml'}; "
        "inventory/group_vars/all/model_catalog.yml)"
    )
    values["llama_server_ctx_size"] = ctx
    capped = f", capped at max_ctx={cap} (make discover max_ctx=N to go higher)" if best > ctx else ""
    comments["llama_server_ctx_size"] = (
        f"Context: the preflight's memory model (module_utils/preflight/server.py, catalog shapes, "
        f"{headroom} MiB headroom) fits up to {best:,} tokens in {where} {memory}{capped}; at {ctx:,}: "
        f"{estimate.breakdown}"
    )
    values["llama_server_spec_type"] = spec
    values["llama_server_spec_draft_n_max"] = draft_n
    comments["llama_server_spec_draft_n_max"] = (
        f"Draft length: {draft_n} for {rig_class} (the seed article's choices: 2 on 8 GB, 1 on 4 GB). Start here, "
        f"then make bench host={host} + make tune host={host}"
        if kind == "gpu"
        else f"Draft length: the sandbox's. Start here, then make bench host={host} + make tune host={host}"
    )
    values["llama_server_flash_attn"] = pair[2]
    if kind == "cpu":
        comments["llama_server_flash_attn"] = "Flash attention: off on the CPU, as on the sandbox"
    elif pair[2] == "off":
        comments["llama_server_flash_attn"] = (
            "Flash attention: off, E4B with its drafter aborts in llama.cpp's CUDA flash-attention kernel "
            "(the notes of the Unsloth E4B drafter in the catalog); try on with make bench once your llama.cpp pin "
            "has the fix"
        )
    else:
        comments["llama_server_flash_attn"] = "Flash attention: on, as the seed article serves E2B (-fa 1)"

    comments["llama_server_spec_type"] = (
        "Speculative decoding: draft-mtp, the drafter is the target's gemma4-assistant (MTP) head"
        if spec == "draft-mtp"
        else "Speculative decoding: draft-simple, the target drafts for itself as a classic draft model"
    )
    layers = "all" if kind == "gpu" else "0"
    comments["llama_server_gpu_layers"] = (
        "Offload: every layer of both models on the GPU (what the context estimate above assumes)"
        if kind == "gpu"
        else "Offload: none, a CPU rig (the estimate above counts everything against RAM)"
    )
    values["llama_server_gpu_layers"] = layers
    values["llama_server_gpu_layers_draft"] = layers
    headline = (
        f"{facts.os_pretty}, kernel {facts.kernel} {facts.arch}, Secure Boot {facts.secure_boot}; {facts.cpu_model}, "
        f"{facts.cpu_cores} cores, {facts.mem_mib:,} MiB RAM; {facts.disk_free_mib:,} MiB free under "
        f"{facts.disk_path or '?'} (models go to {MODELS_DIR})"
    )
    if facts.disk_free_mib and facts.disk_free_mib < 8192:
        warnings.append(
            f"only {facts.disk_free_mib:,} MiB free under {facts.disk_path}: the models and the llama.cpp image need "
            "several GiB; free some space before make provision"
        )
    return Profile(host, kind, address, user, facts, values, comments, warnings, headline)


def _wrap(text: str, width: int = 116) -> list[str]:
    lines: list[str] = []
    current = "#"
    for word in text.split():
        if len(current) + 1 + len(word) > width and current != "#":
            lines.append(current)
            current = "#"
        current += " " + word
    lines.append(current)
    return lines


class Unsafe(str):
    """A value from outside the kit (what the machine reported, what the command line gave): written with
    Ansible's ``!unsafe`` tag, which Ansible honours in inventory files, so it is never templated."""


UNSAFE_TAG = "!unsafe"
_STR_TAG = "tag:yaml.org,2002:str"


class _Dumper(yaml.SafeDumper):
    """PyYAML's safe dumper: Unsafe strings as ``!unsafe "..."``, a string that would read as another type
    double-quoted (``"8.6"``, ``"off"``), as the hand-written host_vars quote them."""


def _represent_str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    resolved = dumper.resolve(yaml.ScalarNode, data, (True, False))
    return dumper.represent_scalar(_STR_TAG, data, style=None if resolved == _STR_TAG else '"')


def _represent_unsafe(dumper: yaml.SafeDumper, data: Unsafe) -> yaml.ScalarNode:
    return dumper.represent_scalar(UNSAFE_TAG, str(data), style='"')


_Dumper.add_representer(str, _represent_str)
_Dumper.add_representer(Unsafe, _represent_unsafe)


class HostVarsLoader(yaml.SafeLoader):
    """PyYAML's safe loader that reads ``!unsafe`` back as Unsafe (the written file's self-check, the tests)."""


HostVarsLoader.add_constructor(
    UNSAFE_TAG,
    lambda loader, node: Unsafe(loader.construct_scalar(node)),  # type: ignore[arg-type]
)


def read_host_vars(text: str) -> Any:
    """A host_vars file's data, ``!unsafe`` values as Unsafe strings."""
    return yaml.load(text, Loader=HostVarsLoader)  # noqa: S506 - a SafeLoader subclass


def yaml_lines(key: str, value: Any) -> list[str]:
    """One top-level variable, through the YAML serializer (never string formatting)."""
    text = yaml.dump(
        {key: value}, Dumper=_Dumper, default_flow_style=False, sort_keys=False, width=4096, allow_unicode=False
    )
    return text.splitlines()


def _same(read: Any, meant: Any) -> bool:
    """Equal, and of the same types all the way down (an Unsafe string must read back as one)."""
    if type(read) is not type(meant):
        return False
    if isinstance(meant, dict):
        return read.keys() == meant.keys() and all(_same(read[key], meant[key]) for key in meant)
    return bool(read == meant)


# A host name, an IPv4/IPv6 address, a container or login name (rigkit/cli/discover.py checks the command line the
# same way): nothing a template could hide in. These stay plain strings, since tools that read the inventory as
# JSON (testinfra's ansible:// backend) take ansible_host and ansible_user as they are.
CONNECTION_RE = re.compile(r"[A-Za-z0-9_\[][A-Za-z0-9_.:%\[\]-]{0,252}")


def _connection(what: str, value: str) -> str:
    if not CONNECTION_RE.fullmatch(value):
        raise DiscoverError(
            f"{what} {shown(value)} is not a host name, IP address, container or login name: give one without "
            "spaces, quotes or braces"
        )
    return value


def render_host_vars(profile: Profile) -> str:
    """inventory/host_vars/NAME.yml, commented like the hand-written ones. Every value goes through the YAML
    serializer (never string formatting); the free text that came from the machine (the GPU's name) is checked
    against what it can be and tagged ``!unsafe``, so Ansible never templates it; the address, the login and the
    compute capability are checked against an alphabet no template fits in. The text is read back and must give
    exactly those values."""
    written: dict[str, Any] = {}
    out = ["---"]
    out += _wrap(f"Written by make discover host={profile.host} address={profile.address}: {profile.headline}.")

    def put(key: str, value: Any) -> None:
        written[key] = value
        out.extend(yaml_lines(key, value))

    v, c = profile.values, profile.comments
    if profile.kind == "cpu":
        out.append("# The rig container (a literal: testinfra reads the inventory without templating).")
        put("ansible_host", _connection("the container", profile.address.split(":", 1)[1]))
        if "llama_server_port" in v:
            out.append("# A port of its own: the sandbox rigs share this machine's network.")
            put("llama_server_port", int(v["llama_server_port"]))
    else:
        out.append("# Connection: the address discover reached.")
        put("ansible_host", _connection("the address", profile.address))
        if profile.user:
            put("ansible_user", _connection("the login", profile.user))
        else:
            out.append("# ansible_user: your-login")
    out.append("")
    if profile.kind == "gpu":
        out += _wrap(c["rig_os"])
        put("rig_os", v["rig_os"])  # a key of DRIVER_PINS: the release was checked against them
        out.append("")
        gpu = v["rig_gpu"]
        out += _wrap(c["rig_gpu"])
        put(
            "rig_gpu",
            {
                "name": Unsafe(checked("the GPU name", gpu["name"], GPU_NAME_RE, "rig_gpu.name")),
                "vram_mib": int(gpu["vram_mib"]),
                "compute_capability": checked(
                    "the compute capability", gpu["compute_capability"], COMPUTE_CAPABILITY_RE, "rig_gpu"
                ),
                "headless": bool(gpu["headless"]),
            },
        )
        out.append("")
        out += _wrap(c["nvidia_driver_branch"])
        put("nvidia_driver_branch", v["nvidia_driver_branch"])
        put("nvidia_driver_version", v["nvidia_driver_version"])
        if "nvidia_driver_kernel_modules" in v:
            out += _wrap(c["nvidia_driver_kernel_modules"])
            put("nvidia_driver_kernel_modules", v["nvidia_driver_kernel_modules"])
        out.append("")
    out += _wrap(c["models_target"])
    put("models_target", v["models_target"])
    put("models_drafter", v["models_drafter"])
    for key in (
        "llama_server_ctx_size",
        "llama_server_spec_type",
        "llama_server_spec_draft_n_max",
        "llama_server_flash_attn",
        "llama_server_gpu_layers",
    ):
        out += _wrap(c[key])
        put(key, v[key])
    put("llama_server_gpu_layers_draft", v["llama_server_gpu_layers_draft"])
    text = "\n".join(out) + "\n"
    back = read_host_vars(text)
    if not _same(back, written):
        raise DiscoverError(
            f"the host profile for {profile.host} does not read back as written (a bug in rigkit/discovery/profile.py "
            "render_host_vars): nothing was written; report it with the output of rigkit discover --print-script"
        )
    return text


def add_inventory_line(hosts_text: str, host: str, group: str) -> str:
    """hosts.yml with `host:` added under `group`'s hosts (unchanged when it is there already)."""
    lines = hosts_text.splitlines()
    group_at = next((i for i, line in enumerate(lines) if line.strip() == f"{group}:"), None)
    if group_at is None:
        raise DiscoverError(f"inventory/hosts.yml has no group {group}: restore it from the repository")
    indent = len(lines[group_at]) - len(lines[group_at].lstrip())
    hosts_at = next(
        (i for i in range(group_at + 1, len(lines)) if lines[i].strip() == "hosts:"),
        None,
    )
    if hosts_at is None:
        raise DiscoverError(f"group {group} in inventory/hosts.yml has no hosts: list")
    host_indent = len(lines[hosts_at]) - len(lines[hosts_at].lstrip()) + 2
    end = hosts_at + 1
    while end < len(lines) and lines[end].strip() and len(lines[end]) - len(lines[end].lstrip()) >= host_indent:
        if lines[end].strip().rstrip(":") == host:
            return hosts_text
        end += 1
    del indent
    lines.insert(end, " " * host_indent + f"{host}:")
    return "\n".join(lines) + "\n"
