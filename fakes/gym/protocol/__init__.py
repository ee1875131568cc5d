"""The look-alike's own description of Gym's checkpoint wire protocol (routes, bodies, error codes, generation
cuts) and the HTTP plumbing every server shares. The checker keeps its own; the two meet in `tests/contract`."""
