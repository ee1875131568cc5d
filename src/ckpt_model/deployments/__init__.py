"""The deployment seam and the harness the machines drive through it: starting, crashing and observing a system
(the look-alike stack found by entry point, or a real Gym), its pre-flight, what a run keeps, collection runs, and
the one back-off poll every wait uses."""
