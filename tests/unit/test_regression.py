"""Regression files are data: a malformed one is refused with a message that says what is wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckpt_model import regression


def test_a_file_that_is_not_json_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not a readable regression file"):
        regression.load(path)


@pytest.mark.parametrize(
    ("document", "problem"),
    [
        ({"format": 99, "steps": []}, "'format' must be 1"),
        ({"format": 1, "steps": [["dispatch"]]}, "'steps' must be a list"),
        ({"format": 1, "steps": [[1, {}]]}, "'steps' must be a list"),
    ],
)
def test_a_malformed_document_is_refused(tmp_path: Path, document: dict, problem: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(document))
    with pytest.raises(ValueError, match=problem):
        regression.load(path)


def test_describe_prints_the_steps_as_calls() -> None:
    steps = [["dispatch", {}], ["release", {"pick": 0}]]
    document = {"topology": "native", "faults": ["model_delivers_held"], "steps": steps}
    assert regression.describe(document) == "native with model_delivers_held: dispatch(); release(pick=0)"
