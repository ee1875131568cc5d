"""The commands of `ckpt-model`, one module per group; `ckpt_model.cli` parses the command line and calls them."""
