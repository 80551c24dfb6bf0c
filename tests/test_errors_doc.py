"""Every kind of bad input in ``docs/errors.md``: its exit code, one line on stderr, no traceback.

The cases live in ``scripts/gen_errors_doc.py``, which runs each one to write the page; here each
runs as its own test, and the committed page must be what the script prints today.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("gen_errors_doc", ROOT / "scripts" / "gen_errors_doc.py")
gen = importlib.util.module_from_spec(_spec)
sys.modules["gen_errors_doc"] = gen  # its dataclasses look their module up by name
_spec.loader.exec_module(gen)


# One worker takes every case (make test distributes by group): the cases run once, not once per worker.
pytestmark = pytest.mark.xdist_group("errors_doc")


@pytest.fixture(scope="module")
def outcomes() -> dict[str, object]:
    """Every case run once, shared by the per-case checks and the page."""
    return {case.kind: gen.run_case(case) for case in gen.CASES}


@pytest.mark.parametrize("case", gen.CASES, ids=[c.kind for c in gen.CASES])
def test_each_bad_input_ends_with_its_code_and_one_line(case, outcomes):
    outcome = outcomes[case.kind]
    assert outcome.exit_code == case.code, outcome
    assert "Traceback" not in outcome.stderr + outcome.stdout and "Exception" not in outcome.stderr
    if case.code == 2:
        # Bad input: one line, nothing on stdout, no control character reaching the terminal.
        assert len(outcome.stderr.splitlines()) == 1, outcome.stderr
        assert outcome.stdout == ""
        assert all(ch == "\n" or ch.isprintable() for ch in outcome.stderr), outcome.stderr
    else:
        assert outcome.stderr.strip(), "a partial result must say what failed"


def test_errors_doc_is_generated(outcomes):
    committed = (ROOT / "docs" / "errors.md").read_text(encoding="utf-8")
    assert committed == gen.render(outcomes), "docs/errors.md is stale: run .venv/bin/python scripts/gen_errors_doc.py"
