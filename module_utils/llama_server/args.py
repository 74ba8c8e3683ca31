"""Which llama-server flags the kit itself manages, so llama_server_extra_args cannot override them (stdlib only).

llama-server takes the last occurrence of a flag: an extra `--host 0.0.0.0` would bind every interface without
the API key and TLS that llama_server_host demands, and `--api-key` would put a secret into the unit's argv. The
managed set is read from the argv the role renders (roles/llama_server/vars/main.yml) and its environment file,
plus llama.cpp's other spellings of the same options, so a flag the role starts to set is managed at once.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# llama.cpp's other names for the options the kit sets (common/arg.cpp at the pinned commit).
ALIASES: dict[str, tuple[str, ...]] = {
    "--model": ("-m",),
    "--ctx-size": ("-c",),
    "--parallel": ("-np",),
    "--n-gpu-layers": ("-ngl", "--gpu-layers"),
    "--flash-attn": ("-fa",),
    "--cache-type-k": ("-ctk",),
    "--cache-type-v": ("-ctv",),
    "--model-draft": ("-md", "--spec-draft-model"),
    "--n-gpu-layers-draft": ("-ngld", "--gpu-layers-draft", "--spec-draft-ngl"),
    "--kv-unified": ("-kvu",),
    "--batch-size": ("-b",),
    "--ubatch-size": ("-ub",),
    "--threads": ("-t",),
    "--threads-batch": ("-tb",),
    "--verbosity": ("-lv", "--log-verbosity"),
    "--alias": ("-a",),
}
# The environment file's variables and the flags they stand for (llama.cpp reads LLAMA_ARG_<FLAG>).
ENV_FLAGS: dict[str, str] = {"LLAMA_ARG_HOST": "--host", "LLAMA_ARG_PORT": "--port", "LLAMA_API_KEY": "--api-key"}
# Whole families: secrets and TLS, speculative decoding, and every way of naming a model (a model named here would
# be used unverified: the kit deploys only hash-checked files).
MANAGED_PREFIXES = ("--api-key", "--ssl-", "--spec-", "--model", "--hf-", "-hf", "-mu", "--alias", "--host", "--port")

_ARGS_BLOCK_RE = re.compile(r"^__llama_server_args:(.*?)(?=^\S)", re.MULTILINE | re.DOTALL)
_FLAG_RE = re.compile(r"'(--?[a-z][a-z0-9-]*)'")
_ENV_RE = re.compile(r"^([A-Z_]+)=", re.MULTILINE)


def rendered_flags(role_vars_text: str, env_template_text: str = "") -> set[str]:
    """The flags in the role's argv (the __llama_server_args expression) and the environment file."""
    block = _ARGS_BLOCK_RE.search(role_vars_text + "\n_end:")
    flags = set(_FLAG_RE.findall(block.group(1))) if block else set()
    flags |= {ENV_FLAGS[name] for name in _ENV_RE.findall(env_template_text) if name in ENV_FLAGS}
    return flags


def managed_flags(kit_flags: Iterable[str]) -> set[str]:
    """The kit's flags with every spelling llama.cpp accepts for them."""
    managed = set(kit_flags)
    for flag in list(managed):
        managed.update(ALIASES.get(flag, ()))
    return managed


def is_managed(flag: str, managed: set[str]) -> bool:
    name = flag.split("=", 1)[0]
    return name in managed or any(name.startswith(prefix) for prefix in MANAGED_PREFIXES)


def extra_args_problems(extra_args: Iterable[object], managed: set[str]) -> list[str]:
    """The managed flags among llama_server_extra_args, each with the variable that sets it instead."""
    return [
        str(arg).split("=", 1)[0]
        for arg in extra_args
        if isinstance(arg, str) and arg.startswith("-") and is_managed(arg, managed)
    ]
