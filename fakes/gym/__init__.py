"""Look-alike NeMo Gym participant servers and their shared checkpoint control plane.

Its packages, each importing only those listed before it:

    faults/     what the checker arms at run time through `/_ctl` routes: failpoints, hooks that raise, storage
                faults, lost replies, timeouts on the wall clock, power cuts
    protocol/   the stack's own description of Gym's wire (routes, bodies, refusals, generation cuts) and its HTTP
    control/    the checkpoint control plane every server shares, and what a participant plugs into it
    workers/    several uvicorn workers behind one port: coordinator and worker processes, their channel, placement
    servers/    the environment, agent and resources servers
    policy/     the policy model server: its admission gate, token capture, capture ledger and workers

Beside them: `config` (how a server learns who it is), `server_logs` (what it writes to its log) and `serve`
(`python -m fakes.gym.serve`, one server process).
"""
