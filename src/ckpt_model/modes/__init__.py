"""Modes beside the search: scale (Gym's scenario 13), real-model mode, and the offline audit of checkpoint
directories and telemetry a run left."""
