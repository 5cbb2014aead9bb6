"""The config reference, generated from the schemas: every group's options and every key with its type,
default (per option), bounds and help.

The help of a key is the comment on its schema field's line, or the comment lines right above it (the
first class along the MRO that has one); bounds come from ``bounded(...)`` metadata and choices from
``StrEnum`` types. ``python -m marl_cli.cli.reference`` (``make reference``) writes
``docs/reference/config.md``; ``marl train --help <section>`` prints one section of the same text.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import inspect
import io
import json
import textwrap
import tokenize
import typing
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from omegaconf import MISSING, DictConfig, OmegaConf

from marl_cli.config.paths import config_dir
from marl_cli.config.registry import registries
from marl_cli.config.schema import (
    GROUP_SCHEMAS,
    EvalSchema,
    ReportConfig,
    ReportSchema,
    SandboxConfig,
    TrainSchema,
)

REFERENCE_PATH = Path("docs/reference/config.md")
"""Where ``make reference`` writes the reference, relative to the repository root."""
TOP_LEVEL = ("name", "seed", "device", "threads", "progress")
"""``TrainSchema``'s own keys (not in any group)."""
SECTIONS: dict[str, str] = {
    "sandbox": "Isolation and limits for model-written code (`sandbox.*`, not a group: set keys directly).",
    "report": "Where `marl report` files a run (`report.*`, not a group; experiment files set it).",
    "run": "Top-level keys of `marl train` and `marl eval` (`name`, `seed`, ...).",
    "eval": ("How held-out tasks are played (`eval.*`: by a training run's evaluations and by `marl eval`), and "
             "what `marl eval` loads (`load`)."),
    "marl-report": "The keys of `marl report` (`conf/report.yaml`), set as `key=value` after `marl report`.",
}
"""The sections beside the groups, with what each is."""
HEADER = """# Config reference

<!-- Generated from marl_cli/config/schema.py by `make reference`; do not edit by hand. -->

Every config group, its options and every key, generated from the typed schemas. A key is set on the
command line as `group.key=value` (`trainer.learning_rate=5e-5`); an option is picked with
`group=option` (`env=sudoku`). The same text for one section: `marl train --help <section>`
(`marl train --help trainer`). Types in braces take exactly one of the values listed; a default of
`${...}` is an interpolation resolved at composition; *required* means the value must be given.
"""


@dataclasses.dataclass(frozen=True)
class Key:
    """One key of a schema: its dotted path and what the reference says about it."""

    path: str
    type: str
    bounds: str
    help: str


@cache
def _comments(cls: type) -> dict[str, str]:
    """Field name → its comment in ``cls``'s own source (trailing, else the comment lines right above)."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    lines = source.splitlines()
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    notes = {tok.start[0]: tok.string.lstrip("#").strip() for tok in tokens if tok.type == tokenize.COMMENT}
    out: dict[str, str] = {}
    for number, line in enumerate(lines, start=1):
        name = line.strip().split(":", 1)[0]
        if not line.startswith("    ") or line.startswith("     ") or not name.isidentifier():
            continue
        if number in notes and not line.strip().startswith("#"):
            out[name] = notes[number]
            continue
        above = []
        while number - 1 in notes and lines[number - 2].strip().startswith("#"):
            number -= 1
            above.insert(0, notes[number])
        if above:
            out[name] = " ".join(above)
    return out


def field_help(cls: type, name: str) -> str:
    """The help of field ``name``: the first comment along ``cls``'s MRO, else a nested schema's docstring."""
    for klass in cls.__mro__:
        if name in inspect.get_annotations(klass) and _comments(klass).get(name):
            return _comments(klass)[name]
    hint = typing.get_type_hints(cls).get(name)
    return inspect.getdoc(hint) or "" if dataclasses.is_dataclass(hint) else ""


def type_name(hint: Any) -> str:
    """A readable type: ``{a, b}`` for a choice, ``X or null`` for an optional one."""
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return "{" + ", ".join(m.value for m in hint) + "}"
    args = typing.get_args(hint)
    if type(None) in args and len(args) == 2:
        return f"{type_name(next(a for a in args if a is not type(None)))} or null"
    if isinstance(hint, type) and not args:
        return hint.__name__
    return str(hint).replace("typing.", "")


def bounds(metadata: Any) -> str:
    """``bounded(...)``'s limits as text (``≥ 1``, ``> 0, ≤ 1``); empty when the field has none."""
    signs = {"ge": "≥", "gt": ">", "le": "≤"}
    return ", ".join(f"{sign} {metadata[k]:g}" for k, sign in signs.items() if metadata.get(k) is not None)


def keys(schema: type, prefix: str = "", only: tuple[str, ...] = ()) -> list[Key]:
    """Every key of ``schema`` (or only the fields named in ``only``), nested schemas flattened to dotted paths."""
    hints = typing.get_type_hints(schema)
    out = []
    for f in dataclasses.fields(schema):
        if only and f.name not in only:
            continue
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            out += keys(hint, f"{prefix}{f.name}.")
        else:
            out.append(Key(f"{prefix}{f.name}", type_name(hint), bounds(f.metadata), field_help(schema, f.name)))
    return out


EXTRA_SECTIONS: dict[str, tuple[type, str, tuple[str, ...]]] = {
    "sandbox": (SandboxConfig, "sandbox.", ()),
    "report": (ReportConfig, "report.", ()),
    "run": (TrainSchema, "", TOP_LEVEL),
    "eval": (EvalSchema, "", ("eval", "load")),
    "marl-report": (ReportSchema, "", ()),
}
"""Section → (schema, key prefix, the fields it covers; empty: all)."""


def registered_schemas() -> dict[tuple[str, str], type]:
    """(group, ``base_<name>``) → schema: each group's generic schema and every loaded plug-in's (load the
    built-in ones first: ``marl_cli.plugins.load_builtin``)."""
    table = {(group, f"base_{group}"): schema for group, schema in GROUP_SCHEMAS.items()}
    for registry in registries():
        if registry.group:
            table.update({(registry.group, f"base_{name}"): s for name, s in registry.schemas.items()})
    return table


def load_option(group: str, name: str, root: Path) -> tuple[type, DictConfig]:
    """An option's schema and its config: its defaults list (schemas, other options) merged with its body."""
    body = yaml.safe_load((root / group / f"{name}.yaml").read_text()) or {}
    entries = body.pop("defaults", None) or ["_self_"]
    schema: type | None = None
    cfg = OmegaConf.create({})
    for entry in [*entries, *([] if "_self_" in entries else ["_self_"])]:
        if entry == "_self_":
            cfg = OmegaConf.merge(cfg, body)
        elif (group, entry) in registered_schemas():
            schema = registered_schemas()[group, entry]
            cfg = OmegaConf.merge(cfg, OmegaConf.structured(schema))
        else:
            schema, inner = load_option(group, entry, root)
            cfg = OmegaConf.merge(cfg, inner)
    if schema is None:
        raise ValueError(f"{group}/{name}.yaml names no schema (base_<name>) in its defaults list")
    return schema, cfg


def group_options(group: str, root: Path) -> dict[type, dict[str, dict[str, Any]]]:
    """Schema → {option: its values} for every option of ``group`` under ``root``, in file name order."""
    out: dict[type, dict[str, dict[str, Any]]] = {}
    for path in sorted((root / group).glob("*.yaml")):
        schema, cfg = load_option(group, path.stem, root)
        out.setdefault(schema, {})[path.stem] = OmegaConf.to_container(cfg, resolve=False, enum_to_str=True)
    return out


def group_schemas(root: Path | None = None) -> dict[str, list[type]]:
    """Group → the schemas its options use."""
    root = root or config_dir()
    return {group: list(group_options(group, root)) for group in GROUP_SCHEMAS}


def all_keys() -> dict[str, list[str]]:
    """Section → every key the reference covers (the generic schema's and every option's schema's)."""
    out = {group: sorted({f"{group}.{k.path}" for schema in [GROUP_SCHEMAS[group], *schemas] for k in keys(schema)})
           for group, schemas in group_schemas().items()}
    for section, (schema, prefix, only) in EXTRA_SECTIONS.items():
        out[section] = [prefix + k.path for k in keys(schema, only=only)]
    return out


def value_text(values: Any, path: str) -> str:
    """The default at ``path`` in ``values`` (an option's config as plain data), as the table shows it."""
    for part in path.split("."):
        values = values.get(part, MISSING) if isinstance(values, dict) else MISSING
    if isinstance(values, str) and values == MISSING:
        return "*required*"
    if isinstance(values, str) and values and values == values.strip() and "\n" not in values:
        return f"`{values}`"
    return f"`{json.dumps(values, ensure_ascii=False)}`"


def markdown(text: str) -> str:
    """``text`` with ``<`` escaped outside code spans (Markdown would read ``<name>`` as an HTML tag)."""
    return "`".join(p if i % 2 else p.replace("<", "&lt;") for i, p in enumerate(text.split("`")))


def cell(text: str) -> str:
    """``text`` safe inside a Markdown table cell."""
    return markdown(text.replace("|", "\\|").replace("\n", " "))


def table(prefix: str, schema: type, columns: dict[str, dict[str, Any]], only: tuple[str, ...] = ()) -> list[str]:
    """A Markdown table of ``schema``'s keys: type, the default under each of ``columns``, bounds, help."""
    names = list(columns) if len(columns) > 1 else ["default"]
    lines = ["| key | type | " + " | ".join(f"`{n}`" if len(columns) > 1 else n for n in names)
             + " | bounds | help |", "|---|---|" + "---|" * len(names) + "---|---|"]
    for key in keys(schema, only=only):
        defaults = [cell(value_text(values, key.path)) for values in columns.values()]
        lines.append(f"| `{prefix}{key.path}` | {cell(key.type)} | " + " | ".join(defaults)
                     + f" | {cell(key.bounds)} | {cell(key.help)} |")
    return lines


def option_note(root: Path, group: str, option: str) -> str:
    """The comment block at the top of an option's YAML file (what the option is), on one line."""
    note = []
    for line in (root / group / f"{option}.yaml").read_text().splitlines():
        if not line.startswith("#"):
            break
        note.append(line.lstrip("#").strip())
    return " ".join(note)


def group_section(group: str, root: Path) -> list[str]:
    """The reference of one group: its options, then one table per schema its options use."""
    lines = [f"## {group}", "", inspect.getdoc(GROUP_SCHEMAS[group]) or "", "",
             f"Options (`{group}=<option>`):", ""]
    by_schema = group_options(group, root)
    lines += [markdown(f"- `{option}`: {option_note(root, group, option)}".rstrip(": "))
              for options in by_schema.values() for option in options]
    for schema, columns in by_schema.items():
        lines += ["", f"### {', '.join(f'`{group}={o}`' for o in columns)}", "",
                  f"Schema `{schema.__name__}`: {inspect.getdoc(schema) or ''}".strip(), "",
                  *table(f"{group}.", schema, columns)]
    return lines


def extra_section(section: str) -> list[str]:
    """The reference of a section that is not a group (one schema, its own defaults)."""
    schema, prefix, only = EXTRA_SECTIONS[section]
    values = OmegaConf.to_container(OmegaConf.structured(schema), resolve=False, enum_to_str=True)
    return [f"## {section}", "", SECTIONS[section], "", *table(prefix, schema, {"default": values}, only)]


def section_text(section: str, root: Path | None = None) -> str:
    """One section of the reference (a group, or one of ``SECTIONS``); ``KeyError`` for an unknown name."""
    if section in GROUP_SCHEMAS:
        return "\n".join(group_section(section, root or config_dir())) + "\n"
    if section in EXTRA_SECTIONS:
        return "\n".join(extra_section(section)) + "\n"
    raise KeyError(section)


def sections() -> list[str]:
    """Every section's name, in the reference's order."""
    return [*GROUP_SCHEMAS, *EXTRA_SECTIONS]


def reference_text(root: Path | None = None) -> str:
    """The whole reference (``docs/reference/config.md``)."""
    return "\n".join([HEADER, *(section_text(s, root) for s in sections())])


def main(argv: list[str] | None = None) -> None:
    """Write the reference (default: the docs' file); ``python -m marl_cli.cli.reference [--out PATH]`` loads the
    built-in plug-ins and runs this."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REFERENCE_PATH)
    out = parser.parse_args(argv).out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(reference_text())
    print(f"wrote {out}: {sum(len(k) for k in all_keys().values())} keys in {len(sections())} sections")

