"""The pure model: the controller contract as a frozen value with one function per rule (`contract`) and the quiet
state it predicts (`expectation`), token lineage and rollout outcomes predicted as values, the topologies as a table
of traits, and a deployment as one frozen `DeploymentSpec`. No I/O: unit-tested on hand-built values."""
