"""Write ``docs/accuracy.json`` and ``docs/accuracy.md``: every real vLLM run the project holds, simulated.

Simulates each case of :mod:`simbatch.app.accuracy` from its preset and from costs calibrated on
the server's other runs (a minute or so), stores the record and renders the page from it.
``tests/test_accuracy.py`` fails when the page no longer says what the code computes; rerun

    .venv/bin/python scripts/gen_accuracy.py
"""

from __future__ import annotations

import argparse
from pathlib import Path

from simbatch.app import accuracy

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "docs" / "accuracy.json"
PAGE = ROOT / "docs" / "accuracy.md"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    record = accuracy.evaluate()
    RECORD.write_text(record.to_json(), encoding="utf-8")
    PAGE.write_text(accuracy.render(record), encoding="utf-8")
    print(f"wrote {RECORD} and {PAGE}")


if __name__ == "__main__":
    main()
