"""The benchmarks' data files are what their script and sources say they are.

Speed itself is measured by ``make bench`` and ``python -m benchmarks.compare``, never here.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "benchmarks" / "data"


def make_bench_data():
    spec = importlib.util.spec_from_file_location("make_bench_data", REPO / "scripts" / "make_bench_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_chapter_toy_trace_is_what_its_script_makes_and_extends_the_toys_own_200():
    text = make_bench_data().chapter_toy_csv(5000)
    assert (DATA / "chapter_toy_5000.csv").read_text(encoding="utf-8") == text
    scaled = pd.read_csv(DATA / "chapter_toy_5000.csv")
    own = pd.read_csv(REPO / "scenarios" / "data" / "chapter_toy.csv")  # recorded by running the chapter's code
    assert len(scaled) == 5000
    pd.testing.assert_frame_equal(scaled.head(len(own)), own)


def test_the_azure_lengths_are_the_conversation_traces_two_columns():
    lengths = pd.read_csv(DATA / "azure_conv_2023_lengths.csv")
    assert list(lengths.columns) == ["ContextTokens", "GeneratedTokens"]
    # The trace's published figures (shared/data/traces/NOTICE.md): 19,366 requests, means 1,155 and 211.
    assert len(lengths) == 19_366
    assert round(lengths["ContextTokens"].mean()) == 1155 and round(lengths["GeneratedTokens"].mean()) == 211
    assert lengths.iloc[0].tolist() == [374, 44]  # the trace's first row, 2023-11-16 18:15:46.68

