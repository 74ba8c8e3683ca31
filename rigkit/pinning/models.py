"""Pin a model-catalog entry: find its file's commit, LFS sha256 and size through the Hugging Face API, record them.

Used by ``rigkit pin`` / ``make pin model=NAME [revision=REF]`` and ``make pin host=RIG`` on the controller
(never on rigs).

1. The entry must exist in the catalog file and name its ``repo`` and ``filename``.
2. With a trusted sha256 already in the entry (from the seed or a public record), that sha256 is the anchor:
   the commits of ``REF`` (default ``main``) are walked newest first
   (``GET {endpoint}/api/models/{repo}/commits/{ref}``, pages followed through the ``Link`` header) and the
   file is looked up at each (step 4) until one holds exactly that sha256: the NEWEST such commit is pinned
   with its size. When no commit holds it, the pin is refused, listing what each commit holds. ``force``
   drops the anchor: what ``REF`` holds is pinned over the recorded values (a new build you checked).
3. Without one, what ``REF`` holds is pinned: a ref that is not a full 40-hex commit (``main``, a tag) is
   resolved once through ``GET {endpoint}/api/models/{repo}/revision/{ref}``.
4. ``POST {endpoint}/api/models/{repo}/paths-info/{commit}`` with ``paths=<filename>`` (the API
   huggingface_hub's ``get_paths_info`` uses) gives the file's ``lfs.oid`` (its sha256) and ``size``.
5. ``revision`` (double-quoted), ``sha256`` and ``size`` are written into the catalog with ruamel.yaml's
   round-trip mode: comments, order and the other entries stay as they are. An existing, different value is
   never replaced silently: without ``force`` the pin is refused, listing old and new.
6. An entry without ``shape:`` facts (what the controller's memory fit reads before any GGUF is cached) gets
   them measured from the pinned file's GGUF header, read by Range requests from its start
   (rigkit/validation/catalog_shape.py), and ``architecture`` with them when the entry lacks it.

``pin_host`` pins, in one go, every entry a rig needs (target and drafter) that is not fully pinned yet or has no
shape facts.

The API calls (and their security policy: https only, the token only to the endpoint's origin) are in
rigkit/pinning/hf_api.py; this module decides what to pin and writes the catalog.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from ansible.module_utils.atomic_file import write_atomic
from ansible.module_utils.gguf_metadata import GgufError
from ansible.module_utils.model_catalog import (
    CATALOG_PATH,
    REVISION_RE,
    CatalogError,
    check_deployable,
    unpinned_fields,
)

from rigkit.pinning.hf_api import (
    DEFAULT_ENDPOINT,
    MAX_COMMITS,
    SHA256_RE,
    CommitFile,
    FileInfo,
    HubApi,
    NotInLfsError,
    PinError,
)
from rigkit.validation.catalog_shape import has_shape, shape_facts

__all__ = [
    "DEFAULT_ENDPOINT",
    "DEFAULT_REVISION",
    "HubApi",
    "NotInLfsError",
    "PinError",
    "PinResult",
    "pin_entry",
    "pin_host",
]

DEFAULT_REVISION = "main"
PIN_FIELDS = ("revision", "sha256", "size")


@dataclass
class PinResult:
    name: str
    catalog: str
    repo: str
    filename: str
    revision: str
    sha256: str
    size: int
    changed: bool
    resolved_from: str | None = None  # the ref the caller gave, when it was not a commit
    previous: dict[str, Any] = field(default_factory=dict)
    anchored: bool = False  # found by walking the commits for the entry's trusted sha256
    walked: int = 0  # commits looked at
    shape: dict[str, Any] | None = None  # the shape facts measured and recorded by this pin


def _walk_table(seen: list[CommitFile]) -> str:
    lines = []
    for row in seen:
        what = f"sha256 {row.sha256}  size {row.size}" if row.sha256 else row.note
        date = f"  {row.date[:10]}" if row.date else ""
        title = f"  {row.title[:60]}" if row.title else ""
        lines.append(f"  {row.commit}{date}  {what}{title}")
    return "\n".join(lines) or "  (no commits)"


# ---------------------------------------------------------------------------------------------- the catalog
def _yaml() -> Any:
    from ruamel.yaml import YAML

    yaml = YAML()  # round-trip: comments, order and quoting survive
    yaml.preserve_quotes = True
    yaml.width = 4096
    yaml.indent(mapping=2, sequence=4, offset=2)
    # Unpinned fields read `null` in the catalog; ruamel would write them as empty values.
    yaml.representer.add_representer(
        type(None), lambda representer, _: representer.represent_scalar("tag:yaml.org,2002:null", "null")
    )
    return yaml


def _load(path: str) -> tuple[Any, Any, str]:
    yaml = _yaml()
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise PinError(f"cannot read the catalog {path}: {exc.strerror or exc}") from None
    data = yaml.load(text)
    if not isinstance(data, dict) or not isinstance(data.get("model_catalog"), dict):
        raise PinError(f"{path} has no model_catalog mapping")
    return yaml, data, text


def _write(path: str, yaml: Any, data: Any, explicit_start: bool) -> None:
    yaml.explicit_start = explicit_start
    write_atomic(path, lambda handle: yaml.dump(data, handle), os.stat(path).st_mode & 0o7777)


def _flow_lists(facts: dict[str, Any]) -> Any:
    """The shape facts for the catalog, a per-layer list on one line ([true, false, ...]) as a reader expects."""
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    shape = CommentedMap()
    for key, value in facts.items():
        if isinstance(value, list):
            value = CommentedSeq(value)
            value.fa.set_flow_style()
        shape[key] = value
    return shape


def pin_entry(
    name: str,
    revision: str | None = None,
    *,
    catalog_path: str = CATALOG_PATH,
    api: HubApi | None = None,
    force: bool = False,
    max_commits: int = MAX_COMMITS,
) -> PinResult:
    """Find the pin of ``name`` (see module doc) and write revision, sha256 and size into the catalog file."""
    yaml, data, text = _load(catalog_path)
    catalog = data["model_catalog"]
    if name not in catalog:
        raise PinError(f"model '{name}' is not in {catalog_path}. Known: {', '.join(sorted(catalog))}")
    entry = catalog[name]
    repo, filename = entry.get("repo"), entry.get("filename")
    if not repo or not filename:
        raise PinError(f"model '{name}' has no repo or filename in {catalog_path}: set them first, then pin")
    repo, filename = str(repo), str(filename)
    ref = revision or DEFAULT_REVISION
    api = api or HubApi()
    trusted = str(entry.get("sha256") or "")
    resolved_from = None
    walked = 0
    if SHA256_RE.fullmatch(trusted) and not force:
        found, seen = api.find_commit_with(repo, ref, filename, trusted, limit=max_commits)
        walked = len(seen)
        if found is None:
            capped = f" (the walk stops after {max_commits} commits)" if walked >= max_commits else ""
            raise PinError(
                f"no commit of {repo} @ {ref} holds {filename} with the trusted sha256 {trusted} recorded for "
                f"'{name}' in {catalog_path}{capped}. Found, newest first:\n{_walk_table(seen)}\n"
                "Do not pin another file in its place without checking it: the recorded sha256 is what the kit "
                "trusts. If a listed file is the right one after all (a new build you checked), pin that commit "
                f"over it: make pin model={name} revision=COMMIT force=1"
            )
        assert found.sha256 is not None and found.size is not None
        info = FileInfo(sha256=found.sha256, size=found.size, commit=found.commit)
        resolved_from = None if ref == found.commit else ref
    else:
        commit = ref
        if not REVISION_RE.fullmatch(ref):
            resolved_from = ref
            commit = api.resolve_revision(repo, ref)
        info = api.lookup_file(repo, commit, filename)
    new = {"revision": info.commit, "sha256": info.sha256, "size": info.size}
    old = {key: entry.get(key) for key in PIN_FIELDS}
    measured: tuple[str, dict[str, Any]] | None = None
    conflicts = {key: (old[key], new[key]) for key in PIN_FIELDS if old[key] not in (None, "") and old[key] != new[key]}
    if conflicts and not force:
        lines = "\n".join(f"  {key}: {was} -> {now}" for key, (was, now) in conflicts.items())
        raise PinError(
            f"model '{name}' is already pinned differently in {catalog_path}; refusing to replace the pin:\n{lines}\n"
            f"If the new pin is right (a new revision you checked), re-run with force: "
            f"make pin model={name} revision={info.commit} force=1"
        )
    if not has_shape(entry):
        try:
            measured = shape_facts(api.gguf_header(repo, info.commit, filename, info.size))
        except GgufError as exc:
            raise PinError(f"cannot measure the shape of '{name}' from its GGUF header: {exc}") from None
    result = PinResult(
        name=name,
        catalog=catalog_path,
        repo=repo,
        filename=filename,
        revision=info.commit,
        sha256=info.sha256,
        size=info.size,
        changed=old != new or measured is not None,
        resolved_from=resolved_from,
        previous=old,
        anchored=bool(walked),
        walked=walked,
        shape=measured[1] if measured else None,
    )
    if not result.changed:
        return result
    from ruamel.yaml.scalarstring import DoubleQuotedScalarString

    entry["revision"] = DoubleQuotedScalarString(info.commit)
    entry["sha256"] = info.sha256
    entry["size"] = info.size
    if measured is not None:
        architecture, facts = measured
        if not entry.get("architecture"):
            entry["architecture"] = architecture
        elif entry["architecture"] != architecture:
            raise PinError(
                f"'{name}' says architecture {entry['architecture']} in {catalog_path} but its GGUF header says "
                f"{architecture}: check the entry's repo and filename"
            )
        entry["shape"] = _flow_lists(facts)
    try:
        check_deployable(name, {key: entry[key] for key in entry})
    except CatalogError as exc:
        raise PinError(f"the pinned entry would still not be deployable: {exc}") from None
    _write(catalog_path, yaml, data, explicit_start=text.lstrip().startswith("---"))
    return result


def pin_host(
    host: str,
    names: list[str],
    *,
    catalog_path: str = CATALOG_PATH,
    api: HubApi | None = None,
    max_commits: int = MAX_COMMITS,
) -> tuple[list[PinResult], list[str]]:
    """Pin every entry of ``names`` that is not fully pinned yet; (the pins made, the names already pinned).

    Entries are pinned one after the other; the first failure stops with a PinError naming the entry (the
    pins made before it stay written, so a re-run continues where this one stopped).
    """
    if not names:
        raise PinError(f"{host} names no models (models_target / models_drafter in its host_vars): nothing to pin")
    _, data, _ = _load(catalog_path)
    catalog = data["model_catalog"]
    unknown = [name for name in names if name not in catalog]
    if unknown:
        raise PinError(
            f"{host} names {', '.join(unknown)}, not in {catalog_path}: fix models_target / models_drafter in "
            f"inventory/host_vars/{host}.yml. Known: {', '.join(sorted(catalog))}"
        )
    done: list[PinResult] = []
    already: list[str] = []
    for name in dict.fromkeys(names):
        if not unpinned_fields(dict(catalog[name])) and has_shape(catalog[name]):
            already.append(name)
            continue
        try:
            done.append(pin_entry(name, None, catalog_path=catalog_path, api=api, max_commits=max_commits))
        except PinError as exc:
            made = f" (pinned before it: {', '.join(r.name for r in done)})" if done else ""
            raise PinError(f"{host}: cannot pin '{name}'{made}: {exc}") from None
    return done, already
