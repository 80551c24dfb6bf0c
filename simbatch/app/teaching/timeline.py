"""Which slot each request sat in: the picture behind "static batching locks finished slots".

The engine has no slot numbers; a batch is a set of requests. For a drawing, each request is given
the lowest-numbered slot free when it is first scheduled, and holds it until its slot is *released*:

- continuous batching releases a slot the step a request finishes, and the next waiting request takes
  it at once;
- static batching releases every slot of a batch only when its last member finishes: a request that
  finished earlier leaves its slot **locked**, computed as padding, from its finish to the batch's
  end. A batch is the requests first scheduled in the same step.

Runs with preemption are refused: a preempted request leaves and re-enters, which one slot per
request cannot draw.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def slot_timeline(requests: pd.DataFrame, max_num_seqs: int, *, static: bool) -> pd.DataFrame:
    """One row per scheduled request of a one-replica run: ``request_id``, ``slot``, ``start_s`` (first
    scheduled), ``finish_s`` (last token) and ``release_s`` (its slot free again), in start order."""
    if (requests["num_preemptions"] > 0).any():
        raise ValueError("slot_timeline: the run preempted requests, which a one-slot-per-request timeline "
                         "cannot draw; give the run more KV blocks")
    rows = requests.loc[requests["first_scheduled_s"].notna(),
                        ["request_id", "first_scheduled_s", "finish_s"]].rename(columns={"first_scheduled_s": "start_s"})
    rows = rows.sort_values(["start_s", "request_id"], kind="stable").reset_index(drop=True)
    if static:
        rows["release_s"] = rows.groupby("start_s")["finish_s"].transform("max")
    else:
        rows["release_s"] = rows["finish_s"]
    free_at = np.full(max_num_seqs, -np.inf)  # when each slot is next free
    slots = []
    for start, release in zip(rows["start_s"], rows["release_s"], strict=True):
        free = np.flatnonzero(free_at <= start)
        if len(free) == 0:
            raise ValueError(f"slot_timeline: more than max_num_seqs = {max_num_seqs} requests run at "
                             f"{start:.3f} s; pass the run's max_num_seqs")
        slots.append(int(free[0]))
        free_at[free[0]] = release
    rows.insert(1, "slot", slots)
    return rows
