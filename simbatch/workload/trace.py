"""Trace replay: real arrival times and token counts, one row per request, and what the prompts share.

Four public layouts are read as published (``trace.format``; the research notes' trace cards give
their sources and licences):

- ``azure``: the Azure LLM inference traces (2023: ``TIMESTAMP`` a naive date-time with 7 fractional
  digits; 2024: timezone-aware, the fraction left out when zero), ``ContextTokens``, ``GeneratedTokens``;
- ``burstgpt``: BurstGPT's CSVs, ``Timestamp`` in seconds, ``Request tokens``, ``Response tokens``, and in
  its third release a ``Session ID`` (a conversation; empty for API calls). Rows with 0 response
  tokens, the failures the files without ``_without_fails`` keep, are dropped;
- ``mooncake``: Kimi's Mooncake traces, JSON lines of ``timestamp`` (ms), ``input_length``,
  ``output_length`` and ``hash_ids``, one id per 512-token block of the prompt, an id naming the
  block's content *and* everything before it (so equal ids are reusable KV, block for block);
- ``qwen-bailian``: Alibaba's Qwen traces, JSON lines as Mooncake's with ``timestamp`` in seconds,
  16-token blocks, and ``chat_id`` / ``parent_chat_id`` linking a conversation's turns (the root chat
  is the session).

What a trace says its prompts share becomes the workload's description of content
(simbatch.workload.prefix): a conversation (``session_column``) is one prefix stream, each turn's
prompt beginning with the turns before; rows with one prompt id (``prompt_id_column``) are one
stream, the same prompt re-sent; ``hash_ids`` are the blocks' content itself
(:class:`BlockHashes`). A column of LoRA adapter names (``adapter_column``) says which adapter each
request names, the base model where empty. Rows are sorted by time, stably (by turn within a time, when a turn
column is given): logs merged from several servers are often slightly out of order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd

from simbatch.config import Scenario, Trace
from simbatch.model.clock import MAX_ARRIVAL_S
from simbatch.workload import csvfile

SAMPLE_TRACE = Path(__file__).resolve().parent.parent / "data" / "sample_trace.csv"
"""A small synthetic trace in the Azure format, shipped with the package (see ``simbatch/data``)."""

_WHERE = "workload.trace"
MAX_HASH_ID = 1 << 30
"""Block ids at most this (the prefix cache's streams for them: simbatch.memory.prefix_cache.HASHED)."""


@dataclass(frozen=True)
class Format:
    """A public trace's layout: how its file is read and its columns' names."""

    jsonl: bool
    timestamp: str
    prompt: str
    output: str
    time_unit: str = "s"
    session: str | None = None  # used when the file has it
    hash_ids: str | None = None
    hash_block_tokens: int | None = None
    drop_zero_output: bool = False
    chat_tree: tuple[str, str] | None = None  # (chat id, parent chat id): conversations as trees


FORMATS = {
    "azure": Format(False, "TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    "burstgpt": Format(False, "Timestamp", "Request tokens", "Response tokens", session="Session ID",
                       drop_zero_output=True),
    "mooncake": Format(True, "timestamp", "input_length", "output_length", "ms", hash_ids="hash_ids",
                       hash_block_tokens=512),
    "qwen-bailian": Format(True, "timestamp", "input_length", "output_length", "s", hash_ids="hash_ids",
                           hash_block_tokens=16, chat_tree=("chat_id", "parent_chat_id")),
}


@dataclass(frozen=True)
class BlockHashes:
    """Each request's content ids, one per ``block_tokens`` tokens of its prompt (the last block may be
    partial): request i's are ``ids[offsets[i]:offsets[i + 1]]``. Two equal ids hold the same tokens after
    the same prefix; the ids are the trace's own (Mooncake's remapped hashes)."""

    ids: np.ndarray  # int64, flat
    offsets: np.ndarray  # int64, len n + 1
    block_tokens: int

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def of(self, i: int) -> np.ndarray:
        return self.ids[self.offsets[i]:self.offsets[i + 1]]

    def take(self, rows: np.ndarray) -> BlockHashes:
        lengths = np.diff(self.offsets)[rows]
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        ids = np.concatenate([self.of(int(r)) for r in rows]) if len(rows) else np.zeros(0, np.int64)
        return BlockHashes(ids.astype(np.int64), offsets, self.block_tokens)


class Replay(NamedTuple):
    """The columns a trace supplies, one row per request in arrival order."""

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    priority: np.ndarray | None  # int64, from ``priority_column``
    tenant: np.ndarray | None  # tenant names (str), from ``tenant_column``
    session: np.ndarray | None = None  # int64 conversation codes, in order of first arrival
    prompt_id: np.ndarray | None = None  # int64 prompt codes, in order of first arrival
    hashes: BlockHashes | None = None
    adapter: np.ndarray | None = None  # int32 adapter codes in order of first arrival, -1 the base model


def _timestamps_s(raw: pd.Series, path: Path, unit_s: float) -> np.ndarray:
    """Each row's time, s: numbers in the trace's unit, or ISO 8601 date-times as seconds from midnight
    UTC of the earliest row's day.

    The column's kind is decided by its majority, so one garbled row is reported as such instead of
    flipping the whole column to the other kind and failing on every row.
    """
    text = raw.str.strip()
    seconds = pd.to_numeric(text, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    if np.isfinite(seconds).sum() * 2 >= len(seconds):
        bad, expected = ~np.isfinite(seconds), "a time in seconds" if unit_s == 1 else "a time in milliseconds"
        seconds = seconds * unit_s
    else:
        # utc=True accepts stamps with differing UTC offsets and reads naive ones as UTC, so the gaps
        # between rows come out right either way.
        stamps = pd.to_datetime(text, errors="coerce", format="ISO8601", utc=True)
        seconds = (stamps - stamps.min().normalize()).dt.total_seconds().to_numpy(dtype=np.float64, na_value=np.nan)
        bad, expected = np.isnan(seconds), "a date-time like 2023-11-16 18:15:46.6805900"
    if bad.any():
        line, value, tail = csvfile.first_bad(raw, bad)
        raise csvfile.fail(path, _WHERE, f"column {raw.name!r} has {value!r}, expected {expected}{tail}; "
                                         "fix or delete that row", line)
    return seconds


def _check_horizon(stamps: pd.Series, offset_s: np.ndarray, trace: Trace, path: Path) -> None:
    """Refuse a row whose arrival (offset from the origin, times ``time_scale``) the clock cannot hold
    (:data:`~simbatch.model.clock.MAX_ARRIVAL_S`), saying which setting brought it there."""
    with np.errstate(over="ignore", invalid="ignore"):
        arrival_s = offset_s * trace.time_scale
        late = ~(arrival_s <= MAX_ARRIVAL_S)
    if not late.any():
        return
    line, value, tail = csvfile.first_bad(stamps, late)
    at = arrival_s[np.flatnonzero(late)[0]]
    origin = "" if trace.keep_time_origin else " after the first row's"
    scaled = "" if trace.time_scale == 1 else f" (times time_scale {trace.time_scale:g})"
    if (offset_s <= MAX_ARRIVAL_S).all():
        fix = "lower time_scale"
    elif trace.keep_time_origin and np.nanmax(offset_s) > 1e11:
        fix = "epoch milliseconds? set time_scale: 0.001 (or keep_time_origin: false)"
    else:
        fix = "fix or delete that row"
    when = f"{at:.3g} s" if np.isfinite(at) else "no finite time"
    raise csvfile.fail(path, _WHERE, f"column {stamps.name!r} has {value!r}{tail}: an arrival at {when}{origin}"
                                     f"{scaled}, past the {MAX_ARRIVAL_S:.2g} s the simulation clock holds (int64 "
                                     f"nanoseconds); {fix}", line)


def _codes(raw: pd.Series, empty_is_own: bool) -> np.ndarray:
    """Codes 0, 1, ... for a column's values in order of first appearance; -1 for an empty cell
    (``empty_is_own``: a row that shares nothing, as BurstGPT's API calls without a session)."""
    text = raw.str.strip().to_numpy(dtype=object)
    codes, first = pd.factorize(text)
    codes = codes.astype(np.int64)
    if empty_is_own:
        empty = text == ""
        if empty.any():
            # Renumber without the empty value, keeping first-appearance order.
            kept = np.flatnonzero(np.asarray(first, dtype=object) != "")
            remap = np.full(len(first), -1, np.int64)
            remap[kept] = np.arange(len(kept))
            codes = remap[codes]
    return codes


def _hashes(raw: list, frame: pd.DataFrame, prompts: np.ndarray, path: Path, block: int, column: str) -> BlockHashes:
    """The hash ids of every row, checked: whole numbers >= 0, one per block of the prompt."""
    lines = frame.index.to_numpy()
    lengths = np.zeros(len(raw), np.int64)
    flat = []
    for i, (ids, prompt) in enumerate(zip(raw, prompts.tolist(), strict=True)):
        if not isinstance(ids, list) or any(isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < MAX_HASH_ID
                                            for v in ids):
            raise csvfile.fail(path, f"{_WHERE}.hash_ids_column", f"{column!r} is not a list of whole numbers from 0 "
                                                                  f"to {MAX_HASH_ID - 1:,}; fix the row (remap the ids "
                                                                  "to 0, 1, 2, ... as Mooncake's are)", int(lines[i]))
        need = math.ceil(prompt / block)
        if len(ids) != need:
            raise csvfile.fail(path, f"{_WHERE}.hash_block_tokens",
                               f"{column!r} has {len(ids)} ids for a prompt of {prompt} tokens, which is {need} "
                               f"blocks of {block}; set hash_block_tokens to the trace's block size, or fix the row",
                               int(lines[i]))
        lengths[i] = len(ids)
        flat.extend(ids)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return BlockHashes(np.array(flat, dtype=np.int64), offsets, block)


def _roots(frame: pd.DataFrame, chat: str, parent: str, path: Path) -> np.ndarray:
    """Each row's conversation: the chat at the root of its chain of parents (-1 a root's parent)."""
    ids = csvfile.whole_numbers(frame[chat], path, _WHERE, "fix that row", what="a chat id")
    parents = csvfile.whole_numbers(frame[parent], path, _WHERE, "fix that row", what="a parent chat id (-1: none)")
    parent_of = dict(zip(ids.tolist(), parents.tolist(), strict=True))
    root_of: dict[int, int] = {}
    out = np.empty(len(ids), np.int64)
    for i, c in enumerate(ids.tolist()):
        chain, node = [], c
        while node not in root_of and parent_of.get(node, -1) >= 0 and len(chain) <= len(ids):
            chain.append(node)
            node = parent_of[node]
        root = root_of.get(node, node)
        for n in chain:
            root_of[n] = root
        root_of[c] = root
        out[i] = root
    return pd.factorize(out)[0].astype(np.int64)


def load_trace(trace: Trace, scenario: Scenario, num_requests: int | None,
               duration_s: float | None = None) -> Replay:
    """The requests replayed from ``trace.path``.

    Arrival times are offsets from the earliest row, times ``trace.time_scale``, so the first
    request arrives at t = 0; with ``trace.keep_time_origin`` they are the trace's own times (times
    ``time_scale``). Rows are sorted by time first (a stable sort, so rows sharing a timestamp keep
    their file order, or their turn order with ``turn_column``). ``num_requests`` then keeps the
    first that many arrivals and ``duration_s`` those arriving before it (in scaled time). Every row
    is checked, kept or not, so a damaged file is found on its first use. A bad row raises
    :class:`~simbatch.inputs.loading.ScenarioError` naming its line.
    """
    fmt = FORMATS[trace.format]
    path = scenario.resolve(trace.path)
    hash_column = trace.hash_ids_column or (fmt.hash_ids if trace.session_column is None and
                                            trace.prompt_id_column is None else None)
    lists: dict[str, list] = {}
    if fmt.jsonl:
        frame, lists = csvfile.read_jsonl(path, _WHERE, [hash_column] if hash_column else [])
    else:
        frame = csvfile.read_table(path, _WHERE)
    stamps = csvfile.column(frame, trace.timestamp_column or fmt.timestamp, path, f"{_WHERE}.timestamp_column")
    prompts = csvfile.column(frame, trace.prompt_column or fmt.prompt, path, f"{_WHERE}.prompt_column")
    outputs = csvfile.column(frame, trace.output_column or fmt.output, path, f"{_WHERE}.output_column")
    fix = "fix or delete that row"
    prompt_tokens = csvfile.positive_ints(prompts, path, _WHERE, fix)
    if fmt.drop_zero_output:  # BurstGPT's failures: a request that got no response
        zero = pd.to_numeric(outputs.str.strip(), errors="coerce").to_numpy() == 0
        output_tokens = csvfile.positive_ints(outputs.where(~zero, "1"), path, _WHERE, fix)
    else:
        zero = np.zeros(len(frame), dtype=bool)
        output_tokens = csvfile.positive_ints(outputs, path, _WHERE, fix)
    unit_s = 1e-3 if (trace.time_unit or fmt.time_unit) == "ms" else 1.0
    time_s = _timestamps_s(stamps, path, unit_s)
    priority = tenant = session = prompt_id = turn = None
    if trace.priority_column is not None:
        raw = csvfile.column(frame, trace.priority_column, path, f"{_WHERE}.priority_column")
        priority = csvfile.whole_numbers(raw, path, _WHERE, fix, what="a whole-number priority")
    if trace.tenant_column is not None:
        raw = csvfile.column(frame, trace.tenant_column, path, f"{_WHERE}.tenant_column")
        tenant = raw.str.strip().to_numpy(dtype=object)
        if (tenant == "").any():
            line, _, tail = csvfile.first_bad(raw, tenant == "")
            raise csvfile.fail(path, _WHERE, f"column {raw.name!r} is empty, expected a tenant name{tail}; {fix}",
                               line)
    session_column = trace.session_column or (fmt.session if fmt.session in frame.columns and
                                              trace.prompt_id_column is None and not trace.hash_ids_column else None)
    if session_column is not None:
        session = _codes(csvfile.column(frame, session_column, path, f"{_WHERE}.session_column"), empty_is_own=True)
    elif fmt.chat_tree is not None and all(c in frame.columns for c in fmt.chat_tree):
        session = _roots(frame, *fmt.chat_tree, path)
    if trace.prompt_id_column is not None:
        prompt_id = _codes(csvfile.column(frame, trace.prompt_id_column, path, f"{_WHERE}.prompt_id_column"),
                           empty_is_own=True)
    adapter = None if trace.adapter_column is None else \
        csvfile.column(frame, trace.adapter_column, path, f"{_WHERE}.adapter_column")
    if trace.turn_column is not None:
        turn = csvfile.whole_numbers(csvfile.column(frame, trace.turn_column, path, f"{_WHERE}.turn_column"),
                                     path, _WHERE, fix, what="a whole-number turn")
    hashes = None
    if hash_column is not None:
        if hash_column not in lists:
            raise csvfile.fail(path, f"{_WHERE}.hash_ids_column", f"{hash_column!r} is a JSON-lines field; the "
                                                                  f"{trace.format} format has no such list", None)
        block = trace.hash_block_tokens or fmt.hash_block_tokens
        if block is None:
            raise csvfile.fail(path, f"{_WHERE}.hash_block_tokens", "hash_ids need their block size; set "
                                                                    "hash_block_tokens (Mooncake: 512)", None)
        hashes = _hashes(lists[hash_column], frame, prompt_tokens, path, block, hash_column)
    if trace.keep_time_origin and time_s.min() < 0:
        line, value, tail = csvfile.first_bad(stamps, time_s < 0)
        raise csvfile.fail(path, _WHERE, f"column {stamps.name!r} has {value!r}, a negative time, which "
                                         f"keep_time_origin cannot keep{tail}; set keep_time_origin to false", line)

    keys = (time_s,) if turn is None else (turn, time_s)  # lexsort: the last key is the first
    order = np.lexsort(keys)
    order = order[~zero[order]]
    origin = 0.0 if trace.keep_time_origin else time_s[order[0]] if len(order) else 0.0
    _check_horizon(stamps, time_s - origin, trace, path)
    order = order[:num_requests]
    arrival_s = (time_s[order] - origin) * trace.time_scale
    keep = len(arrival_s) if duration_s is None else np.searchsorted(arrival_s, duration_s, side="left")
    rows = order[:keep]

    def pick(column):
        return None if column is None else column[rows]

    return Replay(arrival_s[:keep], prompt_tokens[rows], output_tokens[rows], pick(priority), pick(tenant),
                  pick(session), pick(prompt_id), None if hashes is None else hashes.take(rows),
                  # Numbered in order of first arrival, among the rows kept; an empty cell, the base model.
                  None if adapter is None else _codes(adapter.iloc[rows], empty_is_own=True).astype(np.int32))
