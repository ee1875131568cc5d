"""The gate role: the gated backend, where nothing a model call does happens until the checker releases it.

Gym's fake backend's control routes (reference section 11): the call list, release chosen calls, reset, gate every
call, pin the policy's script; with token capture also the token store (`staged`), the cut rounds (`cuts`) and a
hung cut endpoint (`stall_cuts`). `BackendGate` speaks them over HTTP; the harness holds one as `harness.backend`
(None: the deployment has no gated backend, and the machine runs only the rules that need none). A route that fails
is a `ControlCallFailed` naming it (`ckpt_model.protocol.http.control_call`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import httpx

from ckpt_model.protocol.get_round import GetRound
from ckpt_model.protocol.http import checked_json, control_call
from ckpt_model.protocol.wire import BackendCutStallWire


class Gate(Protocol):
    """The gated backend: nothing a model call does happens until the checker releases it."""

    def calls(self) -> list[dict[str, Any]]: ...

    def release(self, indices: list[int]) -> Any: ...

    def reset(self) -> None: ...

    def gate(self) -> None: ...

    def script(self, tool_calls: Sequence[Mapping[str, Any]]) -> Any: ...

    def staged(self) -> dict[str, Any]: ...

    def cuts(self) -> list[list[str]]: ...

    def stall_cuts(self, stall: bool) -> Any: ...

    def hanging_cuts(self) -> int: ...


class BackendGate:
    """Gym's fake backend's control routes over HTTP: gate, release chosen calls, call list, reset, script."""

    def __init__(self, url: str, http: httpx.Client, calls_round: GetRound | None = None) -> None:
        self.url = url
        self._http = http
        # The settle polls the call list several times a step: over a kept-alive connection of its own where given.
        self._calls_round = calls_round if calls_round is not None and GetRound.serves(url) else None

    def _post(self, path: str, body: dict[str, Any] | None, doing: str) -> Any:
        with control_call(doing):
            return checked_json(self._http.post(self.url + path, json=body or {}))

    def _get(self, path: str, doing: str) -> Any:
        with control_call(doing):
            return checked_json(self._http.get(self.url + path))

    def calls(self) -> list[dict[str, Any]]:
        url = self.url + "/_ctl/calls"
        with control_call("reading the backend's calls"):
            answers = self._calls_round.get_all([url], {}) if self._calls_round is not None else None
            answer = answers[0] if answers is not None else self._http.get(url)
            if isinstance(answer, Exception):
                raise httpx.TransportError(f"{type(answer).__name__}: {answer}", request=httpx.Request("GET", url))
            return checked_json(answer)

    def gate(self) -> None:
        self._post("/_ctl/gate", None, "gating every model call of the backend")

    def reset(self) -> None:
        self._post("/_ctl/reset", None, "resetting the backend for a new example")

    def release(self, indices: list[int]) -> Any:
        return self._post("/_ctl/step", {"indices": indices}, f"releasing the backend's calls {indices}")

    def script(self, tool_calls: Sequence[Mapping[str, Any]]) -> Any:
        """Pin the policy's tool calls, so the checker knows what an uninterrupted episode earns (P3)."""
        body = {"tool_calls": [dict(call) for call in tool_calls]}
        return self._post("/_ctl/script", body, "pinning the policy's script on the backend")

    def staged(self) -> dict[str, Any]:
        """The token store: staging key -> the tokens and lineage the trainer reads (P5, P12)."""
        return dict(self._get("/_ctl/staged", "reading the backend's token store"))

    def cuts(self) -> list[list[str]]:
        """Every generation-cut round the backend answered: the model call IDs it cut durably in each."""
        return list(self._get("/_ctl/cuts", "reading the backend's generation-cut rounds"))

    def stall_cuts(self, stall: bool) -> Any:
        """While on, a cut request hangs until its sender gives up (a hung cut must not eat a prepare)."""
        doing = "stalling the backend's cut endpoint" if stall else "letting the backend's cut endpoint answer"
        return self._post("/_ctl/cut_stall", {"stall": stall}, doing)

    def hanging_cuts(self) -> int:
        """How many cut requests hang at the stalled endpoint now (each ends when its sender gives up)."""
        reply = self._get("/_ctl/cut_stall", "reading the cut requests hanging at the backend")
        return BackendCutStallWire.model_validate(reply).hanging
