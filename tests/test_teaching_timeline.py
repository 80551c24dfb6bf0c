"""Slot timelines: no slot holds two requests at once, static batches release together."""

from __future__ import annotations

import pandas as pd
import pytest

import simbatch
from simbatch.app.teaching.timeline import slot_timeline

SLOTS = 6


def _run(mode: str) -> pd.DataFrame:
    return simbatch.simulate(simbatch.Scenario.model_validate({
        "seed": 3, "workload": {"num_requests": 30, "arrival": {"rate": 6},
                                "prompt_tokens": {"dist": "fixed", "value": 16},
                                "output_tokens": {"dist": "lognormal", "mean": 40, "sigma": 1.0, "max": 300}},
        "device": {"tau0_ms": 20, "beta_ms": 0.2}, "batching": {"mode": mode, "max_num_seqs": SLOTS}})).requests


@pytest.mark.parametrize("mode", ["static", "continuous"])
def test_slots_never_overlap(mode):
    t = slot_timeline(_run(mode), SLOTS, static=mode == "static")
    assert len(t) == 30 and t["slot"].between(0, SLOTS - 1).all()
    for _, lane in t.groupby("slot"):
        lane = lane.sort_values("start_s")
        assert (lane["start_s"].to_numpy()[1:] >= lane["release_s"].to_numpy()[:-1]).all()
    assert (t["release_s"] >= t["finish_s"]).all()


def test_static_batches_release_together_and_continuous_at_once():
    static = slot_timeline(_run("static"), SLOTS, static=True)
    first_batch = static[static["start_s"] == static["start_s"].min()]
    assert len(first_batch) == SLOTS and first_batch["release_s"].nunique() == 1
    assert first_batch["release_s"].iloc[0] == first_batch["finish_s"].max()
    assert (first_batch["release_s"] > first_batch["finish_s"]).sum() == SLOTS - 1  # locked after finishing
    continuous = slot_timeline(_run("continuous"), SLOTS, static=False)
    assert (continuous["release_s"] == continuous["finish_s"]).all()


def test_refuses_what_it_cannot_draw():
    requests = _run("continuous")
    with pytest.raises(ValueError, match="pass the run's max_num_seqs"):
        slot_timeline(requests, 2, static=False)
    with pytest.raises(ValueError, match="preempted"):
        slot_timeline(requests.assign(num_preemptions=1), SLOTS, static=False)


def _load_script():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "make_slot_animation.py"
    spec = importlib.util.spec_from_file_location("make_slot_animation", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_animation_script_writes_a_gif(tmp_path):
    from PIL import Image

    out = tmp_path / "timeline.gif"
    assert _load_script().main(["--out", str(out), "--frames", "3"]) == 0
    with Image.open(out) as gif:
        assert gif.format == "GIF" and gif.n_frames == 3


def test_animation_script_refuses_a_single_frame(tmp_path, capsys):
    assert _load_script().main(["--out", str(tmp_path / "x.gif"), "--frames", "1"]) == 2
    assert "--frames 1: an animation needs at least 2 frames" in capsys.readouterr().err
    assert not (tmp_path / "x.gif").exists()
