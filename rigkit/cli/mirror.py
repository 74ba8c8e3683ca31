"""`rigkit mirror`: start (detached) or stop the read-only model mirror (rigkit/mirror/daemon.py serves it)."""

from __future__ import annotations

import argparse

from rigkit.mirror.daemon import mirror


def register(commands: argparse._SubParsersAction) -> None:
    mirror_cmd = commands.add_parser("mirror", help="start (detached) or stop a read-only model mirror")
    mirror_cmd.add_argument("--root", help="directory in the <owner>/<repo>/resolve/<revision>/<file> layout")
    mirror_cmd.add_argument(
        "--bind", action="append", help="address to listen on, repeatable (one port for all; default: 127.0.0.1)"
    )
    mirror_cmd.add_argument("--port", type=int, default=0, help="port (0: any free port, printed)")
    mirror_cmd.add_argument("--pidfile", required=True, help="pid of the running mirror")
    mirror_cmd.add_argument("--logfile", help="its log (required to start)")
    mirror_cmd.add_argument("--stats-file", help="write per-file byte counters here (after each file and at exit)")
    mirror_cmd.add_argument("--idle-timeout", type=float, help="stop after this many seconds without requests")
    mirror_cmd.add_argument("--max-age", type=float, help="stop after this many seconds, busy or not")
    mirror_cmd.add_argument("--watch-pid", type=int, help="stop when this process exits")
    mirror_cmd.add_argument(
        "--watch-ansible", action="store_true", help="stop when the ansible-playbook run that started it exits"
    )
    mirror_cmd.add_argument(
        "--secret-file", help="write a fresh random secret here (mode 0600); every URL must start with /<secret>/"
    )
    mirror_cmd.add_argument(
        "--allow", action="append", help="serve only this <owner>/<repo>/resolve/<revision>/<file> (repeatable)"
    )
    mirror_cmd.add_argument(
        "--client",
        action="append",
        help="serve only connections from this address or network (repeatable; required off loopback)",
    )
    mirror_cmd.add_argument("--stop", action="store_true", help="stop the mirror of --pidfile")
    mirror_cmd.add_argument("--foreground", action="store_true", help=argparse.SUPPRESS)
    mirror_cmd.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)

    def run(args: argparse.Namespace) -> int:
        if not args.stop and (not args.root or not args.logfile):
            mirror_cmd.error("mirror needs --root and --logfile to start (or --stop)")
        return mirror(args)

    mirror_cmd.set_defaults(func=run)
