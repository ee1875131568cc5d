"""P15 identifiers: every reply names what it answers (its participant, checkpoint, attempts and task) with capture
keys, a restore continues each record as its next attempt, a model call ID is never reused, a rollout ID or a
checkpoint ID Gym's rules reject is refused and changes nothing, and no capture key names two attempts
(docs/fields.md lists the fields and the invariant each check holds).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ckpt_model.errors import ParticipantFailure, PropertyViolation
from ckpt_model.model.contract import ScriptCall
from ckpt_model.properties.evidence import error_code, shortened
from ckpt_model.protocol.storage import Fingerprint
from ckpt_model.protocol.wire import MANIFEST_SCHEMA_VERSION, EpisodeId, rollout_key

# A pair of a rollout ID and an attempt number, as a `/run` or a record names it.
Pair = tuple[str, int]


class P15Violation(PropertyViolation):
    property_id = "P15"
    title = (
        "identifiers: every reply names what it answers (its participant, checkpoint, attempts and task) with "
        "capture keys, a restore continues each record as its next attempt, a model call ID is never reused, a "
        "rejected rollout or checkpoint ID is refused and changes nothing, and no capture key names two attempts"
    )


def p15_status_names_participant(name: str, kind: str, status: Mapping[str, Any]) -> None:
    """A status names the participant asked: the kind it was discovered as and its own server name (the instance
    stays the server's config name across restarts, reference 2.4 and 6.1)."""
    observed = (status.get("kind"), status.get("instance"))
    if observed != (kind, name):
        raise P15Violation(
            rollout=None,
            expected=f"the status of {name} names kind {kind!r} and instance {name!r}",
            observed=f"it names kind {observed[0]!r} and instance {observed[1]!r}",
        )


def p15_capture_keys(where: str, keys: Any) -> None:
    """Blockers, restarts, restored and retired keys are capture keys: a list of `rollout[-a<N>]` names
    (reference 5.1), each naming exactly one attempt."""
    problems = [key for key in keys if not _is_capture_key(key)] if isinstance(keys, list) else [keys]
    if problems:
        raise P15Violation(
            rollout=None,
            expected=f"{where} is a list of capture keys",
            observed=f"{where} holds {problems!r}",
        )


def _is_capture_key(key: Any) -> bool:
    if not isinstance(key, str):
        return False
    try:
        return EpisodeId.from_capture_key(key).capture_key == key
    except ValueError:
        return False


def p15_manifest_names_share(
    checkpoint_id: str, participant: str, kind: str, manifest: Any, on_disk: Fingerprint | Any
) -> None:
    """A commit reply's manifest echoes the commit's checkpoint ID and names the participant (kind, instance),
    with the schema version of reference 6.2, and it is the manifest written: same records file, digest, count."""
    expected: dict[str, Any] = {
        "schema_version": MANIFEST_SCHEMA_VERSION,
        "kind": kind,
        "instance": participant,
        "checkpoint_id": checkpoint_id,
    }
    if isinstance(on_disk, Fingerprint):
        expected |= {
            "records_file": on_disk.records_file,
            "records_sha256": on_disk.records_sha256,
            "record_count": on_disk.record_count,
        }
    observed = {field: manifest.get(field) for field in expected} if isinstance(manifest, Mapping) else manifest
    if observed != expected:
        raise P15Violation(
            rollout=None,
            expected=f"{participant}'s commit reply carries its manifest of {checkpoint_id}: {expected}",
            observed=f"it carries {observed}",
        )


def p15_restore_names_source(restore_id: str, source: str, replies: Mapping[str, Any]) -> None:
    """Every restore reply names the checkpoint whose manifest it read (`source_checkpoint_id`, reference 2.5),
    not the restore's own ID."""
    wrong = {name: reply.get("source_checkpoint_id") for name, reply in replies.items()}
    wrong = {name: named for name, named in wrong.items() if named != source}
    if wrong:
        raise P15Violation(
            rollout=None,
            expected=f"restore {restore_id} answered with source_checkpoint_id {source!r} by every participant",
            observed=f"source_checkpoint_id {wrong}",
        )


def p15_restored_next_attempts(restore_id: str, participant: str, expected: Iterable[str], restored: Any) -> None:
    """A restore installs each in-scope record under its next attempt (reference 5.1, 6.4): the reply's
    `restored` names exactly those capture keys, sorted."""
    want = sorted(expected)
    if restored != want:
        named = set(restored) if isinstance(restored, list) else set()
        raise P15Violation(
            rollout=next(iter(sorted(set(want) ^ named)), None),
            expected=f"{participant} restores {want} (the next attempts of its in-scope records) in {restore_id}",
            observed=f"its restore reply names {restored!r}",
        )


def p15_retired_echoed(retire_id: str, keys: Sequence[str], replies: Mapping[str, Any]) -> None:
    """Every retire reply echoes the capture keys as given (reference 2.5)."""
    _echoed(f"retire {retire_id}", "retired", list(keys), replies)


def p15_forgotten_echoed(forget_id: str, rollouts: Iterable[str], replies: Mapping[str, Any]) -> None:
    """Every forget reply names the rollout IDs, sorted and unique (reference 2.5)."""
    _echoed(f"forget {forget_id}", "forgotten", sorted(set(rollouts)), replies)


def _echoed(what: str, field: str, expected: list[str], replies: Mapping[str, Any]) -> None:
    wrong = {name: reply.get(field) for name, reply in replies.items() if reply.get(field) != expected}
    if wrong:
        raise P15Violation(
            rollout=expected[0] if expected else None,
            expected=f"{what} answered with {field} {expected} by every participant",
            observed=f"{field} {wrong}",
        )


def p15_run_names_episode(key: str, sent: Mapping[str, Any], body: Any) -> None:
    """A native `/run` reply names the attempt and the task it ran (reference 5.2: `episode_id`, `task_id`)."""
    if "episode_id" not in sent:
        return  # legacy: the reply is the verify response, which names neither
    task = sent.get("task")
    expected = {"episode_id": sent["episode_id"], "task_id": task.get("task_id") if isinstance(task, dict) else None}
    observed = {field: body.get(field) for field in expected} if isinstance(body, dict) else body
    if observed != expected:
        raise P15Violation(rollout=key, expected=f"the /run reply names {expected}", observed=f"it names {observed}")


def p15_model_call_ids_unique(calls: Sequence[Mapping[str, Any]]) -> None:
    """A model call ID names one call for good: never reused by another call, across executions, crashes and
    restores (reference 7.2), or the lineage of one would be read as the other's."""
    first: dict[str, int] = {}
    for call in calls:
        call_id = _admission(call).get("model_call_id")
        if call_id is None:
            continue
        if call_id in first:
            raise P15Violation(
                rollout=_admission(call).get("rollout_id"),
                expected=f"model call ID {call_id!r} names one call only",
                observed=f"backend calls #{first[call_id]} and #{call.get('index')} both carry it",
            )
        first[call_id] = call.get("index", -1)


def p15_admission_names_attempt(calls: Sequence[Mapping[str, Any]]) -> None:
    """A captured call's admission names the attempt the call was routed for (its `/ng-rollout/<key>` prefix,
    reference 7.1): the capture key its rows are written under."""
    for call in calls:
        admission = _admission(call)
        if admission and call.get("capture_key") is not None and admission.get("rollout_id") != call["capture_key"]:
            raise P15Violation(
                rollout=call["capture_key"],
                expected=f"backend call #{call.get('index')} routed for {call['capture_key']!r} is admitted for it",
                observed=f"its admission names rollout_id {admission.get('rollout_id')!r}",
            )


def _admission(call: Mapping[str, Any]) -> Mapping[str, Any]:
    admission = call.get("admission")
    return admission if isinstance(admission, Mapping) else {}


def p15_ledger_identifiers(key: str, answered_for: Any, sources: Sequence[str | None]) -> None:
    """A ledger manifest answers for the capture key asked, and every row a restore stamped (`capture_key`: the
    attempt that staged it) names an earlier attempt of the same rollout (reference 7.2)."""
    episode = EpisodeId.from_capture_key(key)
    if answered_for is not None and answered_for != key:
        raise P15Violation(rollout=key, expected=f"the ledger of {key!r}", observed=f"rollout_id {answered_for!r}")
    for source in sources:
        if source is None:
            continue
        staged_by = EpisodeId.from_capture_key(source) if _is_capture_key(source) else None
        if staged_by is None or staged_by.rollout_id != episode.rollout_id or staged_by.attempt >= episode.attempt:
            raise P15Violation(
                rollout=key,
                expected=f"rows of {key!r} stamped with an earlier attempt of {episode.rollout_id!r}",
                observed=f"a row stamped capture_key {source!r}",
            )


def p15_capture_keys_unique(where: str, pairs: Iterable[Pair]) -> None:
    """No two distinct (rollout ID, attempt) pairs share a capture key in `where` (a participant's records, the
    backend's calls): the reservation of a trailing `-a<N>` is what keeps the mapping one-to-one (reference 5.1),
    and a server that derives keys without it (nemo-gym 0.7.0's legacy `_ng_rollout_id`) lets `x-a1` at attempt 0
    and `x` at attempt 1 write under one key."""
    owners: dict[str, set[Pair]] = {}
    for rollout_id, attempt in pairs:
        owners.setdefault(rollout_key(rollout_id, attempt), set()).add((rollout_id, attempt))
    for key, named in sorted(owners.items()):
        if len(named) > 1:
            raise P15Violation(
                rollout=key,
                expected=f"capture key {key!r} names one attempt in {where}",
                observed="it names " + " and ".join(f"{r!r} at attempt {a}" for r, a in sorted(named)),
            )


def p15_rejected_id_refused(
    rollout_id: str, attempt: int, sent: Mapping[str, Any], status_code: int | None, body: Any
) -> None:
    """A `/run` whose rollout ID Gym's rules reject is refused with the protocol's error: a native request fails
    body validation (FastAPI's 422 with a `detail` naming `rollout_id`, reference 2.2), a legacy row without a
    rollout ID is 400 `rollout_id_required` and one with an invalid `_ng_rollout_id` 400 `invalid_rollout_id`
    (reference 2.3, 5.3)."""
    what = f"a /run with rollout ID {rollout_id!r} (attempt {attempt})"
    if "episode_id" in sent:
        expected = "refused with FastAPI's 422 naming rollout_id"
        refused = status_code == 422 and "rollout_id" in str(body.get("detail") if isinstance(body, dict) else None)
    else:
        code = "invalid_rollout_id" if rollout_id else "rollout_id_required"
        expected = f"refused with 400 {code}"
        refused = status_code == 400 and error_code(body) == code
    if not refused:
        raise P15Violation(
            rollout=rollout_key(rollout_id, attempt),
            expected=f"{what}, which Gym's rules reject, is {expected}",
            observed=f"HTTP {status_code}: {shortened(body)}",
        )


def p15_rejected_ids_called_nothing(
    rejected: Iterable[Pair],
    owners: Mapping[str, Pair],
    expected: Mapping[str, tuple[ScriptCall, ...]],
    observed: Mapping[str, tuple[ScriptCall, ...]],
) -> None:
    """A `/run` with a rejected rollout ID changes nothing anywhere: no backend call under its key beyond what the
    model's own attempts make (`expected`, by capture key; `owners`: the model's attempt behind each key). A call
    past them under a key an attempt of the model holds means the key names two attempts (the uniqueness check);
    under any other key, that the request was taken in. Judged before P4, which would name only the consequence."""
    for rollout_id, attempt in rejected:
        key = rollout_key(rollout_id, attempt)
        got, want = observed.get(key, ()), expected.get(key, ())
        if got == want[: len(got)]:
            continue
        if key in owners:
            p15_capture_keys_unique("the backend's calls", [owners[key], (rollout_id, attempt)])
        raise P15Violation(
            rollout=key,
            expected=f"the /run of rejected rollout ID {rollout_id!r} is refused and calls nothing",
            observed=f"backend calls {list(got)} under {key!r}, where the model's attempts make {list(want)}",
        )


# What a participant's status shows of its control state: a control call it refused must leave each as it was.
CONTROL_STATE_FIELDS = ("phase", "checkpoint_id", "lease_expires_at", "accepting", "restored_pending")


def p15_rejected_checkpoint_id_refused(operation: str, checkpoint_id: str, outcomes: Mapping[str, Any]) -> None:
    """A control call whose `checkpoint_id` Gym's rules reject (1-128 characters of `^[A-Za-z0-9][A-Za-z0-9._-]*$`)
    fails body validation on every participant: FastAPI's 422, its `detail` naming `checkpoint_id` (reference
    2.2)."""
    wrong = {name: _shown(outcome) for name, outcome in outcomes.items() if not _refused_naming_id(outcome)}
    if wrong:
        raise P15Violation(
            rollout=None,
            expected=f"{operation} naming checkpoint ID {checkpoint_id!r}, which Gym's rules reject, is refused by "
            "every participant with FastAPI's 422 naming checkpoint_id",
            observed=f"answered {wrong}",
        )


def _refused_naming_id(outcome: Any) -> bool:
    return isinstance(outcome, ParticipantFailure) and outcome.http_status == 422 and "checkpoint_id" in outcome.detail


def _shown(outcome: Any) -> str:
    return outcome.describe() if isinstance(outcome, ParticipantFailure) else f"HTTP 200: {shortened(outcome)}"


def p15_rejected_checkpoint_id_changed_nothing(
    operation: str, checkpoint_id: str, before: Mapping[str, Mapping[str, Any]], after: Mapping[str, Mapping[str, Any]]
) -> None:
    """A control call with a rejected checkpoint ID changes nothing on any participant: its status shows the same
    phase, active checkpoint ID, lease, admission and restored-pending episodes after it as before
    (`CONTROL_STATE_FIELDS`)."""
    changed = {}
    for name, was in before.items():
        now = after.get(name, {})
        moved = {field: (was.get(field), now.get(field)) for field in CONTROL_STATE_FIELDS}
        moved = {field: values for field, values in moved.items() if values[0] != values[1]}
        if moved:
            changed[name] = ", ".join(f"{field} {old!r} -> {new!r}" for field, (old, new) in moved.items())
    if changed:
        raise P15Violation(
            rollout=None,
            expected=f"{operation} naming rejected checkpoint ID {checkpoint_id!r} changes nothing on any participant",
            observed=f"their status changed: {changed}",
        )
