"""What every machine's steps share: the step log (labels, rule calls, the failure attached to what raised), the
fair draw by family, the families and coverage goals, swarm testing, and what a deployment lets the checker check."""
