"""The options the pinned llama-server accepts, as its own --help lists them.

llama-server stops at start on an option it does not know ("error: invalid argument: --no-numa"), and options
come and go between builds (--mlock became --load-mode mlock). The list is recorded from the pinned image's
--help in OPTIONS_FILE, so llama_server_extra_args is checked on the controller before any rig is touched;
tests/integration/test_llamacpp_image.py checks the file against the pinned image itself.

Re-record it after moving the pin: python -m rigkit.validation.server_options IMAGE
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from collections.abc import Iterable

from ansible.module_utils.llama_server.settings import flag_names

from rigkit import REPO

OPTIONS_FILE = REPO / "rigkit/validation/llama-server-options.txt"
HEADER = "# llama-server --help at llama.cpp commit "
# --help gives each option's names in the first 40 columns; the description starts in the 41st or on the next line.
_NAMES_WIDTH = 40
_NAME_RE = re.compile(r"(?:^|[\s,])(--?[a-zA-Z][a-zA-Z0-9-]*)")


def parse_help(text: str) -> list[list[str]]:
    """Each option of `llama-server --help` as the list of its names."""
    options = []
    for line in text.splitlines():
        if line.startswith("-"):
            names = line[:_NAMES_WIDTH] if len(line) > _NAMES_WIDTH and line[_NAMES_WIDTH - 1] == " " else line
            options.append(_NAME_RE.findall(names))
    return [names for names in options if names]  # not the "----- common params -----" headings


@functools.cache
def known_options() -> tuple[str, frozenset[str]]:
    """(the commit the list was recorded at, every option name it accepts)."""
    lines = OPTIONS_FILE.read_text().splitlines()
    commit = lines[0].removeprefix(HEADER).split()[0] if lines and lines[0].startswith(HEADER) else ""
    return commit, frozenset(name for line in lines if not line.startswith("#") for name in line.split())


def unknown_flags(extra_args: Iterable[object], commit: str) -> list[str]:
    """The flags among `extra_args` the llama-server of `commit` would refuse; none when no list is recorded for it."""
    recorded, names = known_options()
    if commit != recorded:
        return []
    return [flag for flag in flag_names(list(extra_args)) if flag not in names]


def record(image: str, commit: str) -> str:
    """The options file's text for the llama-server in `image` (built at `commit`)."""
    done = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", image, "--help"], capture_output=True, text=True, check=True
    )
    options = parse_help(done.stdout)
    return f"{HEADER}{commit} ({image}): {len(options)} options, one per line\n" + "".join(
        " ".join(names) + "\n" for names in options
    )


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m rigkit.validation.server_options IMAGE COMMIT", file=sys.stderr)
        return 2
    OPTIONS_FILE.write_text(record(argv[0], argv[1]))
    print(f"rigkit: {OPTIONS_FILE.relative_to(REPO)} recorded from {argv[0]}; commit it")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
