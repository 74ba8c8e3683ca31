"""Each role's README variable table agrees with its argument specs and its defaults.

The argument specs (`meta/argument_specs.yml`) declare every role input once; the README's table under
`| variable | default | ... |` lists the same names, one or more per row (full names, separated by ` / `),
and where a default cell is a code literal it matches `defaults/main.yml`.
"""

from __future__ import annotations

import re

import pytest
import yaml

from tests.support import REPO

ROLES = sorted(p.parent.parent.name for p in REPO.glob("roles/*/meta/argument_specs.yml"))
LITERAL_RE = re.compile(r"`([^`]+)`")
# A default cell that quotes the value: `x`, optionally followed by a remark, `x` (remark) or `x`: remark.
QUOTED_DEFAULT_RE = re.compile(r"^`([^`]+)`(?:$| \(|:)")


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def variable_table(readme_text: str) -> tuple[list[str], list[list[str]]]:
    """The header and rows of the one table whose first header cell is `variable`."""
    tables, header, rows = [], None, None
    for line in [*readme_text.splitlines(), ""]:
        if line.startswith("|"):
            cells = _cells(line)
            if header is None:
                header, rows = cells, []
            elif not set("".join(cells)) <= set("-: "):
                rows.append(cells)
            continue
        if header is not None and header[0] == "variable":
            tables.append((header, rows))
        header = rows = None
    assert len(tables) == 1, f"{len(tables)} tables headed `| variable |`, expected one"
    return tables[0]


def spec_options(role: str) -> dict[str, list[str]]:
    """Every option of every entry point, internal (`__`) names excluded: name -> entry points."""
    specs = yaml.safe_load((REPO / "roles" / role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    options: dict[str, list[str]] = {}
    for entry, point in specs.items():
        for name in point.get("options") or {}:
            if not name.startswith("__"):
                options.setdefault(name, []).append(entry)
    return options


def _rows_by_name(rows: list[list[str]]) -> dict[str, str]:
    """README variable -> its default cell (a row of N names pairs with N ` / `-separated defaults, or one for all)."""
    found: dict[str, str] = {}
    for row in rows:
        names = LITERAL_RE.findall(row[0])
        default = row[1] if len(row) > 1 else ""
        parts = default.split(" / ")
        if len(names) == 1 or len(parts) != len(names):
            parts = [default] * len(names)
        found.update(zip(names, parts, strict=True))
    return found


def _jinja_text(value: str) -> str:
    return re.sub(r"\s+", " ", value.replace("{{", "").replace("}}", "")).strip()


def _renders_as(template: str, shape: str) -> bool:
    """Whether the README's shape (`<name>` for a part that varies) is one rendering of the template."""
    parts = re.split(r"(\{\{.*?\}\})", template)
    pattern = "".join(".*" if part.startswith("{{") else re.escape(part) for part in parts)
    return re.fullmatch(pattern, re.sub(r"<[^<>]+>", "X", shape)) is not None


def default_mismatch(cell: str, value: object) -> str | None:
    """Why a README default cell disagrees with the defaults/main.yml value; None when it agrees or is prose."""
    match = QUOTED_DEFAULT_RE.match(cell)
    if not match:
        return None  # prose ("unset", "per release", "from the models role"): describes, not quotes
    text = match.group(1)
    if isinstance(value, str) and "{{" in value:
        # A templated default: the README quotes its expression (or part of it) or shows its rendered shape.
        if _jinja_text(text) in _jinja_text(value) or _renders_as(value, text):
            return None
        return f"`{text}` neither quotes nor renders the template {value!r}"
    if text.endswith("…"):
        return None if str(value).startswith(text[:-1]) else f"`{text}` does not abbreviate {value!r}"
    if text == value or yaml.safe_load(text) == value:
        return None
    return f"`{text}` != {value!r}"


@pytest.mark.parametrize("role", ROLES)
def test_readme_variable_table_matches_argument_specs(role):
    readme = REPO / "roles" / role / "README.md"
    specs = f"roles/{role}/meta/argument_specs.yml"
    header, rows = variable_table(readme.read_text())
    documented = _rows_by_name(rows)
    declared = spec_options(role)
    problems = [
        f"{role}: `{name}` (entry points {', '.join(entries)} of {specs}) has no row in roles/{role}/README.md"
        for name, entries in declared.items()
        if name not in documented
    ]
    problems += [
        f"{role}: row {row[0]!r} of roles/{role}/README.md names no `variable`"
        for row in rows
        if not LITERAL_RE.search(row[0])
    ]
    problems += [
        f"{role}: `{name}` in roles/{role}/README.md is not declared in {specs} (fix the row or declare it)"
        for name in documented
        if name not in declared
    ]
    if len(header) > 1 and header[1] == "default":
        defaults = yaml.safe_load((REPO / "roles" / role / "defaults" / "main.yml").read_text()) or {}
        for name, cell in documented.items():
            if name not in defaults:
                continue
            why = default_mismatch(cell, defaults[name])
            if why:
                problems.append(
                    f"{role}: `{name}` default in roles/{role}/README.md disagrees with"
                    f" roles/{role}/defaults/main.yml (edit the README row): {why}"
                )
    assert not problems, "\n".join(problems)


def test_the_table_parser_pairs_names_with_defaults():
    rows = [
        ["`a_x` / `a_y`", "`1` / `2`", "m"],
        ["`b_x` / `b_y`", "`f16`", "m"],
        ["`c`", "the release's / `12.8`", "m"],
    ]
    assert _rows_by_name(rows) == {"a_x": "`1`", "a_y": "`2`", "b_x": "`f16`", "b_y": "`f16`", "c": rows[2][1]}
    assert default_mismatch("`on`", "on") is None
    assert default_mismatch('`"0644"`', "0644") is None
    assert default_mismatch("`8080`", 8081)
    assert default_mismatch("`x_tag`", "{{ x_tag | default('') }}") is None
    assert default_mismatch("unset", None) is None
    assert default_mismatch('`""` (all cores)', "") is None
    assert default_mismatch("`auto`: the VRAM", "on")
    assert default_mismatch("`<repo>/<key id>.pub`", "{{ repo_url }}{{ key_id }}.pub") is None
    assert default_mismatch("`<repo>/gpg`", "{{ repo_url }}/key")
