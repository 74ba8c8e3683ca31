"""The rig's apt sources as apt reads them, and the entries a role adds to them without contradicting them.

apt refuses every run when two entries for one URI and suite name different keyrings ("Conflicting values set
for option Signed-By"), and warns on every run when two entries list one component ("configured multiple
times"). A rig's owner may have any layout: the installer's sources.list, `apt modernize-sources`' deb822 files
(Debian 13), a mirror's own keyring. So a role never writes a fixed entry: it reads the rig's own entries and
adds only the components they lack, signed by the keyring they already name.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# The first line of every file written from a plan: such files are the kit's, never the rig's own entries.
MARKER = "# Managed by rigkit"


class SourcesError(Exception):
    """The rig's own sources already disagree: apt refuses them before the kit adds anything."""


@dataclass(frozen=True)
class Entry:
    """One source entry: a deb822 stanza or a one-line `deb` line."""

    where: str
    types: tuple[str, ...]
    uris: tuple[str, ...]
    suites: tuple[str, ...]
    components: tuple[str, ...]
    signed_by: str
    enabled: bool = True


@dataclass(frozen=True)
class Stanza:
    """One deb822 stanza a plan adds."""

    uri: str
    suites: tuple[str, ...]
    components: tuple[str, ...]
    signed_by: str


def same_uri(uri: str) -> str:
    """apt's key for a URI: it appends the trailing slash itself, so `…/debian` and `…/debian/` are one source."""
    return uri.rstrip("/") + "/"


def parse_one_line(text: str, where: str) -> list[Entry]:
    """`deb [opt=value ...] uri suite [component ...]` lines (sources.list and *.list)."""
    entries = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        kind, _, rest = line.partition(" ")
        options: dict[str, str] = {}
        rest = rest.strip()
        if rest.startswith("["):
            inside, _, rest = rest[1:].partition("]")
            for option in inside.split():
                name, _, value = option.partition("=")
                options[name.lower()] = value
        words = rest.split()
        if kind not in ("deb", "deb-src") or len(words) < 2:
            continue
        entries.append(
            Entry(
                where=f"{where}:{number}",
                types=(kind,),
                uris=(words[0],),
                suites=(words[1],),
                components=tuple(words[2:]),
                signed_by=options.get("signed-by", ""),
            )
        )
    return entries


def _stanzas(text: str) -> Iterable[tuple[int, dict[str, str]]]:
    fields: dict[str, str] = {}
    start, name = 0, ""
    for number, line in enumerate([*text.splitlines(), ""], 1):
        if line.startswith("#"):
            continue
        if not line.strip():
            if fields:
                yield start, fields
            fields, name = {}, ""
            continue
        if line[0] in " \t" and name:
            part = line.strip()
            fields[name] += "\n" + ("" if part == "." else part)
            continue
        key, _, value = line.partition(":")
        if not fields:
            start = number
        name = key.strip().lower()
        fields[name] = value.strip()


def parse_deb822(text: str, where: str) -> list[Entry]:
    """deb822 `.sources` files: stanzas of `Types`, `URIs`, `Suites`, `Components`, `Signed-By`, `Enabled`."""
    return [
        Entry(
            where=f"{where}:{start}",
            types=tuple(fields.get("types", "").split()),
            uris=tuple(fields.get("uris", "").split()),
            suites=tuple(fields.get("suites", "").split()),
            components=tuple(fields.get("components", "").split()),
            signed_by=fields.get("signed-by", "").strip(),
            enabled=fields.get("enabled", "yes").strip().lower() not in ("no", "false", "0"),
        )
        for start, fields in _stanzas(text)
    ]


def read_sources(apt_dir: str, managed: Sequence[str] = ()) -> list[Entry]:
    """Every entry apt reads under `apt_dir`, except the kit's own files (`managed` paths, or the marker)."""
    parts = os.path.join(apt_dir, "sources.list.d")
    paths = [
        os.path.join(apt_dir, "sources.list"),
        *sorted(glob.glob(os.path.join(parts, "*.list")) + glob.glob(os.path.join(parts, "*.sources"))),
    ]
    entries: list[Entry] = []
    for path in paths:
        if path in managed or not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
        if text.startswith(MARKER):
            continue
        parse = parse_deb822 if path.endswith(".sources") else parse_one_line
        entries.extend(parse(text, path))
    return entries


def _matching(entries: Sequence[Entry], uri: str, suite: str) -> list[Entry]:
    return [
        entry
        for entry in entries
        if entry.enabled and suite in entry.suites and same_uri(uri) in {same_uri(u) for u in entry.uris}
    ]


def _keyring(matching: Sequence[Entry], uri: str, suite: str) -> str:
    named = {entry.signed_by: entry.where for entry in matching if entry.signed_by}
    if len(named) > 1:
        found = "; ".join(f"{value!r} in {where}" for value, where in named.items())
        raise SourcesError(
            f"the rig's apt sources already name different keyrings for {uri} {suite} ({found}): apt refuses "
            "that (Conflicting values set for option Signed-By). Make those entries name one Signed-By, run "
            "apt-get update on the rig to check, then run the kit again"
        )
    return next(iter(named), "")


def plan(
    uris: Sequence[str], suites: Sequence[str], components: Sequence[str], signed_by: str, entries: Sequence[Entry]
) -> list[Stanza]:
    """What a repository adds beside the rig's own `entries`.

    Per URI and suite: only the components no enabled `deb` entry lists (a flat repository, no components, is
    added only when no entry has it), signed by the keyring the rig's entries already name, else `signed_by`.
    Suites that need the same components under one keyring share a stanza.
    """
    stanzas: list[Stanza] = []
    for uri in uris:
        for suite in suites:
            matching = _matching(entries, uri, suite)
            have = {c for entry in matching if "deb" in entry.types for c in entry.components}
            missing = tuple(c for c in components if c not in have)
            if (components and not missing) or (not components and any("deb" in e.types for e in matching)):
                continue
            keyring = _keyring(matching, uri, suite) or signed_by
            for number, stanza in enumerate(stanzas):
                if (stanza.uri, stanza.components, stanza.signed_by) == (uri, missing, keyring):
                    stanzas[number] = Stanza(uri, (*stanza.suites, suite), missing, keyring)
                    break
            else:
                stanzas.append(Stanza(uri, (suite,), missing, keyring))
    return stanzas


def _field(name: str, value: str) -> str:
    lines = value.splitlines() or [""]
    return f"{name}: {lines[0]}" + "".join(f"\n {line if line.strip() else '.'}" for line in lines[1:])


def render(name: str, stanzas: Sequence[Stanza]) -> str:
    """The deb822 file for `stanzas`, or "" when the rig's own sources already have everything."""
    if not stanzas:
        return ""
    blocks = [
        "\n".join(
            ["Types: deb", f"URIs: {s.uri}", f"Suites: {' '.join(s.suites)}"]
            + ([f"Components: {' '.join(s.components)}"] if s.components else [])
            + [_field("Signed-By", s.signed_by)]
        )
        for s in stanzas
    ]
    head = f"{MARKER} ({name}): only what the rig's own apt sources lack; those stay as they are.\n"
    return head + "\n\n".join(blocks) + "\n"
