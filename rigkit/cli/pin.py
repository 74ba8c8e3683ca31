"""`rigkit pin` (make pin): pin catalog entries from the Hugging Face API (logic in rigkit/pinning/models.py)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

import yaml
from ansible.module_utils.printable import printable

from rigkit.cli.inventory import host_values
from rigkit.paths import CATALOG, inventory_catalog
from rigkit.pinning.hf_api import DEFAULT_ENDPOINT


def host_model_names(host: str) -> list[str]:
    """models_target and models_drafter of ``host`` as the inventory gives them (templated)."""
    return model_names(host_values(host, MODEL_VARIABLES))


MODEL_VARIABLES = ("models_target", "models_drafter")


def model_names(values: dict[str, object]) -> list[str]:
    """The catalog names a rig's variables give: its target, then its drafter when it has one."""
    return [str(values[name]) for name in MODEL_VARIABLES if values.get(name) not in (None, "")]


def _print_pin(result: object) -> None:
    from rigkit.pinning.models import PinResult

    assert isinstance(result, PinResult)
    where = f"{result.repo} @ {result.revision} : {result.filename}"
    if result.anchored:
        via = result.resolved_from or result.revision
        print(
            f"{result.name}: the trusted sha256 is held by commit {result.revision} "
            f"(newest of {via}, {result.walked} commit(s) looked at)"
        )
    elif result.resolved_from:
        print(f"{result.resolved_from} of {result.repo} is commit {result.revision}; pinning the commit")
    if not result.changed:
        print(f"{result.name}: already pinned to {where} (sha256 {result.sha256}, {result.size} bytes); nothing to do")
        return
    shape = ""
    if result.shape:
        weights, on_gpu = result.shape["weights_bytes"] / 2**20, result.shape["gpu_weights_bytes"] / 2**20
        shape = (
            f"\n  shape  {len(result.shape) - 2} header facts, weights {weights:,.0f} MiB ({on_gpu:,.0f} MiB of them "
            "on the GPU with every layer offloaded), read from the GGUF's first bytes"
        )
    pinned = {"revision": result.revision, "sha256": result.sha256, "size": result.size}
    if result.previous == pinned:
        print(f"{result.name}: already pinned to {where}; recorded its shape facts{shape}\n  in {result.catalog}")
        return
    print(
        f"{result.name}: pinned {where}\n  sha256 {result.sha256}\n  size   {result.size}{shape}\n  in {result.catalog}"
    )


def _endpoint_notice(endpoint: str) -> None:
    if endpoint.rstrip("/") != DEFAULT_ENDPOINT:
        origin = "$HF_ENDPOINT" if endpoint == os.environ.get("HF_ENDPOINT") else "--endpoint"
        print(
            f"rigkit pin: asking {printable(endpoint, 200)} (from {origin}), not {DEFAULT_ENDPOINT}; HF_TOKEN, "
            "if set, goes there too (over https only)",
            file=sys.stderr,
        )


def first_use(pattern: str, api: object, notice: Callable[[], None]) -> int:
    """`make provision`'s step before validation: every entry the rigs of ``pattern`` need that carries a trusted
    sha256 but is not fully pinned (or has no shape facts) is pinned as `make pin` would. Nothing to pin: silent.
    What cannot be pinned here (no Hub access, no commit holding the sha256) is said in one line and left to the
    validation's refusal; exit 0 either way."""
    from ansible.module_utils.model_catalog import unpinned_fields

    from rigkit.cli.inventory import pattern_values
    from rigkit.pinning.hf_api import SHA256_RE
    from rigkit.pinning.models import PinError, pin_entry
    from rigkit.validation.catalog_shape import has_shape

    catalog_path = inventory_catalog()
    catalog = (yaml.safe_load(catalog_path.read_text()) or {}).get("model_catalog") or {}
    wanted: dict[str, str] = {}
    for rig, values in pattern_values(pattern, MODEL_VARIABLES).items():
        for name in model_names(values):
            entry = catalog.get(name)
            trusted = isinstance(entry, dict) and SHA256_RE.fullmatch(str(entry.get("sha256") or ""))
            if trusted and (unpinned_fields(dict(entry)) or not has_shape(entry)):
                wanted.setdefault(name, rig)
    shown = os.path.relpath(catalog_path)
    if wanted:
        notice()
    for name, rig in wanted.items():
        try:
            result = pin_entry(name, None, catalog_path=str(catalog_path), api=api)
        except PinError as exc:
            print(f"rigkit: {name} ({rig}) not pinned on first use: {str(exc).splitlines()[0]}", file=sys.stderr)
            if str(exc).startswith("cannot reach"):
                break  # no Hub from here: the validation's refusal says what to run where it is
            continue
        print(
            f"rigkit: {name} ({rig}) pinned on first use to {result.repo} @ {result.revision} (its trusted sha256, "
            f"{result.size} bytes) in {shown}: commit it (git commit {shown})"
        )
    return 0


def pin(args: argparse.Namespace) -> int:
    from rigkit.pinning.models import HubApi, PinError, pin_entry, pin_host

    revision = args.revision_opt or args.revision
    api = HubApi(args.endpoint, token=os.environ.get("HF_TOKEN") or None, allow_insecure_http=args.allow_insecure_http)
    if args.first_use:
        return first_use(args.host or "", api, lambda: _endpoint_notice(args.endpoint))
    _endpoint_notice(args.endpoint)
    if bool(args.name) == bool(args.host):
        print(
            "rigkit pin: give a model or a rig: make pin model=NAME [revision=REF] | make pin host=RIG", file=sys.stderr
        )
        return 2
    try:
        if args.host:
            if revision or args.force:
                print(
                    "rigkit pin: revision= and force= apply to one model: make pin model=NAME revision=REF [force=1]",
                    file=sys.stderr,
                )
                return 2
            try:
                names = host_model_names(args.host)
            except LookupError as exc:
                print(f"rigkit pin: {exc}", file=sys.stderr)
                return 2
            done, already = pin_host(args.host, names, catalog_path=args.catalog, api=api)
            for result in done:
                _print_pin(result)
            for name in already:
                print(f"{name}: already pinned")
            print(
                f"{args.host}: every model it needs is pinned ({', '.join(names)}); next: make check host={args.host}"
            )
            return 0
        _print_pin(pin_entry(args.name, revision or None, catalog_path=args.catalog, api=api, force=args.force))
    except PinError as exc:
        print(f"rigkit pin: {exc}", file=sys.stderr)
        return 1
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    pin_cmd = commands.add_parser(
        "pin", help="pin a catalog entry (or every unpinned model of a rig) from the Hugging Face API"
    )
    pin_cmd.add_argument("name", nargs="?", help="catalog entry name (or --host)")
    pin_cmd.add_argument(
        "revision",
        nargs="?",
        help="branch, tag or commit (default: main); with a trusted sha256 the walk of its commits starts there",
    )
    pin_cmd.add_argument("--revision", dest="revision_opt", metavar="REF", help="the same as REVISION")
    pin_cmd.add_argument("--host", help="pin every model this rig needs (target and drafter) that is not pinned yet")
    pin_cmd.add_argument("--catalog", default=str(CATALOG), help="catalog file (default: %(default)s)")
    pin_cmd.add_argument(
        "--endpoint",
        default=os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT,
        help="Hugging Face endpoint (default: $HF_ENDPOINT or %(default)s); the token comes from $HF_TOKEN",
    )
    pin_cmd.add_argument(
        "--force",
        action="store_true",
        help="replace an existing, different pin; with a trusted sha256, pin what REVISION holds instead of the walk",
    )
    pin_cmd.add_argument("--allow-insecure-http", action="store_true", help="accept a plain http:// local endpoint")
    pin_cmd.add_argument(
        "--first-use",
        action="store_true",
        help="with --host RIGS (a pattern): pin the entries with a trusted sha256 those rigs need, quietly when none "
        "(make provision's first step); what cannot be pinned is left to the validation",
    )

    pin_cmd.set_defaults(func=pin)
