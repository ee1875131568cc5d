"""The gate role: the gated backend, where nothing a model call does happens until the checker releases it.

Gym's fake backend's control routes (reference section 11): the call list, release chosen calls, reset, gate every
call, pin the policy's script; with token capture also the token store (`staged`), the cut rounds (`cuts`) and a
hung cut endpoint (`stall_cuts`). `BackendGate` speaks them over HTTP; the harness holds one as `harness.backend`
(None: the deployment has no gated backend, and the machine runs only the rules that need none).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import httpx

from ckpt_model.protocol.get_round import GetRound
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

    def _post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        response = self._http.post(self.url + path, json=body or {})
        response.raise_for_status()
        return response.json()

    def calls(self) -> list[dict[str, Any]]:
        url = self.url + "/_ctl/calls"
        answers = self._calls_round.get_all([url], {}) if self._calls_round is not None else None
        answer = answers[0] if answers is not None else self._http.get(url)
        if isinstance(answer, Exception):
            raise httpx.TransportError(f"GET {url}: {type(answer).__name__}: {answer}") from answer
        answer.raise_for_status()
        return answer.json()

    def gate(self) -> None:
        self._post("/_ctl/gate")

    def reset(self) -> None:
        self._post("/_ctl/reset")

    def release(self, indices: list[int]) -> Any:
        return self._post("/_ctl/step", {"indices": indices})

    def script(self, tool_calls: Sequence[Mapping[str, Any]]) -> Any:
        """Pin the policy's tool calls, so the checker knows what an uninterrupted episode earns (P3)."""
        return self._post("/_ctl/script", {"tool_calls": [dict(call) for call in tool_calls]})

    def staged(self) -> dict[str, Any]:
        """The token store: staging key -> the tokens and lineage the trainer reads (P5, P12)."""
        response = self._http.get(self.url + "/_ctl/staged")
        response.raise_for_status()
        return response.json()

    def cuts(self) -> list[list[str]]:
        """Every generation-cut round the backend answered: the model call IDs it cut durably in each."""
        response = self._http.get(self.url + "/_ctl/cuts")
        response.raise_for_status()
        return response.json()

    def stall_cuts(self, stall: bool) -> Any:
        """While on, a cut request hangs until its sender gives up (a hung cut must not eat a prepare)."""
        return self._post("/_ctl/cut_stall", {"stall": stall})

    def hanging_cuts(self) -> int:
        """How many cut requests hang at the stalled endpoint now (each ends when its sender gives up)."""
        response = self._http.get(self.url + "/_ctl/cut_stall")
        response.raise_for_status()
        return BackendCutStallWire.model_validate_json(response.content).hanging
