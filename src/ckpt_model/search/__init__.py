"""Searching and replaying: `check`'s search (with aimed rounds), the fault search over planted faults, fuzzing on
many cores, the Hypothesis profiles, fixed scenarios and the replay of regression files, and the domain minimiser."""
