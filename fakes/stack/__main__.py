"""`python -m fakes.stack`: one look-alike deployment by hand until SIGTERM or Ctrl-C (`fakes.stack.cli`)."""

from fakes.stack.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
