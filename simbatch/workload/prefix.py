"""What prompts have in common: a shared system prompt, conversations that grow turn by turn, and block ids.

Prefix caching reuses KV blocks whose *content* an earlier request computed. Tokens are not
simulated, so content is described by where it comes from: each request reads a *prefix stream*,
and its prompt is the first ``prompt_tokens`` tokens of that stream. Two requests on one stream
agree on every token both have. A conversation is one stream: turn k's prompt is every earlier
turn's prompt and output, then the new tokens. A request outside any conversation has a stream of
its own. The shared system prompt is the first ``shared_tokens`` tokens of the streams that start
with it, whatever the stream (see :func:`simbatch.memory.prefix_cache.block_key`).

A trace says what its prompts share in its own terms (simbatch.workload.trace): its conversations
and re-sent prompts are streams (:func:`trace_prefix`), and block ids such as Mooncake's
``hash_ids`` name each block's content directly (:func:`expected_hash_hits` says what a cache that
never evicts finds from the ids alone).
"""

from __future__ import annotations

import numpy as np

from simbatch.config import Prefix

OWN_STREAM = -1
"""The prefix stream of a request whose content no other request shares (beyond a system prompt)."""


def apply_prefix(prefix: Prefix, prompt_tokens: np.ndarray, output_tokens: np.ndarray, session: np.ndarray,
                 rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Prompts with their shared part added, each request's prefix stream, and its shared tokens.

    ``prompt_tokens`` are the new tokens each request brings (what the lengths section drew). A share
    ``prefix.share`` of the requests (multi-turn: of the conversations, decided at their first turn)
    start with the ``prefix.shared_tokens``-token system prompt. With ``prefix.multi_turn`` each
    request, in arrival order, continues its session's conversation, which starts over when the turn
    (context, new tokens and output) would pass ``prefix.max_context_tokens``.
    """
    n = len(prompt_tokens)
    shares_prompt = rng.random(n) < prefix.share
    system = prefix.shared_tokens
    if not prefix.multi_turn:
        shared = np.where(shares_prompt, system, 0).astype(np.int64)
        return prompt_tokens + shared, np.full(n, OWN_STREAM, dtype=np.int64), shared
    prompts = np.empty(n, dtype=np.int64)
    stream = np.empty(n, dtype=np.int64)
    shared = np.empty(n, dtype=np.int64)
    context: dict[int, tuple[int, int, int]] = {}  # session -> (tokens so far, stream, shared tokens)
    conversations = 0
    for i, (s, new, out) in enumerate(zip(session.tolist(), prompt_tokens.tolist(), output_tokens.tolist(),
                                          strict=True)):
        tokens, conv, sys_tokens = context.get(s, (0, -1, 0))
        if conv < 0 or tokens + new + out > prefix.max_context_tokens:  # a new conversation
            conv, conversations = conversations, conversations + 1
            sys_tokens = system if shares_prompt[i] else 0
            tokens = sys_tokens
        prompts[i], stream[i], shared[i] = tokens + new, conv, sys_tokens
        context[s] = (tokens + new + out, conv, sys_tokens)
    return prompts, stream, shared


def expected_cached_tokens(prompt_tokens: np.ndarray, output_tokens: np.ndarray, prefix_stream: np.ndarray,
                           shared_prefix_tokens: np.ndarray, block_size: int) -> np.ndarray:
    """Prompt tokens each request would find in a prefix cache that never evicts, its turns not overlapping.

    The first request with the system prompt computes it; every later one finds its whole blocks,
    floor(S / b) b tokens. A conversation's turn finds the previous turn's computed tokens (all but its
    last output token) in whole blocks, floor((P + O - 1) / b) b, which include the system prompt.
    Never the block of a request's last prompt token, whose logits must be computed. The closed form
    behind the capacity check with prefix caching, and what a run with an ample cache measures.
    """
    cached = np.zeros(len(prompt_tokens), dtype=np.int64)
    system_seen = False
    last: dict[int, int] = {}  # conversation -> its previous turn's prompt + output
    for i, (p, o, stream, system) in enumerate(zip(prompt_tokens.tolist(), output_tokens.tolist(),
                                                   prefix_stream.tolist(), shared_prefix_tokens.tolist(),
                                                   strict=True)):
        found = system // block_size * block_size if system and system_seen else 0
        system_seen = system_seen or system > 0
        if stream != OWN_STREAM:
            prev = last.get(stream)
            if prev is not None:
                found = max(found, (prev - 1) // block_size * block_size)
            last[stream] = p + o
        cached[i] = min(found, (p - 1) // block_size * block_size)
    return cached


def expected_cached_tokens_by_replica(replica: np.ndarray, prompt_tokens: np.ndarray, output_tokens: np.ndarray,
                                      prefix_stream: np.ndarray, shared_prefix_tokens: np.ndarray,
                                      block_size: int) -> np.ndarray:
    """:func:`expected_cached_tokens` for a fleet: each replica's cache never evicts and holds only what
    the requests routed to it (``replica``) computed, so a turn finds its conversation's latest earlier
    turn *on its replica*, and each replica computes the system prompt once. With every request on one
    replica, the single cache's answer; under round robin over n, replica i mod n."""
    cached = np.zeros(len(prompt_tokens), dtype=np.int64)
    for r in np.unique(replica):
        mine = np.flatnonzero(replica == r)
        cached[mine] = expected_cached_tokens(prompt_tokens[mine], output_tokens[mine], prefix_stream[mine],
                                              shared_prefix_tokens[mine], block_size)
    return cached


def trace_prefix(prefix: Prefix | None, prompt_tokens: np.ndarray, shared_by: np.ndarray | None,
                 rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A trace's prefix streams and system-prompt tokens (the trace gives every prompt's length).

    ``shared_by``: per request its conversation or prompt code (-1: shares nothing), which is its
    stream; None, every request on a stream of its own. With ``prefix``, a share ``prefix.share`` of
    the streams (each request outside one on its own) start with the ``prefix.shared_tokens``-token
    system prompt, counted in the trace's prompt (a prompt shorter than it is all system prompt).
    """
    n = len(prompt_tokens)
    stream = np.full(n, OWN_STREAM, dtype=np.int64) if shared_by is None else shared_by.astype(np.int64)
    if prefix is None or prefix.shared_tokens == 0:
        return stream, np.zeros(n, dtype=np.int64)
    draws = rng.random(n)
    # One draw per stream, at its first request; a request of its own draws for itself.
    first = np.arange(n)
    if shared_by is not None:
        on = stream >= 0
        _, at = np.unique(stream[on], return_index=True)
        first_of = np.full(stream.max(initial=-1) + 1, 0)
        first_of[stream[on][at]] = np.flatnonzero(on)[at]
        first[on] = first_of[stream[on]]
    shares = draws[first] < prefix.share
    return stream, np.where(shares, np.minimum(prefix.shared_tokens, prompt_tokens), 0).astype(np.int64)


def expected_hash_hits(prompt_tokens: np.ndarray, hashes, block_size: int) -> np.ndarray:
    """Prompt tokens each request would find in a prefix cache that never evicts, from its block ids alone.

    Block j of a request (``block_size`` tokens, j counted from 0) holds the tokens up to the end of
    trace block t = ((j + 1) b - 1) // T (T the trace's block size), so its content is named by
    (hash_ids[t], j), and an earlier request whose prompt held block j whole with that id computed it.
    A request finds its blocks from the first up to the first it has not seen, never the block of its
    last prompt token (whose logits must be computed): what a run finds when no two requests overlap.
    """
    seen: set[tuple[int, int]] = set()
    out = np.zeros(len(prompt_tokens), dtype=np.int64)
    T = hashes.block_tokens
    for i, p in enumerate(prompt_tokens.tolist()):
        ids = hashes.of(i).tolist()
        keys = [(ids[((j + 1) * block_size - 1) // T], j) for j in range(p // block_size)]
        found = 0
        for key in keys[:(p - 1) // block_size]:
            if key not in seen:
                break
            found += 1
        out[i] = found * block_size
        seen.update(keys)
    return out
