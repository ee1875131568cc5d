"""The capture ledger: per capture key, the token-free rows of the calls token capture staged (reference 7.2).

Everything lives in files under the capture directory, changed under one lock file, so that the several worker
processes of one model server could share it and a crash loses at most the line being written:

    <key>.lineage.jsonl    the rows, one JSON object a line, in staging order
    <key>.lineage.retired  marker of a retired ledger: no manifest, no more rows
    <key>.calls            how many calls were ever admitted for the key, so a model_call_id is never reused

A model_call_id is `<key>.<n>`: deterministic, so the checker's replays print the same IDs, and never reused, so a
dead execution's calls and its replacement's calls tell apart.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from fakes.gym.protocol.errors import RolloutRetiredError
from fakes.gym.protocol.wire import is_valid_name

ROWS_SUFFIX = ".lineage.jsonl"
RETIRED_SUFFIX = ".lineage.retired"
CALLS_SUFFIX = ".calls"
LOCK_NAME = ".ledger.lock"

Row = dict[str, Any]


def model_call_id(capture_key: str, index: int) -> str:
    return f"{capture_key}.{index}"


class FileLedger:
    """Every capture key's ledger under one directory; each method holds the directory's lock while it runs."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    def begin_call(self, key: str) -> tuple[str, list[Row]]:
        """Allocate the next model_call_id of `key` and return it with the ledger's rows as they are now.

        A retired ledger refuses: its attempt is over, and a call of it would stage rows nobody reads."""
        with self._locked():
            self._refuse_retired(key)
            calls = self._path(key, CALLS_SUFFIX)
            index = int(calls.read_text()) if calls.exists() else 0
            _write_atomically(calls, f"{index + 1}\n")
            return model_call_id(key, index), self._read_rows(key)

    def live_rows(self, key: str) -> list[Row]:
        """The rows of a ledger that is not retired (`RolloutRetiredError` otherwise): its manifest."""
        with self._locked():
            self._refuse_retired(key)
            return self._read_rows(key)

    def rows_many(self, keys: Iterable[str]) -> dict[str, list[Row]]:
        with self._locked():
            return {key: self._read_rows(key) for key in keys}

    def append(self, key: str, rows: list[Row]) -> None:
        with self._locked():
            self._refuse_retired(key)
            with self._path(key, ROWS_SUFFIX).open("a") as ledger:
                ledger.write("".join(json.dumps(row) + "\n" for row in rows))

    def replace_many(self, rows_by_key: dict[str, list[Row]], *, recount_calls: bool = False) -> None:
        """Each key's ledger becomes exactly `rows`, live again: a dead execution's rows and marker are gone. The
        call counter stays (`recount_calls`, a planted fault, rebuilds it from the rows installed, so the dead
        execution's undelivered calls' IDs are handed out again)."""
        with self._locked():
            for key, rows in rows_by_key.items():
                _write_atomically(self._path(key, ROWS_SUFFIX), "".join(json.dumps(row) + "\n" for row in rows))
                self._path(key, RETIRED_SUFFIX).unlink(missing_ok=True)
                if recount_calls:
                    _write_atomically(self._path(key, CALLS_SUFFIX), f"{len(rows)}\n")

    def is_retired(self, key: str) -> bool:
        return self._path(key, RETIRED_SUFFIX).exists()

    def retire(self, keys: Iterable[str]) -> None:
        """Mark each ledger retired, with or without rows; the rows stay on disk for nobody."""
        with self._locked():
            for key in keys:
                self._path(key, RETIRED_SUFFIX).touch()

    def delete(self, keys: Iterable[str]) -> None:
        """Remove each ledger and its marker; the call counter stays, so IDs are still never reused."""
        with self._locked():
            for key in keys:
                self._path(key, ROWS_SUFFIX).unlink(missing_ok=True)
                self._path(key, RETIRED_SUFFIX).unlink(missing_ok=True)

    def _refuse_retired(self, key: str) -> None:
        if self.is_retired(key):
            raise RolloutRetiredError(
                f"rollout ledger {key!r} is retired: it has no manifest and takes no more calls; "
                "run a later attempt of the rollout"
            )

    def _read_rows(self, key: str) -> list[Row]:
        try:
            text = self._path(key, ROWS_SUFFIX).read_text()
        except FileNotFoundError:
            return []
        # A line without its newline was cut off by a crash mid-append: that call was never delivered.
        return [json.loads(line) for line in text.split("\n")[:-1]]

    def _path(self, key: str, suffix: str) -> Path:
        # Keys reach here validated as capture keys; this keeps any other name from leaving the directory.
        if not is_valid_name(key):
            raise ValueError(f"ledger key must be a capture key matching [A-Za-z0-9][A-Za-z0-9._-]* (got {key!r})")
        return self.directory / (key + suffix)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """The directory's lock; a fresh descriptor per use, so threads of one process exclude each other too."""
        self.directory.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(self.directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            yield
        finally:
            os.close(descriptor)


def _write_atomically(path: Path, text: str) -> None:
    """Write then rename: a crash leaves the old content or the new, never a torn one."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)
