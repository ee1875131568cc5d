"""How the model names a checkpoint: the ID its prepare, commit and resume carry on the wire, and a restore's.

An example's checkpoints are named with the latest drawn stem (`ckpt_model.trainer.checkpoint_ids`), numbered apart
by the model's checkpoint sequence as rollout IDs are (`rollout_names.numbered_apart`): its dots, dashes and
underscores, its `-a1`, `.`, `_` or `-` ending reach the wire unchanged, and a long stem is trimmed at its start to
the 128 characters Gym allows (reference 2.2). With no stem drawn a checkpoint is `c<seq>`, as it always was.

A restore runs under `<checkpoint>-restore<seq>`, the checkpoint's part trimmed when the whole would pass 128
characters; the model keeps which checkpoint each restore named (`Model.restores`), so nothing reads it back
off the name. No drawn stem holds `-restore`, so a checkpoint's ID never reads as a restore's.
"""

from __future__ import annotations

from ckpt_model.model.rollout_names import numbered_apart
from ckpt_model.protocol.wire import CHECKPOINT_ID_MAX_CHARS, is_valid_checkpoint_id

RESTORE_MARK = "-restore"


def checkpoint_name(stem: str | None, seq: int) -> str:
    """The ID of the `seq`-th checkpoint (or restore) of an example, named with `stem` (None: `c<seq>`)."""
    if stem is None:
        return f"c{seq}"
    name = numbered_apart(stem, seq, CHECKPOINT_ID_MAX_CHARS)
    if not is_valid_checkpoint_id(name) or RESTORE_MARK in name:
        raise ValueError(f"the drawn checkpoint stem {stem!r} names {name!r}, which the model cannot use")
    return name


def probe_name(purpose: str, checkpoint_id: str) -> str:
    """A checkpoint ID of the checker's own for a probe beside `checkpoint_id` (`skew-<checkpoint>`): the
    checkpoint's part trimmed at its end when the whole would pass 128 characters, which keeps the model's number
    near its start, so two checkpoints' probes stay apart."""
    return f"{purpose}-{checkpoint_id}"[:CHECKPOINT_ID_MAX_CHARS]


def restore_name(checkpoint_id: str, seq: int) -> str:
    """The ID a restore of `checkpoint_id` runs under, the `seq`-th of the example's checkpoint sequence."""
    suffix = f"{RESTORE_MARK}{seq}"
    return f"{checkpoint_id[: CHECKPOINT_ID_MAX_CHARS - len(suffix)]}{suffix}"
