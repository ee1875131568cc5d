"""`python -m fakes.collection CONFIG.json`: one collection run; exit 0 when every row is collected, 75 when a
SIGTERM stopped it after a published checkpoint, 1 when it stopped otherwise, 2 for a config it cannot run."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from fakes.collection.collector import Collector
from fakes.collection.config import CollectionConfig, ConfigError
from fakes.collection.layout import LayoutError
from fakes.collection.rows import RowError


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fakes.collection", description=__doc__.split("\n\n")[0])
    parser.add_argument("config", type=Path, help="the collection config (JSON)")
    parser.add_argument(
        "--telemetry-dir",
        type=Path,
        help="write the controller's spans to DIR/collection-<pid>.jsonl (docs/protocol.md)",
    )
    arguments = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    try:
        collector = Collector(CollectionConfig.from_file(arguments.config), telemetry_dir=arguments.telemetry_dir)
    except (ConfigError, RowError, LayoutError, OSError) as exc:
        print(f"collection: {exc}", file=sys.stderr)
        return 2
    return collector.run()


if __name__ == "__main__":
    raise SystemExit(main())
