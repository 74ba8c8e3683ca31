"""`rigkit cuda-standin` (make cuda-standin): build the stand-in CUDA base images from NVIDIA's PyPI wheels on the
kit's Debian base (docker/cuda-standin), for machines without Docker Hub; prints their tags as JSON."""

from __future__ import annotations

import argparse
import subprocess
import sys


def harness_base_image() -> str:
    """The kit's Debian base image as the container harness names it (make harness builds it)."""
    done = subprocess.run(
        ["docker", "image", "ls", "--format", "{{.Repository}}:{{.Tag}}", "rigkit/debian"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    tags = sorted(line for line in done.stdout.splitlines() if "-salt-" not in line and line.count("-") == 1)
    if done.returncode != 0 or not tags:
        raise LookupError("no rigkit/debian base image in the engine: run `make harness` first")
    if len(tags) > 1:
        raise LookupError(f"several base images ({', '.join(tags)}): name one with --base-image")
    return tags[0]


def run(args: argparse.Namespace) -> int:
    from rigkit.cuda_standin import StandinError, build_images

    try:
        base = args.base_image or harness_base_image()
        print(build_images(base).as_json())
    except (StandinError, LookupError) as exc:
        print(f"rigkit cuda-standin: {exc}", file=sys.stderr)
        return 1
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("cuda-standin", help="build the stand-in CUDA base images from NVIDIA's wheels")
    parser.add_argument("--base-image", help="the Debian base to build on (default: the harness's rigkit/debian)")
    parser.set_defaults(func=run)
