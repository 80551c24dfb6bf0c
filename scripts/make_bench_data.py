"""Write the data files of benchmarks B7 and B8 (``benchmarks/data``; its README says what each holds).

- ``chapter_toy_5000.csv``: the continuous-batching chapter's toy workload
  (``shared/reference/continuous-batching-chapter.txt``), scaled from its 200 requests to 5,000. The
  chapter draws with Python's ``random`` seeded with 0, per request in this order: the gap since the
  previous arrival, uniform on 0..2 iterations; the prompt, one of 20, 40, 80 or 600 tokens; the
  output, one of 8, 16, 32, 256 or 256 (256 twice: two chances in five). The same draws in the same
  order give the same sequence, so the first 200 rows are ``scenarios/data/chapter_toy.csv``
  (``tests/test_benchmarks.py`` checks both that and that this script rewrites the file byte for byte).
- ``azure_conv_2023_lengths.csv``: the two length columns (``ContextTokens``, ``GeneratedTokens``)
  of the Azure LLM inference trace 2023, conversation service, every row in the trace's order; the
  timestamps are left out. Read from ``../shared/data/traces/AzureLLMInferenceTrace_conv.csv`` beside
  the checkout (or ``--azure PATH``); without it the shipped file is left as it is.

Run it from the repository root: ``.venv/bin/python scripts/make_bench_data.py``.
"""

from __future__ import annotations

import argparse
import csv
import io
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "data"
AZURE_CONV = ROOT.parent / "shared" / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv"
LENGTH_COLUMNS = ("ContextTokens", "GeneratedTokens")

TOY_SEED = 0
TOY_MAX_GAP_ITERATIONS = 2
TOY_PROMPTS = (20, 40, 80, 600)
TOY_OUTPUTS = (8, 16, 32, 256, 256)


def chapter_toy_csv(num_requests: int) -> str:
    """The toy's first ``num_requests`` requests as ``arrival_s,prompt_tokens,output_tokens`` (one iteration = 1 s)."""
    draw = random.Random(TOY_SEED)
    lines, arrival = ["arrival_s,prompt_tokens,output_tokens"], 0
    for _ in range(num_requests):
        arrival += draw.randint(0, TOY_MAX_GAP_ITERATIONS)
        prompt = draw.choice(TOY_PROMPTS)
        output = draw.choice(TOY_OUTPUTS)
        lines.append(f"{arrival},{prompt},{output}")
    return "\n".join(lines) + "\n"


def length_columns_csv(trace: Path) -> str:
    """The trace's prompt and output length columns, every row, in its order."""
    out = io.StringIO()
    with trace.open(newline="", encoding="utf-8") as f:
        rows = csv.DictReader(f)
        out.write(",".join(LENGTH_COLUMNS) + "\n")
        for row in rows:
            out.write(",".join(row[c] for c in LENGTH_COLUMNS) + "\n")
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--azure", type=Path, default=AZURE_CONV, help="the Azure 2023 conversation trace")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "chapter_toy_5000.csv").write_text(chapter_toy_csv(5000), encoding="utf-8")
    print(f"wrote {OUT / 'chapter_toy_5000.csv'}")
    if args.azure.is_file():
        (OUT / "azure_conv_2023_lengths.csv").write_text(length_columns_csv(args.azure), encoding="utf-8")
        print(f"wrote {OUT / 'azure_conv_2023_lengths.csv'}")
    else:
        print(f"{args.azure} not found: azure_conv_2023_lengths.csv left as it is")


if __name__ == "__main__":
    main()
