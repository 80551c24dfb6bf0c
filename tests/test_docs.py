"""The documentation cannot drift from the code it describes.

- ``docs/scenarios.md`` is exactly what ``scripts/gen_scenarios_doc.py`` prints, and lists every key
  of the scenario's JSON Schema (an independent walk of the same models);
- ``docs/concepts.md`` quotes the metric definitions of ``simbatch/analysis/summary.py`` verbatim and
  names every key a summary can hold;
- every relative link and image in the Markdown files resolves;
- the README's Python example and its figure script still run.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
from pathlib import Path

import pytest

import simbatch
from simbatch.analysis import summary as summary_module

ROOT = Path(__file__).resolve().parents[1]
MARKDOWN = [ROOT / "README.md", ROOT / "notebooks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = _script("gen_scenarios_doc")


# --------------------------------------------------------------------------- docs/scenarios.md
def test_scenarios_doc_is_generated():
    committed = (ROOT / "docs" / "scenarios.md").read_text(encoding="utf-8")
    assert committed == gen.render(), "docs/scenarios.md is stale: run .venv/bin/python scripts/gen_scenarios_doc.py"


def _schema_keys(schema: dict) -> set[str]:
    """Dotted keys (list items as ``[]``) of every property in the Scenario JSON Schema."""
    defs = schema.get("$defs", {})
    keys: set[str] = set()

    def walk(node: dict, prefix: str) -> None:
        if "$ref" in node:
            node = defs[node["$ref"].rsplit("/", 1)[-1]]
        if "discriminator" in node or ("oneOf" in node and prefix.endswith(("prompt_tokens.", "output_tokens."))):
            return  # length distributions have their own section, keyed without a prefix
        for option in node.get("anyOf", []) + node.get("oneOf", []):
            walk(option, prefix)
        if node.get("type") == "array" and "items" in node:
            walk(node["items"], prefix[:-1] + "[].")
        for name, child in node.get("properties", {}).items():
            keys.add(prefix + name)
            walk(child, f"{prefix}{name}.")

    walk(schema, "")
    return keys


def _documented_keys(text: str) -> set[str]:
    """Keys in table rows, plus the sections (``## `workload` ``) that head their own table."""
    rows = re.findall(r"^\| `([^`]+)` \|", text, flags=re.MULTILINE)
    return set(rows) | set(re.findall(r"^## `([^`]+)`$", text, flags=re.MULTILINE))


def _cells(row: str) -> list[str]:
    """A Markdown table row's cells; ``\\|`` inside a cell is an escaped pipe, not a separator."""
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", row)[1:-1]]


def test_scenarios_doc_lists_every_schema_key():
    documented = _documented_keys(gen.render())
    missing = _schema_keys(simbatch.Scenario.model_json_schema()) - documented
    assert not missing, f"keys the validator accepts but docs/scenarios.md omits: {sorted(missing)}"


def test_every_length_distribution_is_documented():
    text = gen.render()
    for model in gen.typing.get_args(gen.LENGTH_UNION):
        tag = gen.typing.get_args(model.model_fields["dist"].annotation)[0]
        assert f"### `dist: {tag}`" in text
        for field in model.model_fields:
            assert f"| `{field}` |" in text


def test_every_documented_key_has_a_meaning():
    rows = [line for line in gen.render().splitlines() if line.startswith("| `")]
    assert rows
    blank = [_cells(row)[0] for row in rows if not _cells(row)[-1]]
    assert not blank, f"keys without a description in simbatch/config/__init__.py: {blank}"


@pytest.mark.parametrize(("key", "unit"), [
    ("device.tau0_ms", "ms"), ("workload.duration_s", "s"), ("device.prefill_ms_per_token", "ms/token"),
    ("kv_cache.block_size", "tokens/block"), ("workload.arrival.rate", "requests/s"),
    ("batching.max_num_batched_tokens", "tokens"), ("batching.mode", ""),
])
def test_units_come_from_names_and_descriptions(key, unit):
    row = next(line for line in gen.render().splitlines() if line.startswith(f"| `{key}` |"))
    assert _cells(row)[2] == unit


# --------------------------------------------------------------------------- docs/concepts.md
CONCEPTS = ROOT / "docs" / "concepts.md"


def test_concepts_quotes_the_metric_definitions_verbatim():
    text = CONCEPTS.read_text(encoding="utf-8")
    block = re.search(r"<!-- BEGIN summary.py docstring -->\n```text\n(.*?)\n```\n<!-- END", text, re.DOTALL)
    assert block, "the quoted docstring block is missing from docs/concepts.md"
    assert block.group(1) == inspect.cleandoc(summary_module.__doc__), \
        "simbatch/analysis/summary.py's docstring changed: paste it into docs/concepts.md"


def test_concepts_names_every_summary_key():
    scenario = simbatch.Scenario.model_validate({
        "workload": {"num_requests": 40, "arrival": {"rate": 20}, "max_concurrency": 8,
                     "classes": [{"name": "chat"}, {"name": "batch"}]},
        "cluster": {"replicas": 2},
        "slo": {"ttft_ms": 100, "tpot_ms": 50, "e2el_ms": 5000},
        "metrics": {"metric_percentiles": [95, 99.9]},
    })
    keys = simbatch.simulate(scenario).summary
    text = CONCEPTS.read_text(encoding="utf-8")

    def named(key: str) -> bool:
        if stat := re.fullmatch(r"(?:mean|median|std|p90|p99)_(\w+)_ms", key):
            return f"*_{stat.group(1)}_ms" in text or f"{{mean,median,std,p90,p99}}_{stat.group(1)}_ms" in text
        if re.fullmatch(r"p\d+(?:\.\d+)?_(ttft|tpot|itl|e2el)_ms", key):
            return "p<P>_<metric>_ms" in text
        if per_tenant := re.fullmatch(r"tenant_(?:chat|batch)_(\w+)", key):
            return f"tenant_<name>_{per_tenant.group(1)}" in text
        if per_replica := re.fullmatch(r"replica_\d+_(\w+)", key):
            return f"replica_{{r}}_{per_replica.group(1)}" in text
        return f"`{key}`" in text

    assert not [k for k in keys if not named(k)]


# --------------------------------------------------------------------------- links and the README
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", MARKDOWN, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    broken = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+://|mailto:|#", target):
            continue
        path = (page.parent / target.split("#", 1)[0]).resolve()
        if not path.exists():
            broken.append(target)
    assert not broken, f"{page.name}: broken links {broken}"


def test_readme_starts_with_the_two_setup_commands():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    first_block = re.search(r"```\w*\n(.*?)```", text, re.DOTALL).group(1)
    assert [line.split("#")[0].strip() for line in first_block.strip().splitlines()] == ["make run", "make test"]


def test_readme_python_example_runs(monkeypatch, capsys):
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    (example,) = re.findall(r"```python\n(.*?)```", text, re.DOTALL)
    monkeypatch.chdir(ROOT)  # the example names scenario files relative to the repository root
    exec(compile(example, "README.md", "exec"), {})
    assert capsys.readouterr().out.startswith("stable (offered load 85%)\n")


def test_readme_figure_script_draws_the_figure(tmp_path):
    out = tmp_path / "figure.png"
    _script("make_readme_figure").main(["--small", "--out", str(out)])
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --------------------------------------------------------------------------- named scenario files
def test_every_scenario_file_named_in_docs_help_and_lessons_exists():
    """A `scenarios/x.yaml` quoted in prose or in a command's --help is one a reader can run."""
    sources = [*MARKDOWN, *(ROOT / "simbatch" / "cli").glob("*.py"), *(ROOT / "notebooks").glob("*.ipynb")]
    named = {m for path in sources for m in re.findall(r"scenarios/(\w+)\.yaml", path.read_text(encoding="utf-8"))}
    assert named, "the pattern found nothing: the test would pass vacuously"
    missing = sorted(n for n in named if not (ROOT / "scenarios" / f"{n}.yaml").is_file())
    assert not missing, f"named but not shipped: {missing}"
