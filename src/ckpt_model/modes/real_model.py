"""Real-model mode: the seed's opt-in real-model test, with an OpenAI-compatible server (vLLM) as the policy's model.

`CKPT_MODEL_MODEL_URL` names the server; the look-alike stack's policy model forwards every generation call there,
naming the served model (`CKPT_MODEL_MODEL_NAME`, else the first id of `GET /v1/models`). The run checkpoints 16
concurrent native weather rollouts (by default), kills every Gym process group (SIGKILL; the model server is never
touched), restores, resumes, runs every exported rollout's replacement to a reply, and checks the controller
contract as the seed does.

A real model has no gate: no `/_ctl` routes, no hold or release, no call log. So nothing places a rollout at a
chosen boundary. The run dispatches half the rollouts, waits until one of them replies (some finish naturally),
dispatches the rest, waits until the environment has admitted every one still running, and prepares; it then
classifies each rollout by what it observed. Whichever way a race goes, the checks hold for a correct Gym: a
rollout that replied is finished, one still in flight is exported.

Checked: P1 (finished and exported are disjoint and cover every rollout), P2 (no exported rollout replies between
prepare and the crash), P3 in a weaker form (every reply, of a finished rollout or a replacement, is HTTP 200 with
a finite numeric reward and no failure). Not checked, and the result says so: P4 (which calls each replacement
made, by message count, needs the fake backend's call log) and the reward's value (free text earns no predictable
reward).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit

import attrs
import httpx

from ckpt_model.deployments.harness import Harness
from ckpt_model.deployments.seam import system
from ckpt_model.errors import HarnessError
from ckpt_model.model.contract import capture_key
from ckpt_model.model.spec import DeploymentSpec
from ckpt_model.modes.scale import RunOutcome, RunSender, check_cover, wait_for
from ckpt_model.properties.continuation import P2Violation, p3_every_reply_complete
from ckpt_model.properties.identifiers import p15_restore_names_source, p15_restored_next_attempts
from ckpt_model.protocol.gym_tasks import DEVELOPER_MESSAGE, USER_MESSAGE, WEATHER_TOOL, native_run_body
from ckpt_model.protocol.http import new_http_client
from ckpt_model.protocol.wire import EpisodeId

MODEL_URL_ENV = "CKPT_MODEL_MODEL_URL"
MODEL_NAME_ENV = "CKPT_MODEL_MODEL_NAME"
TOPOLOGY = "native"
ROLLOUTS = 16
ROLLOUT_PREFIX = "real-"
CHECKPOINT_ID = "real-c1"
RESTORE_ID = "real-r1"
CONTROL_DEADLINE_S = 600.0
# A model server may spend minutes on its first calls (a cold cache, a long reasoning reply); a wait gives up only
# once nothing moved for this long, and the probe's read waits as long.
STALL_S = 600.0
CONNECT_TIMEOUT_S = 10.0
LOG_LINES_SHOWN = 40
# What a real model server cannot show, so real-model mode never judges it (named in every result).
NOT_CHECKED = {
    "continued from the boundary (P4)": "not checked: which calls each replacement made, by message count, needs "
    "the fake backend's call log, which a real model server does not keep",
    "reward of an uninterrupted run (P3)": "not checked: a real model's replies are free text, so no reward can be "
    "predicted; every reply is checked to be well formed instead",
}
T = TypeVar("T")


class RealModelError(HarnessError):
    """The model server cannot serve the run (unreachable, no model, a refused chat call), or a wait ran out."""


# --- the model server --------------------------------------------------------------------------------------


def model_base_url(url: str) -> str:
    """The server's base URL, as the policy model appends `/v1/chat/completions` to it: an OpenAI base URL that
    ends in `/v1` is accepted too."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(
            f"'{MODEL_URL_ENV}' must be an http:// or https:// URL of an OpenAI-compatible server, such as "
            f"http://127.0.0.1:8000 for `vllm serve` (got {url!r})"
        )
    base = url.strip().rstrip("/")
    return base.removesuffix("/v1")


def first_model_id(models: Any) -> str | None:
    """The first model id of a `GET /v1/models` reply (`{"data": [{"id": ...}, ...]}`), or None."""
    data = models.get("data") if isinstance(models, dict) else None
    if not isinstance(data, list):
        return None
    ids = [entry.get("id") for entry in data if isinstance(entry, dict)]
    return next((model for model in ids if isinstance(model, str) and model), None)


def served_model(base_url: str, http: httpx.Client, name: str | None = None) -> str:
    """`name` if given, else the first model the server lists (`GET /v1/models`)."""
    if name:
        return name
    url = base_url + "/v1/models"
    try:
        response = http.get(url)
    except httpx.TransportError as error:
        raise RealModelError(
            f"the model server at {base_url} did not answer GET {url} ({error!r}); is it running?"
        ) from error
    model = first_model_id(_json(response)) if response.status_code == 200 else None
    if model is None:
        raise RealModelError(
            f"GET {url} answered HTTP {response.status_code} without a model id ({response.text[:300]!r}); set "
            f"{MODEL_NAME_ENV} to the served model's id"
        )
    return model


def probe_chat(base_url: str, model: str, http: httpx.Client) -> None:
    """One chat call with the rollouts' weather tool: a server that cannot answer it (an unknown model, tools not
    enabled) would fail every rollout, which is a configuration to fix, not a verdict."""
    body = {
        "model": model,
        "messages": [{"role": "system", "content": DEVELOPER_MESSAGE["content"]}, USER_MESSAGE],
        "tools": [{"type": "function", "function": {k: v for k, v in WEATHER_TOOL.items() if k != "type"}}],
        "max_tokens": 16,
    }
    url = base_url + "/v1/chat/completions"
    try:
        response = http.post(url, json=body)
    except httpx.TransportError as error:
        raise RealModelError(f"the model server did not answer POST {url} ({error!r})") from error
    choices = _json(response).get("choices") if response.status_code == 200 else None
    if not (isinstance(choices, list) and choices and isinstance(choices[0], dict) and "message" in choices[0]):
        raise RealModelError(
            f"POST {url} with model {model!r} and one tool answered HTTP {response.status_code}: "
            f"{response.text[:500]!r}. Serve a model that takes tools (vLLM: --enable-auto-tool-choice "
            f"--tool-call-parser <parser>), and check {MODEL_NAME_ENV}"
        )


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


# --- the pure checks ---------------------------------------------------------------------------------------


def replied(outcomes: Mapping[str, RunOutcome | None]) -> set[str]:
    """The keys whose `/run` got a whole HTTP reply (an error cut off by the crash is no reply)."""
    return {key for key, outcome in outcomes.items() if outcome is not None and outcome.status_code is not None}


def check_silent(exported: Iterable[str], replied_after_prepare: Iterable[str]) -> str:
    """No exported rollout replied after prepare returned (P2): Gym holds it at a boundary until the crash.

    A rollout the environment did not export whose reply arrived after prepare returned is finished, not a
    violation: (1) its reply can leave the environment before admission closes and reach the client after
    prepare returns (a loaded core, a busy event loop), and the client cannot tell that from one sent while
    prepared. The verdict counts them."""
    saved, late = set(exported), set(replied_after_prepare)
    both = saved & late
    if both:
        raise P2Violation(
            rollout=min(both),
            expected="an exported rollout's /run stays silent from prepare until the crash",
            observed=f"{len(both)} exported rollouts replied after prepare returned: {sorted(both)}",
        )
    landed = f"; {len(late)} replies of rollouts not exported arrived after prepare returned (finished)" if late else ""
    return f"ok: none of the {len(saved)} exported rollouts replied between prepare and the crash{landed}"


def check_well_formed(outcomes: Mapping[str, RunOutcome | None], what: str) -> str:
    """Every `/run` of `what` replied HTTP 200 with a finite numeric reward and no failure (P3, as far as a real
    model's free-text replies can be judged); returns the verdict."""
    replies = {
        key: None if outcome is None else (outcome.status_code, outcome.body) for key, outcome in outcomes.items()
    }
    p3_every_reply_complete(what, None, replies)
    return f"ok: {len(outcomes)} {what} /runs replied 200 with a numeric reward and no failure"


# --- the run -----------------------------------------------------------------------------------------------


@attrs.frozen
class RealModelResult:
    """What a real-model run saw and judged; `not_checked` names every check this mode cannot make."""

    model_url: str
    model: str
    rollouts: int
    finished: int
    exported: int
    stage_s: dict[str, float]
    verdicts: dict[str, str]
    not_checked: dict[str, str] = attrs.field(factory=lambda: dict(NOT_CHECKED))

    def table(self) -> str:
        lines = [
            f"real model {self.model!r} at {self.model_url}: {self.rollouts} rollouts, {self.finished} finished "
            f"before the checkpoint, {self.exported} exported and continued",
            f"{'stage':<12} {'wall s':>9}",
            *(f"{stage:<12} {seconds:>9.3f}" for stage, seconds in self.stage_s.items()),
            *(f"{name}: {verdict}" for name, verdict in self.verdicts.items()),
            *(f"{name}: {why}" for name, why in self.not_checked.items()),
        ]
        return "\n".join(lines)


def rollout_ids(count: int) -> tuple[str, ...]:
    if count < 2:
        raise ValueError(f"'rollouts' must be at least 2, one to finish and one in flight (got {count})")
    width = len(str(count - 1))
    return tuple(f"{ROLLOUT_PREFIX}{index:0{width}d}" for index in range(count))


class _RealRun:
    """One real-model run over a started harness: the steps of `run_real_model` in order."""

    def __init__(self, harness: Harness, rollouts: Sequence[str]) -> None:
        assert harness.control is not None, "begin_example starts Gym and discovers the participants"
        self.harness = harness
        self.rollouts = tuple(rollouts)
        self.sender = RunSender(harness.run_url, connect_timeout_s=STALL_S)
        self.directory = str(harness.checkpoint_dir / CHECKPOINT_ID)
        self.replied_at_prepare: set[str] = set()

    def dispatch(self) -> None:
        """Half, until one of them replies; then the rest, until the environment admitted every one still running
        (a /run that arrived after prepare closed admission would be refused, neither finished nor exported)."""
        first = self.rollouts[: len(self.rollouts) // 2]
        self._send(first, 0)
        wait_for(lambda: len(replied(self.sender.outcomes(first))), 1, "a rollout replied", stall_s=STALL_S)
        self._send(self.rollouts[len(first) :], 0)
        wait_for(self._admitted_or_ended, len(self.rollouts), "every rollout admitted or ended", stall_s=STALL_S)

    def _admitted_or_ended(self) -> int:
        control = self.harness.control
        assert control is not None
        episodes = sum(
            int(control.status(member)["report"]["counts"].get("episodes", 0))
            for member in control.participants.of_kind("environment")
        )
        return episodes + self.sender.ended(self.rollouts)

    def prepare(self) -> None:
        control = self.harness.control
        assert control is not None
        result = control.prepare(CHECKPOINT_ID, time.time() + CONTROL_DEADLINE_S)
        self.replied_at_prepare = replied(self.sender.outcomes(self.rollouts))
        if not result.prepared:
            raise RealModelError(f"prepare of {CHECKPOINT_ID} did not complete: blockers {result.blockers()}")

    def commit(self) -> list[str]:
        """Commit every rollout that has not replied; returns what the environment exported."""
        control = self.harness.control
        assert control is not None
        scope = [EpisodeId(rollout_id=key) for key in self.rollouts if key not in replied(self._outcomes())]
        committed = control.commit(CHECKPOINT_ID, self.directory, scope, time.time() + CONTROL_DEADLINE_S)
        return list(committed["environment"]["episode_ids"])

    def crash(self) -> None:
        """SIGKILL every Gym process group and start fresh ones; ends when every first /run has ended."""
        self.harness.crash()
        everything = len(self.rollouts)
        wait_for(lambda: self.sender.ended(self.rollouts), everything, "every /run ended at the crash", stall_s=STALL_S)

    def restore_and_resume(self, exported: Sequence[str]) -> dict[str, Any]:
        """Restore the exported rollouts everywhere, then resume; the restore's replies by participant."""
        control = self.harness.control
        assert control is not None
        scope = [EpisodeId(rollout_id=key) for key in exported]
        replies = control.restore(RESTORE_ID, self.directory, scope, time.time() + CONTROL_DEADLINE_S)
        control.resume(RESTORE_ID, time.time() + CONTROL_DEADLINE_S)
        return replies

    def episode_owners(self) -> list[str]:
        control = self.harness.control
        assert control is not None
        return [member.name for member in control.participants.of_kind("environment")]

    def replacements(self, exported: Sequence[str]) -> dict[str, RunOutcome | None]:
        """Every exported rollout runs again as attempt 1, to a reply."""
        self._send(exported, 1)
        keys = [capture_key(key, 1) for key in exported]
        wait_for(lambda: self.sender.ended(keys), len(keys), "every replacement replied", stall_s=STALL_S)
        return self.sender.outcomes(keys)

    def _send(self, rollouts: Iterable[str], attempt: int) -> None:
        self.sender.send({capture_key(key, attempt): native_run_body(key, attempt) for key in rollouts})

    def _outcomes(self) -> dict[str, RunOutcome | None]:
        return self.sender.outcomes(self.rollouts)

    def close(self) -> None:
        self.sender.close()


def run_real_model(
    model_url: str,
    *,
    model_name: str | None = None,
    rollouts: int = ROLLOUTS,
    progress: Callable[[str], None] | None = None,
) -> RealModelResult:
    """The seed's real-model test against the model server at `model_url`: the verdicts, or the violated property
    (`P1Violation` ... `P3Violation`), or a `HarnessError` (`RealModelError`: the server cannot serve the run, or a
    wait ran out). Starts the look-alike Gym servers (native topology) and stops them all before it returns."""
    names = rollout_ids(rollouts)
    base_url = model_base_url(model_url)
    say = progress or (lambda _line: None)
    with new_http_client(httpx.Timeout(STALL_S, connect=CONNECT_TIMEOUT_S)) as http:
        model = served_model(base_url, http, model_name)
        say(f"model {model!r} at {base_url}; probing one chat call with a tool ...")
        probe_chat(base_url, model, http)
    deployment = system().deployment(TOPOLOGY, model_url=base_url, model_name=model)
    try:
        harness = Harness(deployment, spec=DeploymentSpec(TOPOLOGY))
    except BaseException:
        deployment.close()
        raise
    try:
        harness.begin_example()
        run = _RealRun(harness, names)
        try:
            stage_s, verdicts, finished, exported = _checked_run(run, say)
        except Exception as error:  # a violation, a harness error, or a control call that failed
            error.add_note(f"server log tails:\n{harness.log_tails(LOG_LINES_SHOWN)}")
            raise
        finally:
            run.close()
    finally:
        harness.close()
    return RealModelResult(
        model_url=base_url,
        model=model,
        rollouts=rollouts,
        finished=finished,
        exported=exported,
        stage_s=stage_s,
        verdicts=verdicts,
    )


def _timed(stage_s: dict[str, float], say: Callable[[str], None], stage: str, work: Callable[[], T]) -> T:
    say(f"{stage} ...")
    started = time.perf_counter()
    result = work()
    stage_s[stage] = time.perf_counter() - started
    say(f"{stage}: {stage_s[stage]:.3f} s")
    return result


def _checked_run(run: _RealRun, say: Callable[[str], None]) -> tuple[dict[str, float], dict[str, str], int, int]:
    stage_s: dict[str, float] = {}
    _timed(stage_s, say, "dispatch", run.dispatch)
    _timed(stage_s, say, "prepare", run.prepare)
    exported = _timed(stage_s, say, "commit", run.commit)
    _timed(stage_s, say, "crash", run.crash)
    first = run.sender.outcomes(run.rollouts)
    finished = replied(first)
    verdicts = {
        "silent while checkpointed (P2)": check_silent(exported, finished - run.replied_at_prepare),
        "finished and exported (P1)": check_cover(run.rollouts, finished, exported),
        "finished well formed (P3)": check_well_formed({key: first[key] for key in sorted(finished)}, "finished"),
    }
    restored = _timed(stage_s, say, "restore", lambda: run.restore_and_resume(exported))
    verdicts["restore answered (P15)"] = check_restored(restored, run.episode_owners(), exported)
    replacements = _timed(stage_s, say, "replacement", lambda: run.replacements(exported))
    verdicts["replacements complete (P3)"] = check_well_formed(replacements, "replacement")
    return stage_s, verdicts, len(finished), len(exported)


def check_restored(replies: Mapping[str, Any], owners: Sequence[str], exported: Sequence[str]) -> str:
    """Every restore reply names the committed checkpoint as its source, and each episode owner's names exactly
    the next attempts of the exported rollouts (reference 2.5)."""
    p15_restore_names_source(RESTORE_ID, CHECKPOINT_ID, replies)
    want = [capture_key(key, 1) for key in exported]
    for owner in owners:
        p15_restored_next_attempts(RESTORE_ID, owner, want, replies.get(owner, {}).get("restored"))
    return f"ok: {len(replies)} participants restored from {CHECKPOINT_ID}; {len(want)} next attempts installed"


def model_url_from_env() -> str | None:
    """`CKPT_MODEL_MODEL_URL`, or None when unset or empty (real-model mode is opt-in)."""
    return os.environ.get(MODEL_URL_ENV) or None


def model_name_from_env() -> str | None:
    return os.environ.get(MODEL_NAME_ENV) or None
