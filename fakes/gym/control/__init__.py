"""The checkpoint control plane every look-alike server shares: its routes, phases, fencing, replay, deadlines, the
lease, retired attempts, the store and telemetry; a server plugs in only its `Participant`."""
