"""Task names drawn at the edges of what Gym's rules allow (nemo-gym 0.7.0's `TaskId`: `taskset` and `task_id`
non-empty, `taskset` by convention `<environment>:<taskset>`; reference 5.2).

`TASK_NAMES` draws the `(taskset, task_id)` a dispatched rollout's native `/run` names (every later attempt of the
rollout names the same): tasksets with dots, dashes, several colons or none, non-ASCII letters, 200 characters;
task IDs in other scripts, with spaces, slashes, a tab or a trailing newline, a lone character, a whitespace-only
one, 500 characters; and the weather task's own name. The episode is the weather task whatever its name, so only
the name changes: the reply must echo it (P15) and P14 reads it as the run's own.
"""

from __future__ import annotations

from hypothesis import strategies as st

from ckpt_model.protocol.gym_tasks import WEATHER_TASK, TaskName

TASK_NAME_LONG = 500
_ENVIRONMENTS = ("example_single_tool_call", "env.v1", "ünï-env", "a", "x" * 100)
_TASKSETS = ("e2e", "set.a", "b-1_2:v2", "天気", "y" * 99)
_ODD_TASKSETS = ("no-colon", ":", "a:", ":b")
_TASK_IDS = (
    "weather-sf",
    "天気/サンフランシスコ",
    "task 1",
    "a",
    "0",
    " ",
    "tab\tinside",
    "trailing newline\n",
    'quote"d\\back',
    "emoji-🌤",
    "z" * TASK_NAME_LONG,
)
_PRINTABLE = st.characters(blacklist_categories=("Cs", "Cc"))

_TASKSET = st.one_of(
    st.builds(lambda env, taskset: f"{env}:{taskset}", st.sampled_from(_ENVIRONMENTS), st.sampled_from(_TASKSETS)),
    st.sampled_from(_ODD_TASKSETS),
)
_TASK_ID = st.one_of(st.sampled_from(_TASK_IDS), st.text(_PRINTABLE, min_size=1, max_size=8))
TASK_NAMES: st.SearchStrategy[TaskName] = st.one_of(st.just(WEATHER_TASK), st.tuples(_TASKSET, _TASK_ID))
