"""A duration on a command line (`check --max-time`, `--progress-every`, the pytest plugin's `--ckpt-max-time`),
parsed in one place so every command reads 90, 90s, 2m and 1h alike."""

from __future__ import annotations

import argparse

UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def duration(text: str) -> float:
    """An argparse type: a duration in seconds, or with a unit (90, 90s, 2m, 1h), more than zero."""
    number, unit = (text[:-1], UNITS[text[-1]]) if text and text[-1] in UNITS else (text, 1.0)
    try:
        seconds = float(number) * unit
    except ValueError:
        seconds = 0.0
    if not seconds > 0 or seconds == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a duration such as 90, 90s, 2m or 1h (got {text!r})")
    return seconds
