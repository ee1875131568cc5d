"""The system under test ckpt-model ships: a look-alike of NeMo Gym's checkpointing servers.

`fakes.backend` is the fake inference backend and token store (it outlives Gym crashes); `fakes.gym` holds the
four participant servers and their shared control plane; `fakes.stack` launches a whole deployment.
"""
