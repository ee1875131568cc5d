"""A look-alike of Gym's rollout collection as a checkpointing controller (reference Appendix C, section 12.2).

`python -m fakes.collection CONFIG.json` reads input rows, sends each to the deployment's `/run` and appends every
reply to the output file; on SIGUSR1 (checkpoint, then continue), SIGTERM (checkpoint, then exit 75) or a timer it
checkpoints the Gym servers through their control planes, publishes `collection.json` and points `LATEST` at it;
a rerun with `resume_from_cache` restores the latest checkpoint and continues its rollouts as attempt + 1.
"""
