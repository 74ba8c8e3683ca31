"""rigkit: the command line behind the Makefile's targets (each subcommand lives in its own module here).

rigkit check-host NAME   exit 0 when NAME is a rig in the inventory, else list the known rigs
rigkit hosts             list the rigs
rigkit pin --host RIG    pin every model the rig needs (target and drafter) that is not pinned yet
rigkit pin NAME          pin one catalog entry (revision, sha256, size): with a trusted sha256 in the entry,
                         the newest commit of main holding exactly that file; without one, what main holds
rigkit pin NAME REVISION record a catalog entry's sha256 and size from the Hugging Face API
rigkit mirror --root DIR --bind ADDR --port N --pidfile F --logfile F [--secret-file F --allow P ...] [--stop]
                         start (detached) or stop a read-only model mirror in the resolve/ layout
rigkit bench-render --out-dir DIR
                         build a bench report from the raw steps on stdin, check it against its schema, plot it
rigkit bench-report [--host NAME]
                         a table of past bench runs
rigkit tune NAME [--report PATH]
                         apply the best measured draft length to the host's variables (when it beats the noise)
rigkit status [--limit RIGS] [--json] [--wide]
                         read back every rig and print one table (exit 3: a rig unreachable)
rigkit logs --limit RIGS [--lines N]
                         the last lines of each rig's llama-server journal
rigkit drift --limit RIGS
                         the provision in check + diff mode; exit 2 when a rig differs from the repo
rigkit sandbox-hub --root DIR [--only NAME,...]
                         lay out the sandbox rigs' models (the embedded default's stand-in Hugging Face)
rigkit discover NAME ADDRESS [--user USER] [--force] [--vram MIB] [--max-ctx N]
                         read a machine (SSH, or docker:CONTAINER for a sandbox rig), write its host profile
rigkit plan --host RIG   the rig's driver / CUDA / GPU / kernel compatibility plan (no rig contacted)
rigkit proof NAME | --list | --check
                         run a heavy proof and write its receipt (reports/proofs/), or check every receipt
rigkit observe           the fleet services' way in: the gateway's URL and a curl that works, Prometheus, queries
rigkit fleet-graph --out PNG [--graph acceptance|decode_tps|gpu_temperature] [--range 30m]
                         a picture of the fleet monitor's graph (matplotlib, from Prometheus's query API)
"""

from __future__ import annotations

import argparse

from rigkit.cli import (
    bench,
    discover,
    fleet,
    fleet_graph,
    inventory,
    logs,
    mirror,
    observe,
    pin,
    plan,
    proof,
    sandbox_hub,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rigkit", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (
        inventory, logs, pin, mirror, sandbox_hub, bench, fleet, discover, plan, proof, observe, fleet_graph,
    ):  # fmt: skip
        module.register(commands)
    args = parser.parse_args(argv)
    return args.func(args)
