"""The protocol as the checker reads it: Gym's wire schemas and their fields, the controller's client (its replies
read in `replies`, its HTTP plumbing in `http`), and the checker's own readers of what a deployment leaves
(checkpoint directories, capture ledgers, telemetry, a collection's checkpoints), with the append-only history of
what was observed. Nothing here knows the model or the machine."""
