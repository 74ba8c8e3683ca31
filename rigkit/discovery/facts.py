"""What a machine reports about itself, read without changing it: GATHER_SCRIPT (run over SSH or `docker exec`)
and pure parsers of its output into Facts (OS, kernel, Secure Boot, CPU, memory, disk, NVIDIA GPUs from
nvidia-smi, or from lspci through the PCI_GPUS table when no driver answers). rigkit/discovery/profile.py turns Facts
into a host profile. Tested on canned outputs of real machines in tests/unit/test_discovery_profile.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ansible.module_utils.printable import printable

from rigkit.validation.rules import role_defaults


class DiscoverError(Exception):
    """What was found, and what to do next."""


MODELS_DIR = role_defaults("models")["models_dir"]
SMI_FIELDS = "name,memory.total,compute_cap,driver_version"
# nvidia-smi calls the display column display_attached from driver 565 (Yes/No), display_mode before (Enabled/
# Disabled); an unknown field fails the whole query, so the script asks the new name first, then the old one.
GATHER_SCRIPT = f"""\
echo '@@os-release'; cat /etc/os-release 2>/dev/null
echo '@@kernel'; uname -r; uname -m
echo '@@secure-boot'
if command -v mokutil >/dev/null 2>&1; then mokutil --sb-state 2>&1; \
elif [ -d /sys/firmware/efi ]; then \
f=$(ls /sys/firmware/efi/efivars/SecureBoot-* 2>/dev/null | head -n 1); \
if [ -n "$f" ]; then echo "efivar $(od -An -tu1 -j4 -N1 "$f" | tr -d ' ')"; \
else echo 'efi without SecureBoot variable'; fi; \
else echo 'no EFI (legacy BIOS boot)'; fi
echo '@@cpuinfo'; cat /proc/cpuinfo
echo '@@nproc'; nproc
echo '@@meminfo'; cat /proc/meminfo
echo '@@df'; d={MODELS_DIR}; while [ ! -e "$d" ]; do d=$(dirname "$d"); done; echo "$d"; df -Pk "$d"
echo '@@nvidia-smi'
if command -v nvidia-smi >/dev/null 2>&1; then \
if out=$(nvidia-smi --query-gpu={SMI_FIELDS},display_attached --format=csv,noheader,nounits 2>&1); then echo "$out"; \
elif out=$(nvidia-smi --query-gpu={SMI_FIELDS},display_mode --format=csv,noheader,nounits 2>&1); then echo "$out"; \
else echo "$out"; echo '@@failed'; fi; else echo '@@absent'; fi
echo '@@lspci'
if command -v lspci >/dev/null 2>&1; then lspci -nn 2>&1; else echo '@@absent'; fi
echo '@@end'
"""

NVIDIA_VENDOR = "10de"

# What each machine-reported value can be (ASCII only, bounded): anything else is refused before it reaches the
# inventory, the terminal or a comment. A GPU name as nvidia-smi and the PCI ID database spell them
# ("NVIDIA GeForce RTX 3050 OEM", "Tesla V100-SXM2-16GB", "Quadro RTX 5000 with Max-Q Design"); os-release's
# machine-readable fields as os-release(5) defines them; a kernel release as `uname -r` prints it.
GPU_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9 ._()/+-]{0,95}")
OS_FIELD_RE = re.compile(r"[a-z0-9][a-z0-9._~-]{0,63}")
KERNEL_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+~-]{0,95}")
ARCH_RE = re.compile(r"[a-z0-9][a-z0-9_]{0,31}")
DRIVER_VERSION_RE = re.compile(r"[0-9]{1,4}(\.[0-9]{1,4}){1,3}")
PATH_RE = re.compile(r"/[A-Za-z0-9._/+-]{0,255}")
# Descriptions (PRETTY_NAME, the CPU, a display controller): printable ASCII without braces, the template marks.
TEXT_RE = re.compile(r"[ -z|~]{1,160}")
UINT_RE = re.compile(r"[0-9]{1,12}")  # ASCII digits only: str.isdigit() and \d also take '²' or '٣'
COMPUTE_CAPABILITY_RE = re.compile(r"[0-9]{1,2}\.[0-9]{1,2}")
ALLOWED = {
    GPU_NAME_RE: "ASCII letters, digits, spaces and . _ ( ) / + -, at most 96 characters",
    OS_FIELD_RE: "lower-case ASCII letters, digits and . _ ~ -, at most 64 characters (os-release(5))",
    KERNEL_RE: "ASCII letters, digits and . _ + ~ -, at most 96 characters",
    ARCH_RE: "lower-case ASCII letters, digits and _",
    DRIVER_VERSION_RE: "dotted ASCII digits such as 535.261.03",
    PATH_RE: "an absolute path of ASCII letters, digits and . _ / + -",
    TEXT_RE: "printable ASCII without { or }, at most 160 characters",
}


def shown(text: str, limit: int = 200) -> str:
    """Machine text safe for a terminal and a message: ASCII, control characters and escapes made visible."""
    return ascii(text[:limit]) + ("..." if len(text) > limit else "")


def checked(what: str, value: str, pattern: re.Pattern[str], source: str) -> str:
    """``value`` when ``pattern`` matches all of it; a DiscoverError naming the value and what to do otherwise."""
    if pattern.fullmatch(value):
        return value
    raise DiscoverError(
        f"the machine reports {what} {shown(value)} ({source}), which is not what such a value can be (allowed: "
        f"{ALLOWED.get(pattern, pattern.pattern)}). Nothing was written. Check what prints it on that machine (a "
        "wrapper earlier in PATH, an edited file, a compromised system); if the value is genuine, write "
        "inventory/host_vars/NAME.yml by hand from inventory/examples/"
    )


# ---------------------------------------------------------------------------------------------- PCI table
@dataclass(frozen=True)
class PciGpu:
    name: str  # as nvidia-smi names it
    vram_mib: tuple[int, ...]  # several: the ID is shared by memory variants
    compute_capability: str


# Device IDs of vendor 10de from the PCI ID database (pci-ids.ucw.cz, the names `lspci` prints); memory sizes
# and compute capabilities from NVIDIA's product pages and its CUDA GPU list (developer.nvidia.com/cuda-gpus).
# An ID with several memory sizes lists them all: discover then asks for vram=MIB.
PCI_GPUS: dict[str, PciGpu] = {
    "1c82": PciGpu("NVIDIA GeForce GTX 1050 Ti", (4096,), "6.1"),
    "1f82": PciGpu("NVIDIA GeForce GTX 1650", (4096,), "7.5"),
    "1f95": PciGpu("NVIDIA GeForce GTX 1650 Ti", (4096,), "7.5"),  # TU117M, the laptop chip
    "1e89": PciGpu("NVIDIA GeForce RTX 2060", (6144,), "7.5"),
    "1f08": PciGpu("NVIDIA GeForce RTX 2060", (6144,), "7.5"),  # TU106 Rev. A
    "1f03": PciGpu("NVIDIA GeForce RTX 2060 12GB", (12288,), "7.5"),
    "2507": PciGpu("NVIDIA GeForce RTX 3050", (8192,), "8.6"),
    "2508": PciGpu("NVIDIA GeForce RTX 3050 OEM", (8192,), "8.6"),
    "2582": PciGpu("NVIDIA GeForce RTX 3050", (8192,), "8.6"),
    "2503": PciGpu("NVIDIA GeForce RTX 3060", (12288,), "8.6"),
    "2504": PciGpu("NVIDIA GeForce RTX 3060", (12288,), "8.6"),  # Lite Hash Rate
    "2487": PciGpu("NVIDIA GeForce RTX 3060", (8192, 12288), "8.6"),  # GA104: 8 GB and 12 GB boards
    "2484": PciGpu("NVIDIA GeForce RTX 3070", (8192,), "8.6"),
    "2206": PciGpu("NVIDIA GeForce RTX 3080", (10240, 12288), "8.6"),
    "2204": PciGpu("NVIDIA GeForce RTX 3090", (24576,), "8.6"),
    "2882": PciGpu("NVIDIA GeForce RTX 4060", (8192,), "8.9"),
    "2803": PciGpu("NVIDIA GeForce RTX 4060 Ti", (8192, 16384), "8.9"),
    "2786": PciGpu("NVIDIA GeForce RTX 4070", (12288,), "8.9"),
    "2782": PciGpu("NVIDIA GeForce RTX 4070 Ti", (12288,), "8.9"),
    "2684": PciGpu("NVIDIA GeForce RTX 4090", (24576,), "8.9"),
}


# ---------------------------------------------------------------------------------------------- parsing
@dataclass
class Gpu:
    name: str
    vram_mib: int | None  # None: several variants, ask the user
    compute_capability: str
    source: str  # "nvidia-smi" or "lspci"
    display_attached: bool | None = None
    driver_version: str | None = None
    pci_id: str | None = None
    vram_choices: tuple[int, ...] = ()


@dataclass
class Facts:
    os_id: str = ""
    os_version: str = ""
    os_pretty: str = ""
    os_codename: str = ""
    kernel: str = ""
    arch: str = ""
    secure_boot: str = "unknown"
    cpu_model: str = ""
    cpu_cores: int = 0
    mem_mib: int = 0
    disk_path: str = ""
    disk_free_mib: int = 0
    gpus: list[Gpu] = field(default_factory=list)
    other_displays: list[str] = field(default_factory=list)  # non-NVIDIA VGA controllers (an iGPU)
    nvidia_smi: str = "absent"  # absent | failed | ok
    lspci: str = "absent"  # absent | ok
    unknown_nvidia: list[str] = field(default_factory=list)  # lspci lines of NVIDIA GPUs not in PCI_GPUS
    notes: list[str] = field(default_factory=list)  # worth saying, not stopping


def sections(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    name = None
    lines: list[str] = []
    for line in text.splitlines():
        if line.startswith("@@") and line[2:] not in ("absent", "failed"):
            if name is not None:
                out[name] = "\n".join(lines)
            name, lines = line[2:].strip(), []
        elif name is not None:
            lines.append(line)
    if name is not None:
        out[name] = "\n".join(lines)
    return out


def parse_os_release(text: str) -> dict[str, str]:
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip().strip('"').strip("'")
    return values


def parse_secure_boot(text: str) -> str:
    lowered = text.lower()
    if "secureboot enabled" in lowered or lowered.strip() == "efivar 1":
        return "enabled"
    if "secureboot disabled" in lowered or lowered.strip() == "efivar 0":
        return "disabled"
    if "not supported" in lowered or "no efi" in lowered:
        return "not available (no EFI)"
    if "without secureboot variable" in lowered:
        return "not available (EFI without a SecureBoot variable)"
    return "unknown"


def parse_cpuinfo(text: str) -> str:
    for key in ("model name", "Hardware", "Model", "cpu model"):
        for line in text.splitlines():
            name, sep, value = line.partition(":")
            if sep and name.strip() == key and value.strip():
                return " ".join(value.split())
    return "unknown"


def parse_meminfo(text: str) -> int:
    """MemTotal in MiB (what Ansible's memtotal_mb reports)."""
    match = re.search(r"^MemTotal:[ \t]+([0-9]{1,15})[ \t]+kB", text, re.MULTILINE)
    return int(match.group(1)) // 1024 if match else 0


def parse_df(text: str) -> tuple[str, int]:
    """(the existing directory models will live under, free MiB) from `echo DIR; df -Pk DIR`."""
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) < 3:
        return (lines[0] if lines else ""), 0
    fields = lines[-1].split()
    return lines[0], int(fields[3]) // 1024 if len(fields) >= 4 and UINT_RE.fullmatch(fields[3]) else 0


def _display(value: str) -> bool | None:
    text = value.strip().lower()
    if text in ("yes", "enabled", "1", "true"):
        return True
    if text in ("no", "disabled", "0", "false"):
        return False
    return None


def parse_nvidia_smi(text: str) -> list[Gpu]:
    """Rows of `nvidia-smi --query-gpu=name,memory.total,compute_cap,driver_version,display_attached
    --format=csv,noheader,nounits`; a line that is not such a row (an error message) is a DiscoverError."""
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = [part.strip() for part in line.split(",")]
        if len(fields) != 5 or not UINT_RE.fullmatch(fields[1]) or not COMPUTE_CAPABILITY_RE.fullmatch(fields[2]):
            raise DiscoverError(
                f"nvidia-smi answered {shown(line.strip())} instead of GPU rows: the driver is installed but not "
                "working (a kernel/driver mismatch after an upgrade, or Secure Boot refusing the module). Reboot "
                "the machine or fix the driver, then run make discover again"
            )
        driver = fields[3] if fields[3] not in ("", "[N/A]", "N/A") else None
        gpus.append(
            Gpu(
                name=checked("the GPU name", fields[0], GPU_NAME_RE, "nvidia-smi --query-gpu=name"),
                vram_mib=int(fields[1]),
                compute_capability=fields[2],
                source="nvidia-smi",
                display_attached=_display(fields[4]),
                driver_version=None
                if driver is None
                else checked("the driver version", driver, DRIVER_VERSION_RE, "nvidia-smi --query-gpu=driver_version"),
            )
        )
    return gpus


LSPCI_RE = re.compile(
    r"^(?P<slot>\S+)\s+(?P<cls>[^\[]+?)\s+\[(?P<code>03[0-9a-f]{2})\]:\s+(?P<desc>.*?)\s+"
    r"\[(?P<vendor>[0-9a-f]{4}):(?P<device>[0-9a-f]{4})\]",
    re.IGNORECASE,
)


def parse_lspci(text: str) -> tuple[list[Gpu], list[str], list[str]]:
    """(known NVIDIA GPUs, unknown NVIDIA display controllers, other display controllers) from `lspci -nn`.

    Without a driver nothing says whether a display hangs off the card: a 3D controller (class 0302) never
    drives one, and a VGA controller is taken to drive the display unless another VGA controller (an iGPU)
    is present, which is how laptops and most desktops with a second card are wired.
    """
    known: list[Gpu] = []
    unknown: list[str] = []
    others: list[str] = []
    nvidia_vga: list[Gpu] = []
    for line in text.splitlines():
        match = LSPCI_RE.match(line.strip())
        if not match:
            continue
        vendor, device = match["vendor"].lower(), match["device"].lower()
        if vendor != NVIDIA_VENDOR:
            if match["code"] == "0300":
                desc = checked("a display controller", match["desc"], TEXT_RE, "lspci -nn")
                others.append(f"{desc} [{vendor}:{device}]")
            continue
        entry = PCI_GPUS.get(device)
        if entry is None:
            unknown.append(shown(line.strip()))  # only ever shown in a message, escapes made visible
            continue
        gpu = Gpu(
            name=entry.name,
            vram_mib=entry.vram_mib[0] if len(entry.vram_mib) == 1 else None,
            compute_capability=entry.compute_capability,
            source="lspci",
            display_attached=False if match["code"] == "0302" else None,
            pci_id=f"{vendor}:{device}",
            vram_choices=entry.vram_mib,
        )
        known.append(gpu)
        if match["code"] == "0300":
            nvidia_vga.append(gpu)
    for gpu in nvidia_vga:
        gpu.display_attached = not others
    return known, unknown, others


def parse_gather(text: str) -> Facts:
    """Facts from GATHER_SCRIPT's output."""
    part = sections(text)
    if "end" not in part:
        raise DiscoverError(
            "the machine's answer stopped early (no @@end marker): it needs a POSIX shell with cat, uname, df and "
            "nproc; the output was:\n" + "\n".join(printable(line, 300) for line in text[-2000:].splitlines())
        )
    osr = parse_os_release(part.get("os-release", ""))
    kernel = part.get("kernel", "").split()
    disk_path, disk_free = parse_df(part.get("df", ""))
    nproc = part.get("nproc", "").strip()

    def optional(what: str, value: str, pattern: re.Pattern[str], source: str) -> str:
        return checked(what, value, pattern, source) if value else value

    facts = Facts(
        os_id=optional("os-release ID", osr.get("ID", "").lower(), OS_FIELD_RE, "/etc/os-release"),
        os_version=optional("os-release VERSION_ID", osr.get("VERSION_ID", ""), OS_FIELD_RE, "/etc/os-release"),
        os_pretty=checked("os-release PRETTY_NAME", osr.get("PRETTY_NAME", "unknown"), TEXT_RE, "/etc/os-release"),
        os_codename=optional(
            "os-release VERSION_CODENAME", osr.get("VERSION_CODENAME", ""), OS_FIELD_RE, "/etc/os-release"
        ),
        kernel=optional("the kernel release", kernel[0] if kernel else "", KERNEL_RE, "uname -r"),
        arch=optional("the architecture", kernel[1] if len(kernel) > 1 else "", ARCH_RE, "uname -m"),
        secure_boot=parse_secure_boot(part.get("secure-boot", "")),
        cpu_model=checked("the CPU model", parse_cpuinfo(part.get("cpuinfo", "")), TEXT_RE, "/proc/cpuinfo"),
        cpu_cores=int(nproc) if UINT_RE.fullmatch(nproc) else 0,
        mem_mib=parse_meminfo(part.get("meminfo", "")),
        disk_path=optional("the models' directory", disk_path, PATH_RE, "df -Pk"),
        disk_free_mib=disk_free,
    )
    smi = part.get("nvidia-smi")
    raw = text.split("@@nvidia-smi", 1)[1].split("@@lspci", 1)[0] if "@@nvidia-smi" in text else ""
    if "@@absent" in raw:
        facts.nvidia_smi = "absent"
    elif "@@failed" in raw:
        facts.nvidia_smi = "failed"
        said = " / ".join(line.strip() for line in (smi or "").splitlines() if line.strip() and "@@" not in line)
        facts.notes.append(
            f"nvidia-smi is installed but failed ({shown(said, 300)}): the GPU is read from lspci instead"
        )
    elif smi is not None:
        facts.gpus = parse_nvidia_smi(smi)
        facts.nvidia_smi = "ok"
    lspci_raw = text.split("@@lspci", 1)[1].split("@@end", 1)[0] if "@@lspci" in text else ""
    if "@@absent" not in lspci_raw:
        facts.lspci = "ok"
        known, unknown, others = parse_lspci(part.get("lspci", ""))
        facts.other_displays = others
        if facts.nvidia_smi != "ok":
            facts.gpus, facts.unknown_nvidia = known, unknown
    return facts
