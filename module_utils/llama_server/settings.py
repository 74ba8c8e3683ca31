"""llama-server's settings, one row each: the one home of the argv, the managed flags, the read-back from a running
container, the preflight's inputs and the validation ranges (stdlib only: rigs and the controller both run it).

Adding a plain flag is one row here, its default in roles/llama_server/defaults/main.yml, its entry in
meta/argument_specs.yml and its README row (tests/unit/test_server_settings.py checks the three against this
table). A flag that changes memory use also needs its line in module_utils/preflight/memory.py.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ansible.module_utils.parsing.convert_bool import boolean

# Integer ranges the specs' types cannot say: (lowest, highest or None, what is accepted).
PORT = (1, 65535, "a port 1-65535")
POSITIVE = (1, None, "a positive integer")
# llama.cpp takes any --spec-draft-n-max >= 1, but a draft longer than 16 tokens never pays off for these models
# (the kit's bench goes to llama_bench_draft_max, 4 by default): the kit accepts 1..16.
DRAFT_N_MAX = (1, 16, "a draft length 1-16")
DRAFT_N_MIN = (0, 16, "a draft length 0-16")


@dataclass(frozen=True)
class Setting:
    """One llama-server option as the kit sets it.

    ``kind``: "value" (flag and value), "switch" (the flag, and ``const`` if any, when the variable is true),
    "const" (the flag and ``const``, when ``when`` holds). ``when``: the variable that must be true for the flag
    to appear; "set": the variable must not be null/empty. ``env``: the environment file's name for it instead
    of an argv flag. ``preflight``: the memory preflight's key; ``status``: the key the read-back and the lock use.
    """

    flag: str
    variable: str = ""
    spellings: tuple[str, ...] = ()
    kind: str = "value"
    const: str = ""
    when: str = ""
    env: str = ""
    range: tuple[int, int | None, str] | None = None
    preflight: str = ""
    status: str = ""
    memory: bool = False


DRAFTS = "__llama_server_drafts"
# In the order the unit lists them (llama.cpp's own spellings from common/arg.cpp at the pinned commit).
SETTINGS: tuple[Setting, ...] = (
    Setting("--model", "llama_server_target_path", ("-m",), memory=True),
    Setting("--alias", "__llama_server_alias", ("-a",), when="set"),
    Setting(
        "--ctx-size",
        "llama_server_ctx_size",
        ("-c",),
        range=POSITIVE,
        preflight="ctx_size",
        status="ctx_size",
        memory=True,
    ),
    Setting(
        "--parallel",
        "llama_server_parallel",
        ("-np",),
        range=POSITIVE,
        preflight="parallel",
        status="parallel",
        memory=True,
    ),
    Setting("--n-gpu-layers", "llama_server_gpu_layers", ("-ngl", "--gpu-layers"), preflight="gpu_layers", memory=True),
    Setting("--flash-attn", "llama_server_flash_attn", ("-fa",), preflight="flash_attn", memory=True),
    Setting("--cache-type-k", "llama_server_cache_type_k", ("-ctk",), preflight="cache_type_k", memory=True),
    Setting("--cache-type-v", "llama_server_cache_type_v", ("-ctv",), preflight="cache_type_v", memory=True),
    Setting("--model-draft", "llama_server_drafter_path", ("-md", "--spec-draft-model"), when=DRAFTS, memory=True),
    Setting(
        "--spec-type", "llama_server_spec_type", when=DRAFTS, preflight="spec_type", status="spec_type", memory=True
    ),
    Setting(
        "--spec-draft-n-max", "llama_server_spec_draft_n_max", when=DRAFTS, range=DRAFT_N_MAX, status="draft_n_max"
    ),
    Setting(
        "--spec-draft-n-min", "llama_server_spec_draft_n_min", when=DRAFTS, range=DRAFT_N_MIN, status="draft_n_min"
    ),
    Setting(
        "--n-gpu-layers-draft",
        "llama_server_gpu_layers_draft",
        ("-ngld", "--gpu-layers-draft", "--spec-draft-ngl"),
        when=DRAFTS,
        preflight="gpu_layers_draft",
        memory=True,
    ),
    Setting("--swa-full", "llama_server_swa_full", kind="switch", preflight="swa_full", memory=True),
    Setting("--kv-unified", "llama_server_kv_unified", ("-kvu",), kind="switch", preflight="kv_unified", memory=True),
    Setting("--batch-size", "llama_server_batch_size", ("-b",), when="set", range=POSITIVE),
    Setting(
        "--ubatch-size",
        "llama_server_ubatch_size",
        ("-ub",),
        when="set",
        range=POSITIVE,
        preflight="ubatch_size",
        memory=True,
    ),
    Setting("--threads", "llama_server_threads", ("-t",), when="set", range=POSITIVE),
    Setting("--threads-batch", "llama_server_threads_batch", ("-tb",), when="set", range=POSITIVE),
    Setting("--cache-reuse", "llama_server_cache_reuse", when="set", range=(0, None, "a chunk size >= 0 (0: off)")),
    # The pin has no --mlock: keeping the model in RAM is a load mode (mmap, then locked).
    Setting("--load-mode", "llama_server_mlock", ("-lm",), kind="switch", const="mmap+mlock"),
    Setting("--metrics", "llama_server_metrics", kind="switch"),
    Setting("--cors-origins", "llama_server_cors_origins"),
    # The kit's memory preflight is the one memory authority: llama.cpp's own fit (on by default, a fixed 1 GiB
    # margin) would shrink a context the preflight passed, and cannot measure the Gemma 4 assistant (#28172).
    Setting("--fit", spellings=("-fit",), kind="const", const="off"),
    # The load lines the offload check reads are logged at verbosity 4 (llama-server's default, 3, hides them).
    Setting(
        "--verbosity", spellings=("-lv", "--log-verbosity"), kind="const", const="4", when="__llama_server_require_gpu"
    ),
    Setting("--ssl-key-file", "__llama_server_tls_key_path", when="__llama_server_tls"),
    Setting("--ssl-cert-file", "__llama_server_tls_cert_path", when="__llama_server_tls"),
    # In the environment file, not the argv: the bind, and the key (a secret never in argv).
    Setting("--host", "llama_server_host", env="LLAMA_ARG_HOST"),
    Setting("--port", "llama_server_port", env="LLAMA_ARG_PORT", range=PORT),
    Setting("--api-key", "llama_server_api_key", env="LLAMA_API_KEY"),
)
# Whole families the kit owns: secrets and TLS, speculative decoding, the fit, and every way of naming a model (a
# model named here would be used unverified: the kit deploys only hash-checked files).
MANAGED_PREFIXES = (
    "--api-key",
    "--ssl-",
    "--spec-",
    "--model",
    "--hf-",
    "-hf",
    "-mu",
    "--alias",
    "--host",
    "--port",
    "--fit",
    "-fit",
)


_FLAG_RE = re.compile(r"^--?[a-zA-Z]")


def flag_names(extra_args: list[Any]) -> list[str]:
    """The flags among llama-server arguments (``--flag``, ``-f``, ``--flag=value``), without their values."""
    return [arg.split("=", 1)[0] for arg in extra_args if isinstance(arg, str) and _FLAG_RE.match(arg)]


def _true(value: Any) -> bool:
    return boolean(value, strict=False)


def _set(value: Any) -> bool:
    return value is not None and str(value) != ""


def variables() -> list[str]:
    """Every variable the argv reads: the rows' own and the ones their flags depend on."""
    names = [s.variable for s in SETTINGS if s.variable and not s.env]
    names += [s.when for s in SETTINGS if s.when not in ("", "set")]
    return list(dict.fromkeys(names))


def argv(values: Mapping[str, Any]) -> list[str]:
    """llama-server's arguments (without llama_server_extra_args) from the variables' values."""
    args: list[str] = []
    for s in SETTINGS:
        if s.env:
            continue
        value = values.get(s.variable) if s.variable else None
        if s.when == "set" and not _set(value):
            continue
        if s.when not in ("", "set") and not _true(values.get(s.when)):
            continue
        if s.kind == "switch":
            args += ([s.flag, s.const] if s.const else [s.flag]) if _true(value) else []
        elif s.kind == "const":
            args += [s.flag, s.const]
        else:
            args += [s.flag, str(value)]
    return args


def managed_flags() -> set[str]:
    """Every spelling of every flag the kit sets (argv and environment)."""
    return {name for s in SETTINGS for name in (s.flag, *s.spellings)}


def is_managed(flag: str, managed: set[str] | None = None) -> bool:
    name = flag.split("=", 1)[0]
    return name in (managed or managed_flags()) or any(name.startswith(prefix) for prefix in MANAGED_PREFIXES)


def extra_args_problems(extra_args: list[Any]) -> list[str]:
    """The managed flags among llama_server_extra_args, each refused (its variable sets it instead)."""
    managed = managed_flags()
    return [flag for flag in flag_names(extra_args) if is_managed(flag, managed)]


def status_flags() -> dict[str, str]:
    """Each spelling of a read-back setting -> its status key (what a running container's argv says)."""
    return {name: s.status for s in SETTINGS if s.status for name in (s.flag, *s.spellings)}


def preflight_settings(values: Mapping[str, Any], on_gpu: bool) -> dict[str, Any]:
    """The memory preflight's inputs from the variables: layers count only on a rig that serves from its GPU."""
    found: dict[str, Any] = {}
    for s in SETTINGS:
        if not s.preflight:
            continue
        value = values.get(s.variable)
        if s.kind == "switch":
            value = _true(value)
        elif s.preflight in ("gpu_layers", "gpu_layers_draft") and not on_gpu:
            value = 0
        elif s.when == "set" and not _set(value):
            value = None
        found[s.preflight] = value
    return found


def ranges() -> dict[str, tuple[int, int | None, str]]:
    return {s.variable: s.range for s in SETTINGS if s.range}
