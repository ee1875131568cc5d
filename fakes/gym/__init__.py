"""Look-alike NeMo Gym participant servers and their shared checkpoint control plane."""
