"""How well the presets predict the measured data, beside the plain model ``tau0 + beta*B``.

``scripts/gen_hardware_fit.py`` writes the result to docs/hardware_fit.md; ``scripts/fit_hardware.py``
stores the same errors beside the efficiencies it fits.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from simbatch.hardware import measured
from simbatch.hardware.preset import Efficiency


def relative_errors(predicted: np.ndarray, rows: pd.DataFrame) -> np.ndarray:
    """|predicted - measured| / measured, row by row."""
    return np.abs(predicted - rows.measured_ms.to_numpy()) / rows.measured_ms.to_numpy()


def errors_by_dataset(rows: pd.DataFrame, eff: Efficiency) -> dict[tuple[str, str], dict]:
    """Per (dataset, kind): row count, median and p90 relative error of the presets and of the plain model."""
    preset = relative_errors(measured.predict_ms(rows, eff), rows)
    plain = relative_errors(measured.plain_ms(rows), rows)
    out = {}
    for key, idx in rows.groupby(["dataset", "kind"], sort=True).indices.items():
        p = plain[idx][np.isfinite(plain[idx])]
        out[key] = {"rows": len(idx), "median": float(np.median(preset[idx])),
                    "p90": float(np.quantile(preset[idx], 0.9)),
                    "plain_median": float(np.median(p)) if p.size else float("nan"),
                    "plain_p90": float(np.quantile(p, 0.9)) if p.size else float("nan")}
    return out
