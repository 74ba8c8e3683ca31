"""`rigkit sandbox-hub`: lay out the sandbox's models in the stand-in Hub's resolve/ layout (rigkit/sandbox/hub.py)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rigkit.paths import CATALOG
from rigkit.sandbox.hub import HubError, build_hub


def run(args: argparse.Namespace) -> int:
    only = [name for name in args.only.split(",") if name] or None
    try:
        result = build_hub(args.root.absolute(), args.catalog, only)
    except (HubError, OSError) as exc:
        print(f"rigkit sandbox-hub: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    hub = commands.add_parser(
        "sandbox-hub", help="lay out the sandbox's models in the resolve/ layout (the stand-in hub)"
    )
    hub.add_argument("--root", required=True, type=Path, help="hub directory (resolve/ layout)")
    hub.add_argument("--catalog", type=Path, default=CATALOG, help="model catalog (default: the kit's)")
    hub.add_argument("--only", default="", help="comma-separated catalog names (default: every sandbox entry)")
    hub.set_defaults(func=run)
