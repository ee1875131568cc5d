"""Calls straight to a callee for a retired attempt, as a late or confused caller sends them.

Work normally reaches a callee through its caller: a tool call through the agent, a generation call through the
agent's loop. A caller that is late (its request sat in a queue across the retire) or confused (it kept an old
attempt's key) sends them on its own, so each callee's own refusal is what stands between a retired attempt and
the live state (reference section 10: "callers before callees ... the mark catches it"). Every call uses Gym's own
routes with its `/ng-rollout/<capture key>` prefix (sections 7.1 and 8.2), so it works against a real Gym too;
each is journaled in the history under the attempt's key.

A generation call the policy model wrongly admits would wait at the gated backend: the checker polls until the
call is answered or the backend logged it, and releases a logged one so nothing is left waiting; its reply then
shows it was served.
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

from ckpt_model.deployments.harness import Harness
from ckpt_model.deployments.observe import backend_calls, poll
from ckpt_model.errors import QuiescenceTimeout
from ckpt_model.model.contract import Attempt
from ckpt_model.protocol.client import Participant
from ckpt_model.protocol.history import History
from ckpt_model.trainer.runs import RunOutcome, RunPool, journaled_post

ROLLOUT_PREFIX = "/ng-rollout"
# Gym's generation route the policy model gates (section 7.1; the look-alike serves the chat form).
GENERATION_ROUTE = "/v1/chat/completions"
GENERATION_BODY = {"model": "policy", "messages": [{"role": "user", "content": "a late call of a retired attempt"}]}
# The resources server's verification route, and the body of a verify with nothing to judge.
VERIFY_ROUTE = "/verify"
VERIFY_BODY: dict[str, Any] = {"response": {}}


class Callees:
    """Sends the calls, journaled; `runs` runs a generation call in the background while the checker watches."""

    def __init__(self, harness: Harness, history: History, runs: RunPool, timeout_s: float) -> None:
        self.harness = harness
        self.history = history
        self.runs = runs
        self.timeout_s = timeout_s

    def resources_calls(
        self, attempt: Attempt, members: list[Participant], tool: Mapping[str, Any]
    ) -> dict[str, RunOutcome]:
        """A tool call (the script's `tool`: its name and arguments) and a verify for `attempt`, straight to each
        resources server of `members`; each answer by `<server> <route>`."""
        outcomes = {}
        for member in members:
            for route, body in ((f"/{tool['name']}", tool["arguments"]), (VERIFY_ROUTE, VERIFY_BODY)):
                outcomes[f"{member.name} {route}"] = self._post(attempt, member, route, body)
        return outcomes

    def generation_calls(self, attempt: Attempt, members: list[Participant]) -> dict[str, RunOutcome]:
        """A generation call for `attempt` straight to each policy model of `members` (a deployment without a
        gated backend sends none: a call it admitted would reach a real model)."""
        if self.harness.backend is None:
            return {}
        return {f"{member.name} {GENERATION_ROUTE}": self._generation_call(attempt, member) for member in members}

    def _generation_call(self, attempt: Attempt, member: Participant) -> RunOutcome:
        """One generation call, answered or, admitted, released at the backend and then answered."""
        gate = self.harness.backend
        assert gate is not None, "only a gated backend shows an admitted call"
        made = len(backend_calls(self.harness)[0].get(attempt.key, ()))
        answer: Future[RunOutcome] = self.runs.submit(self._post, attempt, member, GENERATION_ROUTE, GENERATION_BODY)

        def logged() -> bool:
            return len(backend_calls(self.harness)[0].get(attempt.key, ())) > made

        if not poll(lambda: answer.done() or logged(), self.timeout_s):
            raise QuiescenceTimeout(
                prediction=f"{member.name} answers a generation call of {attempt.key}, or admits it",
                observed="neither",
                pending=[f"{member.name} {GENERATION_ROUTE} of {attempt.key}"],
                timeout_s=self.timeout_s,
            )
        if not answer.done():  # admitted, and waiting at the backend: let it go so it ends
            gate.release([backend_calls(self.harness)[1][attempt.key]])
        return answer.result(timeout=self.timeout_s)

    def _post(self, attempt: Attempt, member: Participant, route: str, body: Mapping[str, Any]) -> RunOutcome:
        invocation = self.history.invoke(attempt.key, "callee", f"{member.name} {route}")
        url = f"{member.url}{ROLLOUT_PREFIX}/{attempt.key}{route}"
        return journaled_post(
            self.history, invocation, lambda: self.harness.run_http.post(url, json=dict(body), timeout=self.timeout_s)
        )
