"""`rigkit discover` (make discover): read a machine without changing it and write its host profile."""

from __future__ import annotations

import argparse
import pathlib
import re
import subprocess
import sys

from ansible.module_utils.printable import printable

from rigkit import REPO
from rigkit.paths import CATALOG

HOST_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*\Z")
ADDRESS_RE = re.compile(r"^[A-Za-z0-9_\[][A-Za-z0-9_.:%\[\]-]*\Z")  # a host, IPv4/IPv6 or container name
DISCOVER_TIMEOUT_S = 60


def gather(address: str, user: str | None) -> str:
    """Run the read-only gather script on the machine: `docker exec` for docker:CONTAINER, else SSH."""
    from rigkit.discovery.facts import GATHER_SCRIPT, DiscoverError

    if address.startswith("docker:"):
        container = address.split(":", 1)[1]
        argv = ["docker", "exec", "-i", container, "sh", "-s"]
        how = f"docker exec into container {container}"
        fix = f"start the container (docker start {container}) or check its name (docker ps)"
    else:
        target = f"{user}@{address}" if user else address
        argv = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", "--", target, "sh", "-s"]
        how = f"SSH to {target}"
        fix = (
            f"check the address, that sshd runs there and that your key is authorised (ssh-copy-id {target}); "
            "give user=LOGIN if your login there differs"
        )
    try:
        done = subprocess.run(
            argv, input=GATHER_SCRIPT, capture_output=True, text=True, timeout=DISCOVER_TIMEOUT_S, check=False
        )
    except FileNotFoundError:
        raise DiscoverError(f"{argv[0]} is not installed on this machine: install it to use {how}") from None
    except subprocess.TimeoutExpired:
        raise DiscoverError(f"{how} did not answer within {DISCOVER_TIMEOUT_S} s: {fix}") from None
    if done.returncode != 0 and "@@end" not in done.stdout:
        # the machine's (or ssh's) own words, shown, never interpreted by the terminal
        detail = [printable(line, 300) for line in (done.stderr or done.stdout).strip().splitlines()[-3:]]
        raise DiscoverError(f"cannot reach the machine ({how} exited {done.returncode}: {' / '.join(detail)}): {fix}")
    return done.stdout


def _diff(old: str, new: str, name: str) -> str:
    import difflib

    lines = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True), f"a/{name}", f"b/{name}")
    return "".join(lines)


def discover(args: argparse.Namespace) -> int:
    import yaml
    from ansible.module_utils.atomic_file import write_atomic

    from rigkit.discovery.facts import DiscoverError, parse_gather
    from rigkit.discovery.profile import add_inventory_line, plan_profile, render_host_vars

    inventory = pathlib.Path(args.inventory_dir)
    hosts_file, host_vars = inventory / "hosts.yml", inventory / "host_vars" / f"{args.name}.yml"
    kind = "cpu" if args.address.startswith("docker:") else "gpu"
    group = "sandbox_rigs" if kind == "cpu" else "gpu_rigs"
    try:
        if not HOST_NAME_RE.fullmatch(args.name):
            raise DiscoverError(f"host name {args.name!r}: use letters, digits, '-' and '_' (it names a file)")
        target = args.address.split(":", 1)[1] if kind == "cpu" else args.address
        if not ADDRESS_RE.fullmatch(target) or (args.user is not None and not ADDRESS_RE.fullmatch(args.user)):
            raise DiscoverError(
                f"address {args.address!r} / user {args.user!r}: give a host name or IP address (or "
                "docker:CONTAINER) and a login name, without spaces or a leading '-'"
            )
        inventory_data = yaml.safe_load(hosts_file.read_text()) or {}
        groups = inventory_data["all"]["children"]["rigs"]["children"]
        elsewhere = [g for g, body in groups.items() if g != group and args.name in ((body or {}).get("hosts") or {})]
        if elsewhere:
            raise DiscoverError(
                f"{args.name} is already a rig of {elsewhere[0]} in {hosts_file}; a {kind.upper()} profile belongs "
                f"in {group}: pick another name, or remove it from {elsewhere[0]} first"
            )
        if args.gathered:
            try:
                gathered = pathlib.Path(args.gathered).read_text()
            except OSError as exc:
                raise DiscoverError(f"cannot read --gathered {args.gathered}: {exc.strerror}") from None
        else:
            gathered = gather(args.address, args.user)
        facts = parse_gather(gathered)
        catalog = yaml.safe_load(CATALOG.read_text())["model_catalog"]
        profile = plan_profile(
            facts,
            catalog,
            host=args.name,
            address=args.address,
            user=args.user,
            kind=kind,
            llama_defaults=(REPO / "roles/llama_server/defaults/main.yml").read_text(),
            vram_override=args.vram,
            max_ctx=args.max_ctx,
        )
        if args.port is not None:
            profile.values["llama_server_port"] = args.port
        text = render_host_vars(profile)
        hosts_new = add_inventory_line(hosts_file.read_text(), args.name, group)
    except DiscoverError as exc:
        print(f"rigkit discover: {exc}", file=sys.stderr)
        return 1

    print(f"{args.name}: {profile.headline}")
    for warning in profile.warnings:
        print(f"  warning: {warning}")
    old = host_vars.read_text() if host_vars.exists() else ""
    diff = _diff(old, text, str(host_vars.relative_to(inventory.parent)))
    if old and old != text and not args.force:
        print(diff, end="")
        print(
            f"rigkit discover: {host_vars} exists and differs (diff above): rerun with force=1 to replace it",
            file=sys.stderr,
        )
        return 1
    print(diff or f"{host_vars}: unchanged", end="" if diff else "\n")
    hosts_diff = _diff(hosts_file.read_text(), hosts_new, str(hosts_file.relative_to(inventory.parent)))
    print(hosts_diff, end="")
    host_vars.parent.mkdir(parents=True, exist_ok=True)
    if old != text:
        write_atomic(str(host_vars), lambda handle: handle.write(text))
    if hosts_diff:
        write_atomic(str(hosts_file), lambda handle: handle.write(hosts_new))
    print(
        f"Next: make check host={args.name}, then make provision host={args.name}; "
        f"then make bench host={args.name} + make tune host={args.name} to settle the draft length."
    )
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    disc = commands.add_parser("discover", help="read a machine and write its host profile (changes nothing on it)")
    disc.add_argument("name", nargs="?", help="rig name (inventory/host_vars/NAME.yml)")
    disc.add_argument("address", nargs="?", help="host name or IP for SSH, or docker:CONTAINER for a sandbox (CPU) rig")
    disc.add_argument("--user", help="SSH login (default: ssh's own choice)")
    disc.add_argument("--force", action="store_true", help="replace an existing, different host_vars file")
    disc.add_argument("--vram", type=int, help="VRAM in MiB, when the PCI ID has several memory variants")
    disc.add_argument("--max-ctx", type=int, help="largest context to write (default: 8192 GPU, 2048 CPU)")
    disc.add_argument("--port", type=int, help="llama_server_port (sandbox rigs share this machine's ports)")
    disc.add_argument(
        "--gathered",
        help="plan from this saved output of the gather script instead of connecting (rigkit discover --print-script "
        "shows the script: run it with sh on a machine this controller cannot reach)",
    )
    disc.add_argument("--print-script", action="store_true", help="print the read-only gather script and exit")
    disc.add_argument("--inventory-dir", default=str(REPO / "inventory"), help="inventory (default: %(default)s)")

    def run(args: argparse.Namespace) -> int:
        if args.print_script:
            from rigkit.discovery.facts import GATHER_SCRIPT

            print(GATHER_SCRIPT, end="")
            return 0
        if not args.name or not args.address:
            disc.error("discover needs NAME and ADDRESS (or --print-script)")
        return discover(args)

    disc.set_defaults(func=run)
