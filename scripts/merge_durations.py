"""Merge recorded test durations into tests/durations.json (what `--shard` balances `make test` by).

    LANE2_DURATIONS_DIR=/tmp/d make test      # each share records its tests' seconds there
    python scripts/merge_durations.py /tmp/d/*.json

A test measured again takes its new figure; tests no longer collected keep theirs until removed by hand
(they cost nothing: sharding counts only the selected tests).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DURATIONS = Path(__file__).resolve().parent.parent / "tests" / "durations.json"


def main(argv: list[str] | None = None) -> int:
    """Merge the files named on the command line into tests/durations.json."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path, help="JSON files written by --record-durations")
    args = parser.parse_args(argv)
    merged: dict[str, float] = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    for path in args.files:
        try:
            found = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            print(f"merge_durations: cannot read {path}: {exc}; pass the files --record-durations wrote")
            return 2
        merged.update({str(k): float(v) for k, v in found.items()})
    DURATIONS.write_text(json.dumps(dict(sorted(merged.items())), indent=1) + "\n")
    print(f"merge_durations: {len(merged)} tests, {sum(merged.values()) / 60:.1f} min in all -> {DURATIONS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
