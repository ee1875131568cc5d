"""The policy model server (Gym's vLLM model server with `checkpoint_policy: true`): its admission gate, token
capture and capture ledger, generation cuts, and its several workers behind one port."""
