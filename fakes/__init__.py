"""The system under test ckpt-model ships: a look-alike of NeMo Gym's checkpointing servers.

Its parts:

    gym/            the four participant servers and their shared control plane
    backend.py      the fake inference backend and token store (it outlives Gym crashes)
    collection/     Gym's rollout collection as a checkpointing controller (`python -m fakes.collection`)
    stack/          a whole deployment launched, crashed and restarted (`python -m fakes.stack`)
    processes/      the servers' processes: process groups, ports, the fork server
    deployment.py   the stack behind the checker's deployment seam (entry point `ckpt_model.systems`)
    faults.py       the catalogue of planted faults
    clock.py        skewed clocks with libfaketime
"""
