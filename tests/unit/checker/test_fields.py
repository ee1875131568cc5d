"""The field table (`ckpt_model.protocol.fields`) against the wire schema, the checks it names, and docs/fields.md: a
field added to a reply model cannot go unlisted, a check the table names exists, and the docs say what the table
says."""

from __future__ import annotations

import importlib
import json
import pkgutil
from pathlib import Path
from typing import Any

import pytest

from ckpt_model import properties
from ckpt_model.model import lineage
from ckpt_model.protocol import fields, wire
from ckpt_model.protocol.fields import Compared, NotCompared
from ckpt_model.trainer import placement

ROOT = Path(__file__).parents[3]
GOLDEN = ROOT / "tests" / "contract" / "golden"


@pytest.mark.parametrize("name", sorted(fields.FIELDS))
def test_every_schema_field_is_listed_and_no_other(name: str) -> None:
    body = fields.FIELDS[name]
    assert sorted(body.fields) == sorted(fields.schema_fields(body.model))


def test_every_count_key_of_every_kind_is_listed() -> None:
    assert {kind: tuple(keys) for kind, keys in fields.COUNTS.items()} == wire.REPORT_COUNT_KEYS


def _checks() -> list[str]:
    verdicts = [v for body in fields.FIELDS.values() for v in body.fields.values()]
    verdicts += [v for keys in fields.COUNTS.values() for v in keys.values()]
    return sorted({v.check for v in verdicts if isinstance(v, Compared)} | set(fields.IDENTIFIERS.values()))


# Where a named check may live: a family module of the properties, the lineage, or the harness's placement check.
CHECK_MODULES = [
    *(
        importlib.import_module(f"{properties.__name__}.{module.name}")
        for module in pkgutil.iter_modules(properties.__path__)
    ),
    lineage,
    placement,
]


@pytest.mark.parametrize("check", _checks())
def test_every_named_check_is_a_check_of_the_properties(check: str) -> None:
    functions = [getattr(module, check) for module in CHECK_MODULES if callable(getattr(module, check, None))]
    assert functions, f"{check} is in none of the properties' modules, lineage.py and placement.py"


def test_every_reason_says_something() -> None:
    for body in fields.FIELDS.values():
        for field, verdict in body.fields.items():
            assert not isinstance(verdict, NotCompared) or len(verdict.reason) > 8, field


def test_the_docs_are_the_rendered_table() -> None:
    """`python -m ckpt_model.protocol.fields > docs/fields.md` regenerates it."""
    assert (ROOT / "docs" / "fields.md").read_text() == fields.render()


def test_the_counts_add_up() -> None:
    compared, not_compared = fields.counts()
    total = sum(len(body.fields) for body in fields.FIELDS.values()) + sum(map(len, fields.COUNTS.values()))
    assert (compared + not_compared, compared > 0, not_compared > 0) == (total, True, True)


def _golden_replies() -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = json.loads((GOLDEN / "replies-valid.json").read_text())["cases"]
    return cases


@pytest.mark.parametrize("case", _golden_replies(), ids=lambda case: case["name"])
def test_every_golden_reply_fits_its_reply_model(case: dict[str, Any]) -> None:
    """The reply models forbid extras: a golden body with a field they lack would be a field nobody listed."""
    fields.FIELDS[case["operation"]].model.model_validate(case["reply"])


def test_a_reply_with_an_unlisted_field_does_not_fit() -> None:
    with pytest.raises(ValueError, match="new_field"):
        wire.RetireReply.model_validate({"retired": [], "new_field": 1})


def test_schema_fields_walks_nested_models_lists_and_optionals() -> None:
    paths = list(fields.schema_fields(wire.LedgerManifestReply))
    assert paths == [
        "rollout_id",
        "records",
        "records[].model_call_id",
        "records[].parent_call_id",
        "records[].staging_key",
        "records[].capture_key",
        "failures",
    ]
    assert "admission.rollout_id" in set(fields.schema_fields(wire.BackendCallWire))
