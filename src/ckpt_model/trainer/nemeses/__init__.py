"""The nemesis families: one module per fault family, each a mixin of `pipeline.MachineBase` holding its
`Family` declaration, its rules and the effects only that family causes, which `machine.CheckpointMachine` mounts
as one base each. The kills several families share are `ckpt_model.trainer.kills`'s; the commit that meets a fault on
one participant, which storage, pauses and hooks each make their own, is `MachineBase._write_fault`. A family whose
effects outgrow its module keeps them in a sibling (`damaged_copies`, the damage family's file surgery).

Hypothesis collects a machine's rules over its whole class hierarchy (sorted by name), so a rule plays and draws
the same wherever it is declared; `steplog.families_of` reads each rule's family from its `action`.
"""
