"""The nemesis families: one module per fault family, each a mixin of `pipeline.MachineBase` holding its
`Family` declaration and its rules, which `machine.CheckpointMachine` mounts as one base each.

Hypothesis collects a machine's rules over its whole class hierarchy (sorted by name), so a rule plays and draws
the same wherever it is declared; `steplog.families_of` reads each rule's family from its `action`.
"""
