"""Searching and replaying: `check`'s search (with aimed rounds), the fault search over planted faults, fuzzing on
many cores, the Hypothesis profiles, fixed scenarios (`protocol_scenarios`, `deployment_scenarios`) run as
`scenarios` runs them and the replay of regression files, and the domain minimiser; each runs either controller's
machine through one small protocol (`controllers`), and `targets` reads what `check` checks from its options."""
