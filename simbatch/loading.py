"""From a YAML file (plus ``--set`` overrides) to a validated :class:`~simbatch.config.Scenario`.

Errors are collected, never raised one at a time, and each carries the position in the file of
the value it complains about, so the CLI can print ``file:line:col: dotted.path: message``.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from simbatch.config import Scenario


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a scenario, located as precisely as the input allows."""

    source: str
    path: str
    message: str
    line: int | None = None
    col: int | None = None

    def __str__(self) -> str:
        where = self.source
        if self.line is not None:
            where += f":{self.line}" if self.col is None else f":{self.line}:{self.col}"
        return f"{where}: {self.path}: {self.message}" if self.path else f"{where}: {self.message}"


class ScenarioError(ValueError):
    """A scenario that cannot be used; ``problems`` says every reason."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


def parse_override(item: str) -> tuple[str, Any]:
    """``workload.arrival.rate=4`` -> (``"workload.arrival.rate"``, 4); the value is read as YAML."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ScenarioError([Problem("--set", item, "expected dotted.key=value, e.g. workload.arrival.rate=4")])
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as exc:
        raise ScenarioError([Problem("--set", key, f"value {raw!r} is not YAML: {exc}")]) from None
    if isinstance(value, str) and value.strip().lower() in ("inf", "+inf", ".inf"):
        value = math.inf
    elif isinstance(value, int | float) and ":" in raw:
        value = raw.strip()  # YAML 1.1 reads 1:30 as sexagesimal 90; nobody means that here

    return key.strip(), value


def apply_overrides(data: dict, overrides: list[tuple[str, Any]]) -> dict:
    """A copy of ``data`` with each dotted key set, creating intermediate mappings as needed.

    A numeric part indexes a list: ``workload.classes.0.share=2``.
    """
    out = copy.deepcopy(data)
    for key, value in overrides:
        node: Any = out
        parts = key.split(".")
        for depth, part in enumerate(parts):
            last = depth == len(parts) - 1
            if isinstance(node, list):
                if not part.isdigit() or int(part) >= len(node):
                    where = ".".join(parts[:depth])
                    raise ScenarioError([Problem("--set", key, f"{where!r} is a list of {len(node)}; "
                                                              f"use an index from 0 to {len(node) - 1}")])
                part = int(part)
            elif not isinstance(node, dict):
                where = ".".join(parts[:depth])
                raise ScenarioError([Problem("--set", key, f"{where!r} is not a mapping, cannot set below it")])
            if last:
                node[part] = value
            else:
                if isinstance(node, dict) and node.get(part) is None:
                    node[part] = {}
                node = node[part]
    return out


def _marks(node: yaml.Node, prefix: tuple = ()) -> dict[tuple, yaml.Mark]:
    """Map every dotted location in a composed YAML tree to the start mark of its value."""
    marks: dict[tuple, yaml.Mark] = {prefix: node.start_mark}
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = (key_node.value,)
            marks[prefix + key + ("__key__",)] = key_node.start_mark
            marks.update(_marks(value_node, prefix + key))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            marks.update(_marks(item, prefix + (str(i),)))
    return marks


def _locate(loc: tuple, marks: dict[tuple, yaml.Mark], extra_key: bool) -> yaml.Mark | None:
    # Discriminated unions add the tag ("fixed", ...) to pydantic's location; drop what is not in the file.
    path = tuple(str(p) for p in loc)
    if extra_key and path + ("__key__",) in marks:
        return marks[path + ("__key__",)]
    while path:
        if path in marks:
            return marks[path]
        path = path[:-1]
    return marks.get(())


def _clean_loc(loc: tuple, data: Any) -> str:
    """Pydantic's loc without union tags, as a dotted path the user would type."""
    parts, node = [], data
    for p in loc:
        if isinstance(node, dict) and p in node or isinstance(node, list) and isinstance(p, int) and p < len(node):
            parts.append(str(p))
            node = node[p]
        elif isinstance(node, dict | list):
            # A key that is missing (required field) or a union tag: keep real keys only.
            if isinstance(node, dict) and not isinstance(p, int) and p not in ("fixed", "uniform", "choice",
                                                                            "exponential", "lognormal",
                                                                            "zipf", "empirical", "random",
                                                                            "sharegpt", "azure-conv", "azure-code"):
                parts.append(str(p))
            node = None
        else:
            node = None
    return ".".join(parts)


def _message(err: dict) -> str:
    kind, msg = err["type"], err["msg"]
    if kind == "extra_forbidden":
        return "unknown key; remove it or check its spelling (see `simbatch schema`)"
    if kind == "missing":
        return "required field is missing"
    if kind.startswith("value_error"):
        msg = msg.removeprefix("Value error, ")
    value = err.get("input")
    shown = "" if isinstance(value, dict | list) or kind == "missing" else f" (got {value!r})"
    return f"{msg}{shown}"


def scenario_from_dict(data: Any, source: str = "<scenario>", marks: dict | None = None,
                       base_dir: Path | None = None) -> Scenario:
    """Validate a plain mapping into a Scenario, or raise ScenarioError listing every problem."""
    if not isinstance(data, dict):
        kind = "empty" if data is None else f"a {type(data).__name__}"
        raise ScenarioError([Problem(source, "", f"the scenario is {kind}; expected a YAML mapping of sections "
                                                 "(workload, device, batching, ...)")])
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            mark = _locate(err["loc"], marks or {}, err["type"] == "extra_forbidden")
            problems.append(Problem(source, _clean_loc(err["loc"], data), _message(err),
                                    None if mark is None else mark.line + 1,
                                    None if mark is None else mark.column + 1))
        raise ScenarioError(problems) from None
    scenario._base_dir = base_dir
    _check_files(scenario, source, marks or {})
    return scenario


def _check_files(scenario: Scenario, source: str, marks: dict[tuple, yaml.Mark]) -> None:
    """Data files must exist before a run starts, not halfway through it."""
    problems = []
    wl = scenario.workload
    if wl.trace is not None and not scenario.resolve(wl.trace.path).is_file():
        problems.append(Problem(source, "workload.trace.path",
                                f"file not found: {scenario.resolve(wl.trace.path)}"))
    dists = [("workload.prompt_tokens", wl.prompt_tokens), ("workload.output_tokens", wl.output_tokens)]
    for i, cls in enumerate(wl.classes or []):
        dists += [(f"workload.classes.{i}.prompt_tokens", cls.prompt_tokens),
                  (f"workload.classes.{i}.output_tokens", cls.output_tokens)]
    for where, dist in dists:
        if getattr(dist, "dist", None) == "empirical" and not scenario.resolve(dist.path).is_file():
            problems.append(Problem(source, f"{where}.path", f"file not found: {scenario.resolve(dist.path)}"))
    if problems:
        located = [(p, _locate(tuple(p.path.split(".")), marks, False)) for p in problems]
        raise ScenarioError([p if m is None else Problem(p.source, p.path, p.message, m.line + 1, m.column + 1)
                             for p, m in located])


def _from_command_line(problem: Problem, keys: list[str]) -> Problem:
    """A problem with a value given by ``--set`` is reported against ``--set``, not a line of the file."""
    if any(problem.path == k or problem.path.startswith(k + ".") for k in keys):
        return Problem("--set", problem.path, problem.message)
    return problem


def load_scenario(path: str | Path, overrides: list[str] | None = None) -> Scenario:
    """Read, override and validate a scenario file. Raises ScenarioError with every problem found."""
    path = Path(path)
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ScenarioError([Problem(source, "", "file not found")]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError([Problem(source, "", f"cannot read the file: {exc}")]) from None
    try:
        node = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        raise ScenarioError([Problem(source, "", f"not valid YAML: {problem}",
                                     None if mark is None else mark.line + 1,
                                     None if mark is None else mark.column + 1)]) from None
    marks = _marks(node) if node is not None else {}
    parsed = [parse_override(o) for o in overrides or []]
    if parsed:
        data = apply_overrides(data if isinstance(data, dict) else {}, parsed)
    try:
        return scenario_from_dict(data, source, marks, base_dir=path.resolve().parent)
    except ScenarioError as exc:
        raise ScenarioError([_from_command_line(p, [k for k, _ in parsed]) for p in exc.problems]) from None
