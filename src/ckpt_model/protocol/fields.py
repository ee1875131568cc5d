"""Every field of every body the checker reads, and what becomes of it: compared by a named check, or not, and why.

The table is data (`FIELDS`: body -> field -> `Compared` or `NotCompared`); `docs/fields.md` is rendered from it
(`python -m ckpt_model.protocol.fields > docs/fields.md`), and its unit test holds it to the reply models of
`ckpt_model.protocol.wire`, so a field added to the wire cannot go unlisted, and to the properties, so a check it names
exists; `tests/stack/test_live_replies.py` holds the look-alike stack's live replies to those models and the
table's routes, so a field or route the fakes start sending cannot go unlisted either. A field is *compared* when
the model (or the disk, or the request the controller sent) predicts its value and a named check raises when the
reply disagrees; *not compared* fields say why no prediction is made.
"""

from __future__ import annotations

import sys
import types
import typing
from collections.abc import Iterator, Mapping

import attrs
from pydantic import BaseModel

from ckpt_model.protocol import wire


@attrs.frozen
class Compared:
    """Predicted and compared after the step by the function `check` (in a module of `properties`, or `lineage`; the
    harness's own check of the worker placement is in `placement`); `how` narrows what is compared when it is
    less than the whole value."""

    check: str
    how: str = ""


@attrs.frozen
class NotCompared:
    reason: str


Verdict = Compared | NotCompared

CHECKPOINT = wire.CHECKPOINT_ROUTE_PREFIX
LEDGER = "/training-token-capture/control/rollouts"

# Reasons shared by several fields.
TIMESTAMP = "a timestamp"
FREE_TEXT = "free text for people"
CONFIG_ECHO = "an echo of the deployment's configuration, which the model does not choose"
CUT_RECEIPT = (
    "read by the policy model server, never by the checker; the cut round it answers is compared through the "
    "backend's GET /_ctl/cuts (p12_cut_round) and the exported cut (p12_exported_cuts)"
)
COORDINATOR = "multi-worker bookkeeping (Appendix B): how many workers and routing entries, not protocol state"


@attrs.frozen
class Body:
    """One reply (or status) body: the route, who sends it, and the wire model whose fields it has."""

    route: str
    model: type[BaseModel]
    fields: Mapping[str, Verdict]
    sender: str = "every participant kind"


FIELDS: dict[str, Body] = {
    "status": Body(
        f"GET {CHECKPOINT}/status",
        wire.StatusReply,
        {
            "kind": Compared("p15_status_names_participant", "the kind it was discovered as, every poll"),
            "instance": Compared("p15_status_names_participant", "its server name, stable across restarts"),
            "phase": Compared("p10_phase"),
            "checkpoint_id": Compared("p10_phase"),
            "lease_expires_at": Compared("p10_lease_held", "a time set while a checkpoint is open"),
            "retired_rollouts": Compared("status_mismatches"),
            "report": Compared("p10_report_consistent", "see the report's own fields"),
            "report.ready": NotCompared(
                "a participant may be unready with no blocker to name; a prepare's readiness is compared there"
            ),
            "report.blockers": Compared("p11_preparing", "and p15_capture_keys: each a capture key"),
            "report.blocker_count": Compared("p10_report_consistent", "the length of the uncapped blockers"),
            "report.counts": Compared("status_mismatches", "per key, see the counts table"),
            "report.restarts": Compared("p15_capture_keys", "each a capture key; the set is P1's at a prepare"),
            "restored_pending": Compared("status_mismatches", "environment: the restored attempts not started"),
            "accepting": Compared("status_mismatches"),
            "mode": NotCompared(CONFIG_ECHO),
            "verify": NotCompared(CONFIG_ECHO + "; its effect is P11's (a wait verify blocks a prepare)"),
            "retired_sessions": Compared("p13_clean_end", "zero once drained"),
            "restored_generation_cuts": Compared(
                "p15_capture_keys", "each a capture key; a cut's use is P12's (p12_continuations)"
            ),
            "workers": NotCompared(COORDINATOR),
            "expected_workers": NotCompared(CONFIG_ECHO),
            "session_aliases": NotCompared(COORDINATOR),
            "session_placements": NotCompared(COORDINATOR),
        },
    ),
    "prepare": Body(
        f"POST {CHECKPOINT}/prepare",
        wire.PrepareReply,
        {
            "phase": Compared("p10_prepared_everywhere", "prepared or not, as the model says; p11_blocked"),
            "report": Compared("p10_report_consistent"),
            "report.ready": Compared("p10_report_consistent", "ready exactly when the phase is prepared"),
            "report.blockers": Compared("p11_blocked"),
            "report.blocker_count": Compared("p10_report_consistent", "the length of the uncapped blockers"),
            "report.counts": NotCompared("the status's counts, compared there once the step settles"),
            "report.restarts": Compared("p1_restarts_reported"),
        },
    ),
    "renew": Body(
        f"POST {CHECKPOINT}/renew",
        wire.RenewReply,
        {"lease_expires_at": Compared("p10_lease_renewed", "at least the renew's deadline plus the lease grace")},
    ),
    "commit": Body(
        f"POST {CHECKPOINT}/commit",
        wire.CommitReply,
        {
            "phase": Compared("p10_reply_phase", "committed"),
            "manifest": Compared("p15_manifest_names_share"),
            "manifest.schema_version": Compared("p15_manifest_names_share"),
            "manifest.kind": Compared("p15_manifest_names_share"),
            "manifest.instance": Compared("p15_manifest_names_share"),
            "manifest.checkpoint_id": Compared("p15_manifest_names_share", "the commit's checkpoint ID echoed"),
            "manifest.records_file": Compared("p15_manifest_names_share", "the manifest on disk"),
            "manifest.records_sha256": Compared("p15_manifest_names_share", "the manifest on disk"),
            "manifest.record_count": Compared("p15_manifest_names_share", "the manifest on disk"),
            "manifest.session_owners": NotCompared(COORDINATOR),
            "manifest.placed_sessions": NotCompared(COORDINATOR),
            "episode_ids": Compared("p1_exports_exact"),
            "staging_keys": NotCompared(
                "the trainer's keep-list, derived from the records' rows and cuts, which p5_exported and "
                "p12_exported_cuts compare on disk"
            ),
            "staging_keys_by_episode": NotCompared("the same keep-list by capture key"),
        },
        sender="every participant kind (staging keys: the policy model)",
    ),
    "restore": Body(
        f"POST {CHECKPOINT}/restore",
        wire.RestoreReply,
        {
            "phase": Compared("p10_reply_phase", "restored"),
            "source_checkpoint_id": Compared("p15_restore_names_source"),
            "restored": Compared(
                "p15_restored_next_attempts",
                "environment and agent: the next attempts of their in-scope records on disk (resources: p6_restored)",
            ),
        },
    ),
    "resume": Body(
        f"POST {CHECKPOINT}/resume",
        wire.ResumeReply,
        {
            "phase": Compared("p10_reply_phase", "idle"),
            "idempotent": Compared("p10_retry_answered", "on a retried resume"),
        },
    ),
    "retire": Body(
        f"POST {CHECKPOINT}/retire",
        wire.RetireReply,
        {"retired": Compared("p15_retired_echoed", "the capture keys as given")},
    ),
    "forget": Body(
        f"POST {CHECKPOINT}/forget",
        wire.ForgetReply,
        {"forgotten": Compared("p15_forgotten_echoed", "the rollout IDs, sorted and unique")},
    ),
    "error": Body(
        "every route's refusal",
        wire.ErrorEnvelopeWire,
        {
            "error": Compared("p10_each_refused", "see its fields"),
            "error.code": Compared(
                "p10_each_refused", "the code each refusal the model predicts carries (also p7_refused, p8_refused_by)"
            ),
            "error.detail": NotCompared(FREE_TEXT + " (except a ledger's 410 and removal refusal: p5_manifest)"),
        },
        sender="every server",
    ),
    "generation-cut": Body(
        f"POST {wire.GENERATION_CUT_ROUTE}",
        wire.GenerationCutReceiptWire,
        {
            "checkpoint_id": NotCompared(CUT_RECEIPT),
            "cut_id": NotCompared(CUT_RECEIPT),
            "inventory_digest": NotCompared(CUT_RECEIPT),
            "inventory": NotCompared(CUT_RECEIPT),
            "backend_snapshot_id": NotCompared(CUT_RECEIPT),
            "prefixes": NotCompared(CUT_RECEIPT),
            **{f"prefixes[].{name}": NotCompared(CUT_RECEIPT) for name in wire.CutPrefixAckWire.model_fields},
        },
        sender="the inference backend, to the policy model",
    ),
    "ledger manifest": Body(
        f"GET {LEDGER}/<capture_key>/manifest",
        wire.LedgerManifestReply,
        {
            "rollout_id": Compared("p15_ledger_identifiers", "the capture key asked for"),
            "records": Compared("p5_manifest"),
            "records[].model_call_id": Compared("p5_manifest", "the predicted chain, in order"),
            "records[].parent_call_id": NotCompared(
                "repeats the parent the call was admitted with, which p5_parent_links compares at the backend"
            ),
            "records[].staging_key": Compared("p5_staged", "names tokens staged for that call"),
            "records[].capture_key": Compared("p15_ledger_identifiers", "an earlier attempt of the same rollout"),
            "failures": NotCompared("failure rows pass through; no call of the checker's tasks fails"),
        },
        sender="the policy model",
    ),
    "ledger retire": Body(
        f"POST {LEDGER}/retire",
        wire.LedgerRetireReply,
        {"retired": NotCompared("the checker asks only while a checkpoint is open: the refusal is compared")},
        sender="the policy model",
    ),
    "ledger delete": Body(
        f"POST {LEDGER}/delete",
        wire.LedgerDeleteReply,
        {"deleted": Compared("p5_stale_ledger_deleted", "not refused")},
        sender="the policy model",
    ),
    "run": Body(
        "POST /run",
        wire.RunReply,
        {
            "episode_id": Compared("p15_run_names_episode", "the attempt sent (native)"),
            "episode_id.rollout_id": Compared("p15_run_names_episode"),
            "episode_id.attempt": Compared("p15_run_names_episode"),
            "task_id": Compared("p15_run_names_episode", "the task name sent (native; drawn by `dispatch`)"),
            "task_id.taskset": Compared("p15_run_names_episode"),
            "task_id.task_id": Compared("p15_run_names_episode"),
            "result": Compared("p3_reply_complete"),
            "result.reward": Compared("p3_reply_complete", "the reward of an uninterrupted run"),
            "result.ng_agent_observations": Compared(
                "p14_resumed_equals_uninterrupted", "the tool outputs the loop saw, equal to the twin's"
            ),
            "failure": Compared(
                "p3_reply_complete",
                "none: a failure is P3 (native: exactly one of result and failure, p3_run_reply_shape)",
            ),
            "failure.failure_reason": Compared(
                "p20_budget_kept",
                "only Gym's `Episode timed out`, once time passed while the rollout was parked (at most 2,000 "
                "characters: p3_run_reply_shape)",
            ),
            "failure.terminal": Compared(
                "p3_run_reply_shape",
                "a JSON bool; Gym's own failures as the release makes them (its timeouts not terminal, an unhandled "
                "error terminal)",
            ),
            "failure.failure_kind": NotCompared(
                "a name that explains the failure and never decides terminality (p3_run_reply_shape only holds it "
                "left out when unset, never null)"
            ),
            "failure.stage": Compared(
                "p3_run_reply_shape",
                "left out when unset, else admission, seed, agent, verification or cleanup; `admission` on Gym's "
                "admission timeout, none on its other failures",
            ),
            "reward": Compared("p3_reply_complete", "legacy: the reward at the top"),
            "response": Compared(
                "p14_resumed_equals_uninterrupted",
                "legacy: the agent's final response (tool calls, tool outputs, message, usage), equal to the twin's",
            ),
        },
        sender="the environment (native) or the agent (legacy)",
    ),
    "backend calls": Body(
        "GET /_ctl/calls",
        wire.BackendCallWire,
        {
            "index": NotCompared("the checker's handle to release a call and order the lineage"),
            "n_messages": Compared("p4_calls"),
            "admission": Compared("p5_parent_links", "see its fields"),
            "admission.model_call_id": Compared("p15_model_call_ids_unique", "never reused; and P5's chains"),
            "admission.parent_call_id": Compared("p5_parent_links"),
            "admission.rollout_id": Compared("p15_admission_names_attempt", "the capture key the call was routed by"),
            "admission.mode": NotCompared("the look-alike stages every call the same way"),
            "admission.generation_cut": NotCompared(
                "the backend checks it against the token store; its effect is continued_from (p12_continuations)"
            ),
            "capture_key": Compared("p4_calls", "calls are grouped by it"),
            "kind": Compared("p4_calls", "a judge call is a verification (P11)"),
            "t": NotCompared(TIMESTAMP),
            "returned": NotCompared("read to learn which replies reached the policy model before it died"),
            "waiting": NotCompared("the settle waits for the predicted waiting calls: slowness is never a verdict"),
            "cancelled": NotCompared("the backend's bookkeeping of a client that went away"),
            "continued_from": Compared("p12_continuations"),
            "reused_prefix_tokens": Compared("p12_tokens"),
            "worker": Compared(
                "placement_mismatches", "the worker the checker placed the attempt on; another is a harness error"
            ),
        },
        sender="the fake inference backend",
    ),
    "backend staged": Body(
        "GET /_ctl/staged",
        wire.StagedEntryWire,
        {
            "rollout_id": NotCompared("the staging key already names it"),
            "model_call_id": Compared("p5_staged"),
            "parent_call_id": NotCompared("repeats the call's admission, which p5_parent_links compares"),
            "tokens": Compared("p12_tokens"),
            "continued_from": NotCompared("repeats the call's continued_from, which p12_continuations compares"),
            "prefix_staging_key": Compared("p12_tokens"),
            "checkpoint_id": NotCompared("a cut prefix's bookkeeping; the prefix's tokens are p12_tokens'"),
        },
        sender="the fake inference backend",
    ),
    "backend step": Body(
        "POST /_ctl/step",
        wire.BackendStepReply,
        {
            "released": NotCompared("the release's receipt; the next poll of /_ctl/calls shows what it released"),
            "released_indices": NotCompared("the release's receipt"),
            "waiting": NotCompared("the release's receipt"),
        },
        sender="the fake inference backend",
    ),
    "backend cut stall": Body(
        "GET /_ctl/cut_stall",
        wire.BackendCutStallWire,
        {
            "stall": NotCompared("the checker set it and lifts it after the prepare; only the count is read"),
            "hanging": NotCompared(
                "read to know when a hung cut's sender took its budget, to jump the clocks past it (owned time); "
                "the prepare's answer is P10's, its cuts P12's"
            ),
        },
        sender="the fake inference backend",
    ),
}

# `report.counts` by participant kind (`wire.REPORT_COUNT_KEYS`).
COUNTS: dict[str, dict[str, Verdict]] = {
    "environment": {"episodes": Compared("status_mismatches")},
    "agent": {
        "sessions": Compared("status_mismatches"),
        "at_boundary": Compared("p13_clean_end", "zero once drained"),
        "inflight": Compared("p13_clean_end", "zero once drained (a restart-only agent)"),
    },
    "resources": {
        "inflight": Compared("p13_clean_end", "zero once drained"),
        "sessions": Compared("status_mismatches"),
    },
    "model": {
        "inflight": Compared("status_mismatches"),
        "held": Compared("status_mismatches", "and p2_held_responses while a checkpoint is open"),
        "cut": Compared("p13_clean_end", "zero once drained"),
        "cut_failed": Compared("p13_clean_end", "zero once drained"),
        "cut_skipped": NotCompared("the checker's calls are all cuttable; a skip shows as a regeneration (P12)"),
    },
    "coordinator": {"workers": NotCompared(COORDINATOR)},
}

# The identifier invariants the reference states, each with the check that holds it.
IDENTIFIERS: dict[str, str] = {
    "a status names its own kind and server name, every poll and across restarts": "p15_status_names_participant",
    "blockers, restarts and restored keys are capture keys (reference 5.1)": "p15_capture_keys",
    "a commit's manifest echoes the checkpoint ID, kind and instance, and is the manifest on disk (6.2)": (
        "p15_manifest_names_share"
    ),
    "a restore names the checkpoint it read (2.5)": "p15_restore_names_source",
    "a restore installs every in-scope record under its next attempt (5.1, 6.4)": "p15_restored_next_attempts",
    "a retire echoes the capture keys as given (2.5)": "p15_retired_echoed",
    "a forget echoes the rollout IDs, sorted and unique (2.5)": "p15_forgotten_echoed",
    "a model call ID is never reused, across executions, crashes and restores (7.2)": "p15_model_call_ids_unique",
    "a captured call's admission names the attempt it was routed for (7.1)": "p15_admission_names_attempt",
    "a ledger answers for the key asked, and a restored row is stamped with an earlier attempt (7.2)": (
        "p15_ledger_identifiers"
    ),
    "a native /run reply names the attempt and task it ran (5.2)": "p15_run_names_episode",
    "a /run naming a rollout ID the rules reject is refused with the protocol's error: native 422 naming "
    "`rollout_id`, legacy 400 `invalid_rollout_id` (or `rollout_id_required` for none) (2.2, 2.3, 5.1, 5.3)": (
        "p15_rejected_id_refused"
    ),
    "such a /run calls nothing: no backend call under its key beyond the model's own attempts'": (
        "p15_rejected_ids_called_nothing"
    ),
    "no capture key names two (rollout ID, attempt) pairs, in the backend's calls or across a commit's records (5.1)": (
        "p15_capture_keys_unique"
    ),
    "a control call naming a checkpoint ID the rules reject is refused by every participant with 422 naming "
    "`checkpoint_id` (2.2)": "p15_rejected_checkpoint_id_refused",
    "such a call changes no participant's phase, checkpoint ID, lease, admission or restored-pending episodes": (
        "p15_rejected_checkpoint_id_changed_nothing"
    ),
    "a continued attempt's first call links to the last delivered one (5.6)": "p5_parent_links",
    "a resumed checkpoint ID is refused (2.6)": "p10_each_refused",
}


def schema_fields(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    """Every field path of `model`: nested models' fields dotted, a list's items as `name[]`."""
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        yield path
        nested, listed = _nested_model(info.annotation)
        if nested is not None:
            yield from schema_fields(nested, f"{path}[]." if listed else f"{path}.")


def _nested_model(annotation: object) -> tuple[type[BaseModel] | None, bool]:
    """The model a field holds (directly, in a list, or optional), and whether in a list."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    origin = typing.get_origin(annotation)
    arguments = typing.get_args(annotation)
    if origin is list and arguments:
        return _nested_model(arguments[0])[0], True
    if origin in (typing.Union, types.UnionType):
        for argument in arguments:
            found = _nested_model(argument)
            if found[0] is not None:
                return found
    return None, False


def counts() -> tuple[int, int]:
    """How many fields are compared, and how many not (the counts table included)."""
    verdicts = [v for body in FIELDS.values() for v in body.fields.values()]
    verdicts += [v for kind in COUNTS.values() for v in kind.values()]
    compared = sum(isinstance(v, Compared) for v in verdicts)
    return compared, len(verdicts) - compared


def _row(field: str, verdict: Verdict) -> str:
    if isinstance(verdict, Compared):
        how = f": {verdict.how}" if verdict.how else ""
        return f"| `{field}` | compared | `{verdict.check}`{how} |"
    return f"| `{field}` | not compared | {verdict.reason} |"


def render() -> str:
    """docs/fields.md."""
    compared, not_compared = counts()
    lines = [
        "# Every field, compared or accounted for",
        "",
        "Generated from `src/ckpt_model/protocol/fields.py` by",
        "`python -m ckpt_model.protocol.fields > docs/fields.md`; a unit test (`tests/unit/checker/test_fields.py`)",
        "holds the table to the reply models in `src/ckpt_model/protocol/wire.py` and to the checks in",
        "`ckpt_model.properties`, `lineage.py` and `placement.py`, and this file to the table; a stack test",
        "(`tests/stack/test_live_replies.py`) holds every reply the look-alike stack sends the checker, in fixed",
        "scenarios on six deployments, to the same models and routes. A field is",
        "*compared* when the model (or the disk, or the request the controller sent) predicts it and the named",
        "check raises when the reply disagrees after the step; otherwise the reason says why nothing predicts it.",
        "",
        f"{compared} fields compared, {not_compared} not compared.",
    ]
    for name, body in FIELDS.items():
        lines += ["", f"## {name}: `{body.route}`", "", f"Sent by {body.sender}.", ""]
        lines += ["| field | verdict | check or reason |", "|---|---|---|"]
        lines += [_row(field, verdict) for field, verdict in body.fields.items()]
    lines += ["", "## `report.counts`, by participant kind", "", "| kind | key | verdict | check or reason |"]
    lines += ["|---|---|---|---|"]
    for kind, keys in COUNTS.items():
        lines += [f"| {kind} {_row(key, verdict)[1:]}" for key, verdict in keys.items()]
    lines += ["", "## Identifier invariants", "", "| invariant | check |", "|---|---|"]
    lines += [f"| {invariant} | `{check}` |" for invariant, check in IDENTIFIERS.items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
