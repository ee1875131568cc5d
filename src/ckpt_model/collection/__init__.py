"""Rollout collection as a controller (reference Appendix C): the state machine that starts collection runs and
interrupts them, its prediction as a frozen value, its families, coverage goals and where it judges what, and the
recording relay that shows the checker the calls of a controller it does not own."""
