"""The controller contract's properties (SPEC section 5), one module per family; each property is a named check
with its own violation type.

Hypothesis tells bugs apart by exception type and raise location, so every property raises its own subclass of
`PropertyViolation`; one shared `AssertionError` would merge them into one "bug" while shrinking. Each check is a
plain function over model values, observations and the history; it raises or returns None. The audits, the settle
and the watchers call them (`ckpt_model.trainer`), as do the modes and the collection machine.

- `scope`: P1 replied or exported (what a commit writes, restarts reported and never exported)
- `continuation`: P2 silent while prepared, P3 continuations complete, P4 continued not redone, P14 resumed equals
  uninterrupted
- `state`: P6 state restored, P7 retire stops everywhere, P8 restore all or nothing, P13 clean end
- `durability`: P9 durable and immutable, P16 failed, stalled and paused commits
- `fencing`: P10 phases and fencing (and the settle's verdicts on statuses)
- `verification`: P11 verification
- `identifiers`: P15 identifiers
- `network`: P17 lost replies, P19 unreachable participants
- `clocks`: P18 skewed clocks, P20 time passing, P21 paused participants
- `telemetry`: P26 telemetry tells the truth, live and offline
- `collection`: P22-P25, rollout collection as a controller; `collection_calls`: the servers' properties judged
  on a collection run's own calls
- `registry`: every property as data (ID, title, when judged, checked), which the docs table must match
- `evidence`: what several families share (how a violation shows a value, a 409 refusal, an idle status)

P5 token lineage and P12 generation cuts are judged with the prediction they check (`ckpt_model.model.lineage`).
"""
