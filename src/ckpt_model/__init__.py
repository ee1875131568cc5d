"""ckpt-model: a property-based stateful model checker for partial-rollout checkpointing."""

__version__ = "0.1.0"
