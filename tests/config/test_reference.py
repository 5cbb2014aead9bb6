"""The generated config reference: current with the schemas, and covering every key of every schema."""

import dataclasses
import typing
from pathlib import Path

from marl_cli.config.reference import (
    EXTRA_SECTIONS,
    REFERENCE_PATH,
    all_keys,
    group_schemas,
    keys,
    reference_text,
    section_text,
    sections,
)
from marl_cli.config.schema import GROUP_SCHEMAS
from marl_cli.plugins import load_builtin

load_builtin()  # the options' schemas
ROOT = Path(__file__).resolve().parents[2]


def schema_keys(schema: type, prefix: str = "") -> set[str]:
    """Every dotted key of ``schema``, walked here independently of the generator."""
    hints = typing.get_type_hints(schema)
    out: set[str] = set()
    for f in dataclasses.fields(schema):
        hint = hints[f.name]
        out |= schema_keys(hint, f"{prefix}{f.name}.") if dataclasses.is_dataclass(hint) else {prefix + f.name}
    return out


def expected_keys() -> dict[str, set[str]]:
    """Section → the keys its schemas declare: each group's generic schema and its options' schemas."""
    out = {group: {f"{group}.{k}" for schema in {GROUP_SCHEMAS[group], *schemas} for k in schema_keys(schema)}
           for group, schemas in group_schemas().items()}
    for section, (schema, prefix, only) in EXTRA_SECTIONS.items():
        out[section] = {prefix + k for k in schema_keys(schema) if not only or k.split(".")[0] in only}
    return out


def test_committed_reference_is_current():
    committed = (ROOT / REFERENCE_PATH).read_text()
    assert committed == reference_text(), "docs/reference/config.md is stale: run `make reference` and commit it"


def test_every_key_of_every_schema_is_covered_with_help():
    expected, text = expected_keys(), reference_text()
    count = sum(len(k) for k in expected.values())
    print(f"config reference: {count} keys in {len(expected)} sections")
    assert count > 200 and set(expected) == set(sections())
    for section, paths in expected.items():
        assert set(all_keys()[section]) == paths
        body = section_text(section)
        for path in paths:
            assert f"| `{path}` |" in body, f"{path} is missing from the reference's {section} section"
    assert text.count("| `") >= count
    no_help = [f"{s}: {k.path}" for s, (schema, _, only) in EXTRA_SECTIONS.items()
               for k in keys(schema, only=only) if not k.help]
    no_help += [f"{g}: {k.path}" for g, schemas in group_schemas().items() for s in schemas for k in keys(s)
                if not k.help]
    assert not no_help, f"schema fields without a help comment: {no_help}"


def test_reference_states_types_defaults_bounds_and_choices():
    trainer = section_text("trainer")
    assert "| `trainer.learning_rate` | float | `1e-05` | > 0 |" in trainer
    assert "{grpo, dr_grpo, dapo, bnpo, cispo, sapo, luspo, vespo}" in trainer
    algorithm = section_text("algorithm")
    # one table per algorithm's schema, each key with the meaning that algorithm gives it
    assert "### `algorithm=at_grpo`\n\nSchema `ATGRPOConfig`" in algorithm
    assert "| `algorithm.mode` | {independent, tree} | `tree` |" in algorithm
    assert "| `algorithm.gamma` | float | `0.95` | ≥ 0, ≤ 1 | the discount per TD step" in algorithm
    assert "| `algorithm.gamma` | float | `1.0` | ≥ 0, ≤ 1 | the discount per completion token" in algorithm
    assert "| `algorithm.gamma` | float | `0.99` | ≥ 0, ≤ 1 | the discount per link of the acting order" in algorithm
    assert "| key | type | `marft` | `ppo` | bounds | help |" not in algorithm
    assert "`rollout.vllm.gpu_memory_utilization` | float | `0.3` | `0.3` | > 0, ≤ 1 |" in section_text("rollout")
    assert "| `model.name_or_path` | str or null | `${marl_required:" in section_text("model")
