"""A stand-in for `Harness` in unit tests of what writes a failure's files: a private one (its regression files go
to its own directory; no run store) unless a test begins a run store on it (`runstore.begin`)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ckpt_model.model.spec import DeploymentSpec


def fake_harness(root: Path, spec: DeploymentSpec | None = None, **more: Any) -> SimpleNamespace:
    """A harness rooted at `root`, its regression files in `root/regressions`."""
    return SimpleNamespace(
        root=root,
        regressions_dir=root / "regressions",
        spec=spec or DeploymentSpec("native"),
        artifacts=None,
        run_store=None,
        run_dir=None,
        failure_files={},
        **more,
    )
