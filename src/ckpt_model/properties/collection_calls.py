"""The servers' properties on the calls a collection run makes: every control call and `/run` the program sends goes
through the checker's relay (`ckpt_model.collection.relay`), which journals it, and each reply is judged as the trainer
machine judges its own, by the same named checks, with what the request asked for in place of the model:

- commit: the reply says `committed` (P10); the participant's directory, read with the checker's reader when the
  reply came (before the program could prune it), verifies against the checkpoint (P9); the reply's `episode_ids`
  are the records on disk and lie in the commit's scope, beside restarts the participant reported at prepare (P1);
  the reply's manifest is the one written (P15);
- restore: `restored` (P10), naming as source the checkpoint the directory holds (P15), and the environment and the
  agent name the next attempts of their in-scope records (P15);
- resume: `idle` (P10); retire and forget echo what they were asked (P15);
- `/run`: a 200 carries the reward an uninterrupted run earns (P3);
- across calls: no `/run` reply from the moment every participant answered `prepared` for a checkpoint until the
  program's next resume or restore, or a crash of the Gym (P2).

Replies that are not 200 are the program's to handle (a refusal is how a server says no); the collection
properties (P22-P25) judge what the program made of them.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ckpt_model.errors import HarnessError
from ckpt_model.model.lineage import next_key
from ckpt_model.properties.continuation import p2_no_reply_within, p3_reply_complete, p3_run_reply_shape
from ckpt_model.properties.durability import p9_verifies
from ckpt_model.properties.fencing import p10_reply_phase
from ckpt_model.properties.identifiers import (
    p15_forgotten_echoed,
    p15_manifest_names_share,
    p15_restore_names_source,
    p15_restored_next_attempts,
    p15_retired_echoed,
)
from ckpt_model.properties.scope import p1_commit_is_its_share
from ckpt_model.protocol.history import Event, History
from ckpt_model.protocol.storage import MANIFEST_NAME, CheckpointUnreadable, Fingerprint, fingerprint, participant_dir
from ckpt_model.protocol.wire import EpisodeId

# A completed call: its invocation and its completion.
Call = tuple[Event, Event]
RESTORE_CHECKED_KINDS = ("environment", "agent")  # the model's and the resources' restores are P5's and P6's


class CallAudit:
    """Judges the journaled calls of every collection run of one example; `observe` is the relay's hook."""

    def __init__(self, history: History, kinds: Mapping[str, str], reward: float) -> None:
        self.history = history
        self.kinds = dict(kinds)  # participant name -> kind; any other server (a relay) takes no part
        self.reward = reward
        self.judged = 0  # history events judged so far

    def observe(self, name: str, operation: str, request: Any, status: int, reply: Any) -> Mapping[str, Any]:
        """Before a 200 commit or restore reply goes back to the program: the participant's directory as it is now
        (a `Fingerprint`, or what did not verify), and for a restore the checkpoint its manifest names."""
        if status != 200 or operation not in ("commit", "restore") or name not in self.kinds:
            return {}
        kind = self.kinds[name]
        directory = participant_dir(Path(request["checkpoint_dir"]), kind, name)
        expected_id = request["checkpoint_id"] if operation == "commit" else None
        share: Fingerprint | CheckpointUnreadable
        try:
            share = fingerprint(directory, kind, name, checkpoint_id=expected_id)
        except CheckpointUnreadable as exc:
            share = exc
        seen: dict[str, Any] = {"share": share}
        if operation == "restore":
            try:
                seen["source"] = json.loads((directory / MANIFEST_NAME).read_text()).get("checkpoint_id")
            except (OSError, ValueError) as exc:
                seen["source"] = f"unreadable: {exc}"
        return seen

    def check(self) -> None:
        """Every call completed since the last check, then P2 over the whole journal."""
        events = self.history.events
        calls = completed_calls(events)
        for invocation, completion in calls:
            if completion.index >= self.judged and completion.type == "ok":
                self._judge(invocation, completion, calls)
        self.judged = len(events)
        p2_no_reply_within(prepared_spans(events, self.kinds), events)

    def resumed_since(self, start: int) -> bool:
        """Every participant has answered a resume the program sent after history event `start`: from then on its
        status must show it open (a participant re-opens admission before its resume replies, reference section 3)."""
        answered = {
            invocation.process
            for invocation, completion in completed_calls(self.history.events)
            if invocation.f == "resume" and invocation.index >= start and completion.type == "ok"
        }
        return answered >= self.kinds.keys()

    def _judge(self, invocation: Event, completion: Event, calls: Sequence[Call]) -> None:
        outcome = completion.value
        if "observe_error" in outcome:
            raise HarnessError(f"reading {invocation.process}'s {invocation.f} reply: {outcome['observe_error']}")
        if outcome["status"] != 200:
            return
        request, reply, name = invocation.value["body"], outcome["body"], invocation.process
        if invocation.f == "run":
            if isinstance(request, Mapping) and "episode_id" in request:
                p3_run_reply_shape(run_key(request), 200, reply)
            p3_reply_complete(run_key(request), 200, reply, self.reward)
            return
        if name not in self.kinds:
            return
        checkpoint_id = request["checkpoint_id"]
        replies = {name: reply}
        if invocation.f == "commit":
            self._commit(name, checkpoint_id, request, reply, outcome["share"], calls)
        elif invocation.f == "restore":
            p10_reply_phase("restore", checkpoint_id, "restored", replies)
            p15_restore_names_source(checkpoint_id, outcome["source"], replies)
            share = outcome["share"]
            if self.kinds[name] in RESTORE_CHECKED_KINDS and isinstance(share, Fingerprint):
                scope = scope_keys(request) or ()
                expected = [next_key(key) for key in share.episode_ids if key in scope]
                p15_restored_next_attempts(checkpoint_id, name, expected, reply.get("restored"))
        elif invocation.f == "resume":
            p10_reply_phase("resume", checkpoint_id, "idle", replies)
        elif invocation.f == "retire":
            p15_retired_echoed(checkpoint_id, scope_keys(request) or [], replies)
        elif invocation.f == "forget":
            p15_forgotten_echoed(checkpoint_id, request["rollout_ids"], replies)

    def _commit(
        self, name: str, checkpoint_id: str, request: Any, reply: Any, share: Any, calls: Sequence[Call]
    ) -> None:
        p10_reply_phase("commit", checkpoint_id, "committed", {name: reply})
        p9_verifies(checkpoint_id, {name: share})
        p1_commit_is_its_share(
            checkpoint_id,
            name,
            scope_keys(request),
            reported_restarts(calls, checkpoint_id),
            reply.get("episode_ids"),
            share.episode_ids,
        )
        p15_manifest_names_share(checkpoint_id, name, self.kinds[name], reply.get("manifest"), share)


def run_key(body: Any) -> str:
    """The capture key a `/run` body names: native `episode_id`, or the legacy row's rollout and attempt fields."""
    if isinstance(body, Mapping) and isinstance(body.get("episode_id"), Mapping):
        return EpisodeId.model_validate(body["episode_id"]).capture_key
    if isinstance(body, Mapping) and "_ng_rollout_id" in body:
        return EpisodeId(rollout_id=body["_ng_rollout_id"], attempt=body.get("_ng_attempt_index", 0)).capture_key
    return f"an unnamed /run {str(body)[:80]}"


def scope_keys(request: Any) -> list[str] | None:
    """The capture keys of a request's `episode_ids` (None: no scope given, which a commit allows)."""
    episodes = request.get("episode_ids") if isinstance(request, Mapping) else None
    if episodes is None:
        return None
    return [EpisodeId.model_validate(episode).capture_key for episode in episodes]


def completed_calls(events: Iterable[Event]) -> list[Call]:
    """Every call that completed, as (its invocation, its completion), in the order they completed."""
    invocations = {event.index: event for event in events if event.type == "invoke"}
    return [
        (invocations[event.invoke_index], event)
        for event in events
        if event.type != "invoke" and event.invoke_index is not None
    ]


def reported_restarts(calls: Iterable[Call], checkpoint_id: str) -> frozenset[str]:
    """The restarts the participants reported in their prepare replies for `checkpoint_id`."""
    restarts: set[str] = set()
    for invocation, completion in calls:
        if invocation.f != "prepare" or completion.type != "ok" or completion.value["status"] != 200:
            continue
        if invocation.value["body"].get("checkpoint_id") == checkpoint_id:
            restarts.update(completion.value["body"].get("report", {}).get("restarts", []))
    return frozenset(restarts)


def prepared_spans(events: Sequence[Event], participants: Collection[str]) -> list[tuple[float, float]]:
    """From each moment every participant had answered `prepared` for one checkpoint, to the next resume or restore
    the program sent, or the next crash of the Gym noted in the journal (open-ended: up to the last event)."""
    invocations = {event.index: event for event in events if event.type == "invoke"}
    prepared: dict[str, set[str]] = {}
    spans: list[tuple[float, float]] = []
    start: float | None = None
    for event in events:
        invocation = invocations.get(event.invoke_index) if event.invoke_index is not None else None
        closes = event.f == "crash" or (event.type == "invoke" and event.f in ("resume", "restore"))
        if closes:
            if start is not None:
                spans.append((start, event.time_s))
                start = None
            prepared.clear()
            continue
        if invocation is None or invocation.f != "prepare" or event.type != "ok":
            continue
        if event.value["status"] == 200 and event.value["body"].get("phase") == "prepared":
            names = prepared.setdefault(invocation.value["body"].get("checkpoint_id"), set())
            names.add(invocation.process)
            if start is None and set(participants) <= names:
                start = event.time_s
    if start is not None:
        spans.append((start, events[-1].time_s + 1.0))
    return spans
