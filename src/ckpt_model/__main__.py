"""`python -m ckpt_model`: the `ckpt-model` command line (see `ckpt_model.cli`)."""

from ckpt_model.cli import entry

if __name__ == "__main__":
    entry()
