"""What one collection run is given: Gym's `RolloutCollectionConfig` fields, plus where the servers are."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs

RUN_FORMATS = ("native", "legacy")


@attrs.frozen
class CollectionFault:
    """A planted bug of the look-alike collector, off unless a config's `faults` names it; `caught_by` is the
    property (docs/collection.md) that must catch it: a collection property, or a server property judged on the
    collection's own calls."""

    name: str
    caught_by: str
    description: str


# Each a realistic bug of the classes rollout collection keeps meeting (docs/collection.md says which).
COLLECTION_FAULTS: dict[str, CollectionFault] = {
    fault.name: fault
    for fault in (
        CollectionFault(
            "resume_skips_in_flight",
            "P25",
            "a rerun skips the rows that were in flight at the stop and are not continued",
        ),
        CollectionFault(
            "rerun_skips_restore",
            "P4",
            "a rerun sends the rows LATEST continues as their next attempt without restoring the checkpoint, so "
            "each starts from scratch: a continuation's attempt and reward, the calls before the checkpoint redone",
        ),
        CollectionFault(
            "rerun_redoes_finished",
            "P25",
            "a rerun trusts the checkpoint, not the output: rows that finished are sent again",
        ),
        CollectionFault(
            "manifest_names_next_attempt",
            "P24",
            "collection.json names each continued rollout at the attempt a rerun will send, not the one exported",
        ),
        CollectionFault(
            "failed_save_publishes",
            "P22",
            "a commit some participant refused is published anyway, naming everything that was in scope",
        ),
        CollectionFault(
            "prunes_before_publish",
            "P23",
            "old checkpoints are pruned when a save begins, as if the one being written were already published",
        ),
        CollectionFault(
            "exit_75_without_checkpoint",
            "P23",
            "a SIGTERM whose checkpoint failed still exits 75 (checkpointed)",
        ),
        CollectionFault(
            "commit_in_its_own_trace",
            "P26",
            "the collector sends a checkpoint's commit in a trace of its own, not the one its prepare began, so "
            "telemetry shows the checkpoint as two",
        ),
        CollectionFault(
            "second_sigterm_exits_at_once",
            "P23",
            "a second SIGTERM while the stop's checkpoint is written exits 75 at once, the checkpoint unwritten",
        ),
    )
}
# A legacy row names its rollout in `_ng_rollout_id`; a native row in `rollout_id` beside its `task`.
LEGACY_ROLLOUT_KEY = "_ng_rollout_id"
LEGACY_ATTEMPT_KEY = "_ng_attempt_index"
DEFAULT_CONCURRENCY = 8
# Seconds a checkpoint's prepare and commit may take before the checkpoint is given up.
DEFAULT_CHECKPOINT_TIMEOUT_S = 20.0


class ConfigError(ValueError):
    """A collection config that cannot run; the message names the field."""


def _positive_or_none(value: Any) -> float | None:
    if value is None:
        return None
    number = float(value)
    if number <= 0:
        raise ConfigError(f"checkpoint_every_s must be positive or null (got {value!r})")
    return number


@attrs.frozen(kw_only=True)
class CollectionConfig:
    input_jsonl_fpath: Path = attrs.field(converter=Path)
    output_jsonl_fpath: Path = attrs.field(converter=Path)
    # The collection's checkpoints, `LATEST` and `dispatched.jsonl`; None: a run without checkpoints.
    checkpoint_dir: Path | None = attrs.field(default=None, converter=attrs.converters.optional(Path))
    # Every Gym server by name; those whose status route answers the bearer are the participants.
    servers: dict[str, str] = attrs.field(factory=dict)
    # The server whose `/run` each row is sent to (an environment, or the legacy relay).
    run_server: str = "environment"
    run_format: str = attrs.field(default="native", validator=attrs.validators.in_(RUN_FORMATS))
    token: str = ""
    resume_from_cache: bool = False
    checkpoint_every_s: float | None = attrs.field(default=None, converter=_positive_or_none)
    concurrency: int = attrs.field(default=DEFAULT_CONCURRENCY, validator=attrs.validators.ge(1))
    checkpoint_timeout_s: float = attrs.field(default=DEFAULT_CHECKPOINT_TIMEOUT_S, validator=attrs.validators.gt(0))
    faults: tuple[str, ...] = attrs.field(default=(), converter=tuple)

    def __attrs_post_init__(self) -> None:
        if self.run_server not in self.servers:
            raise ConfigError(f"run_server {self.run_server!r} is not among servers {sorted(self.servers)}")
        if self.checkpoint_dir is not None and not self.token:
            raise ConfigError("a checkpointing run needs the control bearer token (token)")
        if self.resume_from_cache and self.checkpoint_dir is None:
            raise ConfigError("resume_from_cache needs checkpoint_dir")
        unknown = sorted(set(self.faults) - set(COLLECTION_FAULTS))
        if unknown:
            raise ConfigError(f"unknown faults {unknown}; the collector's are {sorted(COLLECTION_FAULTS)}")

    @classmethod
    def from_file(cls, path: Path) -> CollectionConfig:
        try:
            document = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"{path}: {exc}") from None
        if not isinstance(document, dict):
            raise ConfigError(f"{path}: a JSON object, not {type(document).__name__}")
        unknown = sorted(set(document) - {field.name for field in attrs.fields(cls)})
        if unknown:
            raise ConfigError(f"{path}: unknown fields {unknown}")
        try:
            return cls(**document)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{path}: {exc}") from None

    def to_json(self) -> str:
        return json.dumps(attrs.asdict(self, value_serializer=lambda _i, _a, v: str(v) if isinstance(v, Path) else v))
