"""docs/faults.md's catalogue table says what `fakes.faults.CATALOGUE` declares: one row per fault, naming the
server it is planted in, the property that catches it first, and every other property it may show as."""

from __future__ import annotations

import re
from pathlib import Path

from fakes.faults import CATALOGUE

DOC = Path(__file__).resolve().parents[3] / "docs" / "faults.md"
HEADER = "| fault | planted in | caught by | the bug class |"
PROPERTY = re.compile(r"\bP\d+\b")


def catalogue_rows() -> list[list[str]]:
    """The cells of each row of the catalogue table (the first table of the document)."""
    lines = DOC.read_text().splitlines()
    start = lines.index(HEADER) + 2
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def rows_by_fault() -> dict[str, list[str]]:
    rows: dict[str, list[str]] = {}
    for row in catalogue_rows():
        name = re.match(r"`([a-z0-9_]+)`", row[0])
        assert name is not None, f"a row that names no fault: {row}"
        assert name.group(1) not in rows, f"{name.group(1)} has two rows"
        rows[name.group(1)] = row
    return rows


def test_the_table_lists_every_fault_once() -> None:
    assert sorted(rows_by_fault()) == sorted(fault.name for fault in CATALOGUE)


def test_each_row_names_the_server_and_every_property_the_fault_shows_as() -> None:
    rows = rows_by_fault()
    for fault in CATALOGUE:
        _name, server, caught_by, _says = rows[fault.name]
        assert server == fault.server.replace("_", " "), fault.name
        assert PROPERTY.findall(caught_by)[0] == fault.caught_by, fault.name
        assert set(PROPERTY.findall(caught_by)) == set(fault.shows_as), fault.name
