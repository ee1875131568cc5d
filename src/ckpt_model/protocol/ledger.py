"""The checker's own reader of the policy model server's capture ledgers (token capture's control routes).

Wire-compatible with Gym's token-capture control routes (reference 7.2), which use their own bearer token
(`NEMO_GYM_TOKEN_CAPTURE_CONTROL_TOKEN`), not the checkpoint control token:

- `GET /training-token-capture/control/rollouts/<capture_key>/manifest`: the ledger's rows in order (`records`,
  each with `model_call_id`, `parent_call_id`, `staging_key`), or 410 with a `detail` saying it "is retired"
  (read at the top level, as FastAPI writes it, or in the control plane's error envelope);
- `POST /training-token-capture/control/rollouts/retire` and `.../delete` with `{"rollout_ids": [...]}`, refused
  while a checkpoint is open on that model server.

Replies come back as small typed values, so P5 compares what the ledger says with what the checker predicts
without re-reading JSON; anything else off the wire is a `ProtocolError` naming the route.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import attrs
import httpx

from ckpt_model.errors import ProtocolError
from ckpt_model.protocol.http import control_call

CAPTURE_ROUTE_PREFIX = "/training-token-capture/control/rollouts"
RETIRED_STATUS = 410
RETIRED_DETAIL = "is retired"


@attrs.frozen
class LedgerRow:
    """One row of a capture ledger: a delivered (or at least returned) model call and the call it continues."""

    model_call_id: str
    parent_call_id: str | None
    staging_key: str | None = None
    capture_key: str | None = None


@attrs.frozen
class Manifest:
    """A live ledger: its rows in order, and the failures it recorded."""

    rows: tuple[LedgerRow, ...]
    failures: tuple[Any, ...] = ()
    # The capture key the manifest says it answers for (`rollout_id`; None when it names none).
    answered_for: str | None = None

    @property
    def model_call_ids(self) -> tuple[str, ...]:
        return tuple(row.model_call_id for row in self.rows)


@attrs.frozen
class RetiredLedger:
    """A retired ledger: the manifest route answered 410 "is retired"."""

    detail: str


@attrs.frozen
class Refusal:
    """A ledger retire or delete the model server refused (status and the envelope's text)."""

    status: int
    text: str


def row_from_wire(row: Any, where: str) -> LedgerRow:
    if not isinstance(row, dict) or not isinstance(row.get("model_call_id"), str):
        raise ProtocolError(
            source=where, problems=["a ledger row must be an object with a string 'model_call_id'"], reply=row
        )
    parent = row.get("parent_call_id")
    if parent is not None and not isinstance(parent, str):
        raise ProtocolError(source=where, problems=["'parent_call_id' must be a string or null"], reply=row)
    return LedgerRow(row["model_call_id"], parent, row.get("staging_key"), row.get("capture_key"))


class LedgerClient:
    """Reads and retires the capture ledgers of one policy model server."""

    def __init__(self, url: str, token: str, http: httpx.Client) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.http = http

    def manifest(self, capture_key: str) -> Manifest | RetiredLedger:
        where = f"GET {CAPTURE_ROUTE_PREFIX}/{capture_key}/manifest on {self.url}"
        with control_call(f"reading the capture ledger of {capture_key}"):
            response = self.http.get(
                f"{self.url}{CAPTURE_ROUTE_PREFIX}/{quote(capture_key, safe='')}/manifest", headers=self._headers()
            )
        body = _json(response, where)
        if response.status_code == RETIRED_STATUS:
            detail = _detail(body)
            if RETIRED_DETAIL not in detail:
                raise ProtocolError(
                    source=where, problems=[f"410 without '{RETIRED_DETAIL}' in its detail"], reply=body
                )
            return RetiredLedger(detail)
        if response.status_code != httpx.codes.OK or not isinstance(body, dict):
            raise ProtocolError(source=where, problems=[f"HTTP {response.status_code}"], reply=response.text[:300])
        records = body.get("records")
        if not isinstance(records, list):
            raise ProtocolError(source=where, problems=["'records' must be a list"], reply=body)
        failures = body.get("failures") or []
        rows = tuple(row_from_wire(row, where) for row in records)
        return Manifest(rows, tuple(failures), body.get("rollout_id"))

    def retire(self, capture_keys: Sequence[str]) -> Any:
        """Retire the ledgers (a marker stays; later rows are refused); a `Refusal` if the server refused."""
        return self._post("retire", capture_keys)

    def delete(self, capture_keys: Sequence[str]) -> Any:
        return self._post("delete", capture_keys)

    def _post(self, operation: str, capture_keys: Sequence[str]) -> Any:
        where = f"POST {CAPTURE_ROUTE_PREFIX}/{operation} on {self.url}"
        with control_call(f"asking the policy model to {operation} the capture ledgers of {list(capture_keys)}"):
            response = self.http.post(
                f"{self.url}{CAPTURE_ROUTE_PREFIX}/{operation}",
                json={"rollout_ids": list(capture_keys)},
                headers=self._headers(),
            )
        body = _json(response, where)
        if response.status_code != httpx.codes.OK:
            return Refusal(response.status_code, _detail(body) or response.text)
        return body

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


def _detail(body: Any) -> str:
    """The text of a refusal: FastAPI's top-level `detail`, or the control plane's `{"error": {"detail"}}`."""
    if not isinstance(body, dict):
        return ""
    error = body.get("error")
    return str(body.get("detail") or (error.get("detail") if isinstance(error, dict) else "") or "")


def _json(response: httpx.Response, where: str) -> Any:
    try:
        return response.json()
    except ValueError:
        raise ProtocolError(
            source=where, problems=[f"HTTP {response.status_code}: not JSON"], reply=response.text[:300]
        ) from None
