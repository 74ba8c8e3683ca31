"""`rigkit cuda-standin` (make cuda-standin): build the stand-in CUDA base images from NVIDIA's PyPI wheels on the
kit's Debian base (docker/cuda-standin), for machines without Docker Hub; prints their tags as JSON."""

from __future__ import annotations

import argparse
import subprocess
import sys


def pick_base(tags: list[str], suite: str) -> str:
    """The one rigkit/debian image of ``suite`` among the engine's tags (a salted test image, or a base of another
    release such as a Molecule scenario's trixie, is not the stand-ins' base)."""
    found = sorted(
        tag for tag in tags if tag.startswith(f"rigkit/debian:{suite}-") and "-salt-" not in tag and tag.count("-") == 1
    )
    if not found:
        raise LookupError(f"no rigkit/debian base image of {suite} in the engine: run `make harness` first")
    if len(found) > 1:
        raise LookupError(f"several base images ({', '.join(found)}): name one with --base-image")
    return found[0]


def harness_base_image() -> str:
    """The kit's Debian base image of the harness's default release (make harness builds it)."""
    from rigkit.validation.rules import role_defaults

    done = subprocess.run(
        ["docker", "image", "ls", "--format", "{{.Repository}}:{{.Tag}}", "rigkit/debian"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    suite = role_defaults("container_harness")["container_harness_debian_suite"]
    return pick_base(done.stdout.splitlines() if done.returncode == 0 else [], suite)


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
