"""Unreachable: one participant cut off from the controller for one prepare, commit or resume."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Iterator, Sequence

from hypothesis import strategies as st

from ckpt_model.errors import CoordinationError
from ckpt_model.model.contract import Attempt
from ckpt_model.properties.network import (
    p19_answered_from_record,
    p19_first_resume,
    p19_only_unreached,
    p19_retry_completes,
    p19_untouched,
)
from ckpt_model.steps import goals
from ckpt_model.steps.families import Family
from ckpt_model.steps.steplog import action
from ckpt_model.trainer.pipeline import PICK, MachineBase, choose


def unreachable_reached(operation: str, retried: bool) -> Callable[[goals.Step], bool]:
    """A call that could not reach one participant, then sent again once it is back (`retried`) or given up by a
    resume; the label names the call (the rule's `operation` argument only picks among those allowed)."""

    def reached(step: goals.Step) -> bool:
        if step.rule != "unreachable":
            return False
        told = [label for label in step.labels if label.startswith(f"{operation}(") and "unreachable" in label]
        return any(("retried" in label) == retried for label in told)

    reached.__doc__ = f"An unreachable {operation}, then {'retried' if retried else 'given up'}."
    return reached


UNREACHABLE = Family(
    "unreachable",
    "a participant the controller cannot reach for one call",
    4,
    goals=tuple(
        goals.Goal(
            f"unreachable_{op}_{outcome}",
            f"an unreachable participant's {op}, {'retried once it is back' if retried else 'given up by a resume'}",
            unreachable_reached(op, retried),
            applies=goals.one_sided(op),
        )
        for op, outcome, retried in (
            ("prepare", "retried", True),
            ("prepare", "given_up", False),
            ("commit", "retried", True),
            ("commit", "given_up", False),
            ("resume", "retried", True),  # a resume is always sent again
        )
    ),
)


class Unreachable(MachineBase):
    """The rules of the unreachable family (`UNREACHABLE`)."""

    @action(
        lambda self: bool(self._one_sided()),
        family=UNREACHABLE,
        judges=("P19",),
        victim=PICK,
        operation=PICK,
        then_retry=st.booleans(),
    )
    def unreachable(self, victim: int, operation: int, then_retry: bool) -> None:
        """One participant is cut off from the controller (its connections refused) while the controller sends a
        prepare, commit or resume; it runs on, untouched (P19). Once it is back, the controller retries the call
        (each participant that took it answers from its record), or, after a prepare or a commit, resumes."""
        name = choose(self.controller.members(), victim).name
        cut_off = choose(self._one_sided(), operation)
        {"prepare": self._unreached_prepare, "commit": self._unreached_commit, "resume": self._unreached_resume}[
            cut_off
        ](name, then_retry)

    def _unreached(
        self, name: str, operation: str, checkpoint_id: str, scope: Sequence[Attempt] = ()
    ) -> CoordinationError:
        """`operation` sent while `name` is cut off; its error, once `name` showed it never saw the call (P19)."""
        before = self.harness.statuses()[name]
        error = self._sent_while_cut_off(name, operation, checkpoint_id, scope)
        published = operation == "commit" and self.audits.has_manifest(checkpoint_id, name)
        p19_untouched(operation, checkpoint_id, name, before, self.harness.statuses()[name], published)
        return error

    def _unreached_prepare(self, name: str, then_retry: bool) -> None:
        model, checkpoint_id = self.model.prepare()
        first = self._unreached(name, "prepare", checkpoint_id)
        label = f"prepare({checkpoint_id}), {name} unreachable"
        if not then_retry:
            # Some participants never saw this prepare: the resume must fence the ID on them too.
            self._prepare_given_up(model, checkpoint_id, label)
            return
        outcome = self._prepare_again(checkpoint_id, lambda error: p19_retry_completes("prepare", checkpoint_id, error))
        p19_answered_from_record("prepare", checkpoint_id, first.replies, outcome.replies)
        self._advance(model, f"{label}; prepare retried once it was back")

    def _unreached_commit(self, name: str, then_retry: bool) -> None:
        self._prepared_first()
        checkpoint_id, scope = self.model.opened, self.model.scope()
        first = self._unreached(name, "commit", checkpoint_id, scope)
        self.audits.partial_commit(self.model, checkpoint_id, sorted(first.replies), first.replies)
        label = f"commit({checkpoint_id}), {name} unreachable"
        if then_retry:
            replies = self._commit_again(
                checkpoint_id, scope, lambda error: p19_retry_completes("commit", checkpoint_id, error)
            )
            p19_answered_from_record("commit", checkpoint_id, first.replies, replies)
            self._advance(self.model.commit()[0], f"{label}; commit retried once it was back")
            return
        self.controller.resume(checkpoint_id)
        self._left_incomplete(checkpoint_id, label)

    def _unreached_resume(self, name: str, _then_retry: bool) -> None:
        """A resume is always retried: short of its lease lapsing, nothing else re-opens the participant."""
        if not self.model.checkpoint_open:
            self.prepare()
        checkpoint_id = self.model.opened
        self._unreached(name, "resume", checkpoint_id)
        replies = self.controller.resume(checkpoint_id)
        p19_first_resume(checkpoint_id, name, replies[name])
        self._refused("prepare", checkpoint_id, "stale_checkpoint")
        label = f"resume({checkpoint_id}), {name} unreachable; resume retried once it was back"
        self._advance(self.model.resume(), f"{label}; prepare({checkpoint_id}) refused")

    @contextlib.contextmanager
    def _cut_off(self, victim: str) -> Iterator[None]:
        """While inside, `victim` is unreachable from the controller: every call to it goes to a loopback port bound
        with nothing listening, so its connection is refused (ECONNREFUSED), as a firewall's reject or a network
        partition refuses it. The victim runs on and still serves its peers; both ends are journaled."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as closed:
            closed.bind(("127.0.0.1", 0))  # bound, never listening: the port stays ours and refuses every connection
            host, port = closed.getsockname()
            invocation = self.controller.invoke("cut off", victim)
            self.controller.complete(invocation, "ok")
            try:
                with self.controller.routed(victim, f"http://{host}:{port}"):
                    yield
            finally:
                healed = self.controller.invoke("reachable", victim)
                self.controller.complete(healed, "ok")

    def _sent_while_cut_off(
        self, victim: str, operation: str, checkpoint_id: str, scope: Sequence[Attempt] = ()
    ) -> CoordinationError:
        """Send `operation` of `checkpoint_id` as the controller does while `victim` is cut off from it; the call's
        error, in which only the victim failed, with its connection refused (P19)."""
        with self._cut_off(victim):
            error = self.controller.unreached(operation, checkpoint_id, scope, self._judge_prepare(checkpoint_id))
        p19_only_unreached(operation, checkpoint_id, victim, error)
        return error
