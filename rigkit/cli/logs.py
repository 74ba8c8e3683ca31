"""`rigkit logs` (make logs): the last lines of each rig's llama-server journal, printed escaped."""

from __future__ import annotations

import argparse
import pathlib
import subprocess
import sys
import tempfile

from ansible.module_utils.printable import printable

from rigkit import REPO
from rigkit.playbook_run import playbook_argv


def logs(args: argparse.Namespace) -> int:
    """Run playbooks/logs.yml quietly (its log kept for a failure), then print each rig's lines."""
    with tempfile.TemporaryDirectory(prefix="rigkit-logs-") as scratch:
        out = pathlib.Path(scratch)
        argv = playbook_argv(
            "logs.yml", args.limit, "-e", f"rigkit_logs_dir={out}", "-e", f"rigkit_logs_lines={args.lines}",
            *args.ansible_args,
        )  # fmt: skip
        log = out / "play.log"
        with log.open("w") as handle:
            done = subprocess.run(argv, cwd=REPO, stdout=handle, stderr=subprocess.STDOUT, check=False)
        journals = sorted(out.glob("*.log"))
        journals.remove(log)
        for journal in journals:
            print(f"== {journal.stem}: llama-server's journal, last {args.lines} lines")
            for line in journal.read_text(errors="replace").splitlines():
                print(printable(line))
        if done.returncode != 0:
            print("\n".join(printable(line) for line in log.read_text().splitlines()[-30:]), file=sys.stderr)
            read = ", ".join(journal.stem for journal in journals) or "no rig"
            print(
                f"rigkit logs: read {read}; the play failed for the others (exit {done.returncode}, its end is "
                "above): check that they are reachable with make status",
                file=sys.stderr,
            )
            return done.returncode
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    command = commands.add_parser("logs", help="the last lines of each rig's llama-server journal")
    command.set_defaults(func=logs)
    command.add_argument("--limit", required=True, help="rigs to read")
    command.add_argument("--lines", type=int, default=200, help="lines per rig (default 200)")
    command.add_argument("ansible_args", nargs="*", help="extra ansible-playbook arguments (after --)")
