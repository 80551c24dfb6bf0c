"""From a YAML file (plus ``--set`` overrides) to a validated, resolved :class:`~simbatch.config.Scenario`.

Errors are collected, never raised one at a time, and each carries the position in the file of
the value it complains about, so the CLI can print ``file:line:col: dotted.path: message``.
"""

from __future__ import annotations

import copy
import functools
import math
import stat
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel, ValidationError

from simbatch.config import LengthDist, Scenario, suggestion
from simbatch.config.problems import Problem, ScenarioError
from simbatch.inputs.resolve import resolve


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


MAX_SCENARIO_BYTES = 1_000_000
"""A scenario is a page of settings; a file larger than this is not one (and is not read whole)."""
MAX_DEPTH = 32
"""Nesting deeper than any scenario needs; it also keeps PyYAML's recursive composer far from the stack limit."""
MAX_NODES = 100_000
"""Values in the document with every alias expanded: a "billion laughs" file has 10**9 of them."""


def read_text(path: Path) -> str:
    """The scenario file's text: a regular UTF-8 file of at most MAX_SCENARIO_BYTES, or ScenarioError."""
    source = str(path)
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise ScenarioError([Problem(source, "", "file not found")]) from None
    except OSError as exc:
        raise ScenarioError([Problem(source, "", f"cannot read the file: {exc.strerror or exc}")]) from None
    if not stat.S_ISREG(mode):
        kind = "a folder" if stat.S_ISDIR(mode) else "not a regular file"
        raise ScenarioError([Problem(source, "", f"cannot read the file: it is {kind}; give a scenario .yaml file")])
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_SCENARIO_BYTES + 1)
    except OSError as exc:
        raise ScenarioError([Problem(source, "", f"cannot read the file: {exc.strerror or exc}")]) from None
    if len(raw) > MAX_SCENARIO_BYTES:
        raise ScenarioError([Problem(source, "", f"the file is larger than {MAX_SCENARIO_BYTES:,} bytes, "
                                                 "too large for a scenario; check that this is the right file")])
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise ScenarioError([Problem(source, "", f"cannot read the file: byte {raw[exc.start]:#04x} is not UTF-8; "
                                                 "save the file as UTF-8", line)]) from None


def _yaml_problem(source: str, message: str, mark: yaml.Mark | None) -> ScenarioError:
    return ScenarioError([Problem(source, "", message, None if mark is None else mark.line + 1,
                                  None if mark is None else mark.column + 1)])


def _check_shape(text: str, source: str) -> None:
    """Refuse NUL bytes and deep nesting before PyYAML's recursive composer sees the text.

    The event stream is produced without recursion, so even 100,000 nested brackets are counted safely.
    """
    if "\0" in text:
        before = text[:text.index("\0")]
        line, col = before.count("\n") + 1, len(before) - (before.rfind("\n") + 1) + 1
        raise ScenarioError([Problem(source, "", "the file contains a NUL byte; a scenario is text, "
                                                 "remove it (or check that this is the right file)", line, col)])
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise _yaml_problem(source, f"nested more than {MAX_DEPTH} levels deep; a scenario needs a "
                                            "handful, check the brackets and indentation", event.start_mark)
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _check_tree(root: yaml.Node, source: str) -> None:
    """Refuse documents whose aliases expand past MAX_NODES, or contain themselves.

    A node reached through several aliases is counted once per path, as the validated mapping holds
    it; counts are memoised per node, so this costs one visit per node whatever the expansion.
    """
    sizes: dict[int, int] = {}
    open_: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        children = [v for pair in node.value for v in pair] if isinstance(node, yaml.MappingNode) else \
            node.value if isinstance(node, yaml.SequenceNode) else []
        if done:
            open_.discard(id(node))
            sizes[id(node)] = size = 1 + sum(sizes[id(c)] for c in children)
            if size > MAX_NODES:
                raise _yaml_problem(source, f"the document expands to more than {MAX_NODES:,} values "
                                            "(aliases repeating aliases?); a scenario needs a few dozen",
                                    node.start_mark)
            continue
        if id(node) in sizes:
            continue
        if id(node) in open_:
            raise _yaml_problem(source, "an alias refers to a value that contains it; "
                                        "a scenario cannot be infinitely deep", node.start_mark)
        open_.add(id(node))
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in sizes)


def _check_duplicates(node: yaml.Node, source: str, path: tuple[str, ...] = ()) -> None:
    """A key given twice in one mapping is an error naming both places (YAML would keep the last
    silently). Runs after :func:`_check_tree`, so the tree is known to be small and finite."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, yaml.Mark] = {}
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode):
                if key.value in seen:
                    first = seen[key.value]
                    raise ScenarioError([Problem(
                        source, ".".join((*path, key.value)), f"duplicate key (first at line {first.line + 1}, "
                        f"column {first.column + 1}); keep one of them", key.start_mark.line + 1,
                        key.start_mark.column + 1)])
                seen[key.value] = key.start_mark
            _check_duplicates(value, source, (*path, str(key.value)))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _check_duplicates(item, source, (*path, str(i)))


def read_yaml(text: str, source: str) -> tuple[yaml.Node | None, Any]:
    """(composed tree, plain data) of a scenario's text, or ScenarioError with file:line:col.

    Guards first (NUL bytes, depth, aliases, then duplicate keys), so that no input can exhaust memory,
    the stack or the user's patience; then the tree is constructed once, sharing what aliases share.
    """
    try:
        _check_shape(text, source)
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            if node is not None:
                _check_tree(node, source)
                _check_duplicates(node, source)
            data = None if node is None else loader.construct_document(node)
        finally:
            loader.dispose()
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc)
        raise _yaml_problem(source, f"not valid YAML: {problem}", getattr(exc, "problem_mark", None)) from None
    return node, data


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


# The ``dist`` names of the length distributions, which pydantic puts in an error's location.
_UNION_TAGS = tuple(tag for model in get_args(get_args(LengthDist)[0])
                    for tag in get_args(model.model_fields["dist"].annotation))


def _clean_loc(loc: tuple, data: Any) -> str:
    """Pydantic's loc without union tags, as a dotted path the user would type."""
    parts, node = [], data
    for p in loc:
        if isinstance(node, dict) and p in _UNION_TAGS and p not in node:
            continue
        if isinstance(node, dict) and p in node or isinstance(node, list) and isinstance(p, int) and p < len(node):
            parts.append(str(p))
            node = node[p]
        elif isinstance(node, dict | list):
            # A key that is missing (required field) or a union tag: keep real keys only.
            if isinstance(node, dict) and not isinstance(p, int):
                parts.append(str(p))
            node = None
        else:
            node = None
    return ".".join(parts)


def _message(err: dict, root: type[BaseModel] | None = None) -> str:
    kind, msg = err["type"], err["msg"]
    if kind == "extra_forbidden":
        guess = suggestion(err["loc"], root)
        hint = f"did you mean {guess!r}? " if guess else ""
        where = " (see `simbatch schema`)" if root in (None, Scenario) else ""
        return f"unknown key; {hint}remove it or check its spelling{where}"
    if kind == "missing":
        return "required field is missing"
    if kind.startswith("value_error"):
        msg = msg.removeprefix("Value error, ")
    value = err.get("input")
    shown = "" if isinstance(value, dict | list) or kind == "missing" else f" (got {value!r})"
    return f"{msg}{shown}"


def scenario_from_dict(data: Any, source: str = "<scenario>", marks: dict | None = None,
                       base_dir: Path | None = None) -> Scenario:
    """Validate a plain mapping into a Scenario and resolve it (:func:`~simbatch.inputs.resolve.resolve`),
    or raise ScenarioError listing every problem, located in the file as the validator locates it."""
    if not isinstance(data, dict):
        kind = "empty" if data is None else f"a {type(data).__name__}"
        raise ScenarioError([Problem(source, "", f"the scenario is {kind}; expected a YAML mapping of sections "
                                                 "(workload, device, batching, ...)")])
    try:
        scenario = Scenario.model_validate(data, context={"base_dir": base_dir})
        scenario._base_dir = base_dir
        scenario = resolve(scenario)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            mark = _locate(err["loc"], marks or {}, err["type"] == "extra_forbidden")
            problems.append(Problem(source, _clean_loc(err["loc"], data), _message(err),
                                    None if mark is None else mark.line + 1,
                                    None if mark is None else mark.column + 1))
        raise ScenarioError(problems) from None
    _check_files(scenario, source, marks or {})
    return scenario


def _check_files(scenario: Scenario, source: str, marks: dict[tuple, yaml.Mark]) -> None:
    """Data files must exist, and be files, before a run starts, not halfway through it."""
    problems = []
    for key, path in scenario.data_files().items():
        problem = data_file_problem(scenario.resolve(path))
        if problem:
            mark = _locate(tuple(key.split(".")), marks, False)
            problems.append(Problem(source, key, problem, None if mark is None else mark.line + 1,
                                    None if mark is None else mark.column + 1))
    if problems:
        raise ScenarioError(problems)


def data_file_problem(path: Path) -> str | None:
    """Why ``path`` cannot be read as a data file ("file not found", "not a regular file"), or None.

    A device or a pipe (``/dev/zero``, ``/dev/stdin``) is refused by name: reading one never ends
    or consumes the input, and it is never a trace.
    """
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return f"file not found: {path}"
    except OSError as exc:
        return f"cannot read {path}: {exc.strerror or exc}"
    if not stat.S_ISREG(mode):
        return f"not a regular file: {path}; give a CSV file"
    return None


def _from_command_line(problem: Problem, keys: list[str], marks: dict[tuple, yaml.Mark]) -> Problem:
    """A problem with a value given by ``--set`` is reported against ``--set``, not a line of the file;
    so is one with a key only ``--set`` wrote (``--set workload.arival.rate=4`` makes ``workload.arival``)."""
    made_by_set = problem.path and tuple(problem.path.split(".")) not in marks and \
        any(k.startswith(problem.path + ".") for k in keys)
    if made_by_set or any(problem.path == k or problem.path.startswith(k + ".") for k in keys):
        return Problem("--set", problem.path, problem.message)
    return problem


def _is_surrogate(ch: str) -> bool:
    return "\ud800" <= ch <= "\udfff"


def whole_characters(value: Any, source: str, marks: dict[tuple, yaml.Mark], path: tuple = ()) -> Any:
    """``value`` with every string made of whole characters: YAML reads ``"\\ud83d\\ude80"`` (JSON's
    spelling of one emoji) as two halves of a UTF-16 pair, which no file or terminal can write; a pair is
    joined into its character, a lone half is a ScenarioError at its place."""
    if isinstance(value, dict):
        return {whole_characters(k, source, marks, path): whole_characters(v, source, marks, (*path, str(k)))
                for k, v in value.items()}
    if isinstance(value, list):
        return [whole_characters(v, source, marks, (*path, str(i))) for i, v in enumerate(value)]
    if not isinstance(value, str) or not any(map(_is_surrogate, value)):
        return value
    try:
        return value.encode("utf-16", "surrogatepass").decode("utf-16")
    except UnicodeDecodeError:
        lone = next(ch for ch in value if _is_surrogate(ch)).encode("unicode_escape").decode()
        mark = _locate(path, marks, False) if marks else None
        raise ScenarioError([Problem(source, ".".join(path), f"holds a lone surrogate ({lone}), half of a UTF-16 "
                                     "pair and no character; write the character itself, or its \\U escape "
                                     "(\\U0001F680)", None if mark is None else mark.line + 1,
                                     None if mark is None else mark.column + 1)]) from None


@functools.lru_cache(maxsize=16)
def _parsed(text: str, source: str) -> tuple[dict[tuple, yaml.Mark], Any]:
    """The marks and data of a scenario's text, parsed once per text: a sweep or a plan loads one file
    hundreds of times with different overrides (pure-Python YAML parsing would be most of its time).
    The data is shared: callers copy it before they change it."""
    node, data = read_yaml(text, source)
    return (_marks(node) if node is not None else {}), data


def load_scenario(path: str | Path, overrides: list[str] | None = None) -> Scenario:
    """Read, override, validate and resolve a scenario file. Raises ScenarioError with every problem found."""
    path = Path(path)
    source = str(path)
    marks, data = _parsed(read_text(path), source)
    data = whole_characters(data, source, marks)  # new containers: the cached parse is left as it was
    parsed = [(key, whole_characters(value, "--set", {}, (key,))) for key, value in map(parse_override, overrides or [])]
    if parsed:
        data = apply_overrides(data if isinstance(data, dict) else {}, parsed)
    try:
        return scenario_from_dict(data, source, marks, base_dir=path.resolve().parent)
    except ScenarioError as exc:
        raise ScenarioError([_from_command_line(p, [k for k, _ in parsed], marks) for p in exc.problems]) from None


def load_model(path: str | Path, model: type[BaseModel], what: str) -> BaseModel:
    """A YAML file that is not a scenario (a plan's search space, a prices file) validated into
    ``model``, with a scenario's guards and its ``file:line:col: dotted.path: message`` problems.
    ``what`` names the file in the message when it is not a mapping ("search space")."""
    path = Path(path)
    source = str(path)
    node, data = read_yaml(read_text(path), source)
    if not isinstance(data, dict):
        kind = "empty" if data is None else f"a {type(data).__name__}"
        raise ScenarioError([Problem(source, "", f"the {what} is {kind}; expected a YAML mapping")])
    marks = _marks(node)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            mark = _locate(err["loc"], marks, err["type"] == "extra_forbidden")
            problems.append(Problem(source, _clean_loc(err["loc"], data), _message(err, model),
                                    None if mark is None else mark.line + 1,
                                    None if mark is None else mark.column + 1))
        raise ScenarioError(problems) from None
