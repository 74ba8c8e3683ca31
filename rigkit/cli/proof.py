"""`rigkit proof NAME`: run one heavy proof and write its receipt (reports/proofs/NAME.json); `rigkit proof
--check`: say which receipts are missing, failed or stale (what make test's receipt test checks)."""

from __future__ import annotations

import argparse
import sys

from rigkit import REPO, proofs


def run(args: argparse.Namespace) -> int:
    if args.list:
        for item in proofs.PROOFS:
            print(f"{item.make_target:40} {item.summary}")
        return 0
    if args.check:
        problems = [problem for item in proofs.PROOFS if (problem := proofs.receipt_problem(item))]
        print("\n".join(problems) or f"every receipt ({len(proofs.PROOFS)}) passed on the current inputs")
        return 1 if problems else 0
    if not args.names:
        print("rigkit proof: name a proof (rigkit proof --list), or --check", file=sys.stderr)
        return 2
    try:
        wanted = [proofs.proof(name) for name in args.names]
    except KeyError as exc:
        print(f"rigkit proof: {exc.args[0]}", file=sys.stderr)
        return 2
    failed = 0
    for item in wanted:
        print(f"== proof {item.name}: {item.summary}", flush=True)
        receipt = proofs.run_proof(item, REPO / ".artifacts")
        print(
            f"   {receipt['result']} in {receipt['wall_s']} s; receipt {item.receipt.relative_to(REPO)}, "
            f"log {receipt['log']}"
        )
        for line in receipt["decisive_lines"]:
            print(f"   {line}")
        if receipt["result"] != "passed":
            failed += 1
            print(f"   failed at: {receipt['failed_step']} (see the log)", file=sys.stderr)
    return 1 if failed else 0


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("proof", help="run a heavy proof and write its receipt, or check the receipts")
    parser.add_argument("names", nargs="*", metavar="NAME")
    parser.add_argument("--list", action="store_true", help="the proofs and their make targets")
    parser.add_argument("--check", action="store_true", help="which receipts are missing, failed or stale")
    parser.set_defaults(func=run)
