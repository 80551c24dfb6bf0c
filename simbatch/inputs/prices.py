"""The prices file: what a GPU-hour costs, and what a GPU draws, per GPU type.

``simbatch plan --prices FILE`` reads one; without it, the example shipped in
``simbatch/data/gpu_prices.yaml`` (on-demand list prices with the date and source of each figure;
prices vary by provider, region, commitment and week, so bring your own). Layout::

    currency: USD
    gpus:
      H100-SXM:
        usd_per_gpu_hour: 2.69        # required: what one GPU of this type costs per hour
        provider: RunPod              # the rest says where the figure comes from
        offer: H100 SXM, Community Cloud, on demand
        date: 2026-11-09
        source: runpod.io/pricing
        idle_watts: 70                # optional: the GPU's draw idle and at full load, W, for the
        max_watts: 700                # energy columns, used when its GPU card has no such figures

GPU names match the GPU cards (``simbatch presets``) case-insensitively; a calibrated device of a
search space names its GPU type for its price (:mod:`.space`).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from simbatch.inputs.loading import load_model

SHIPPED = "data/gpu_prices.yaml"


class GpuPrice(BaseModel):
    """What one GPU of a type costs per hour, where the figure comes from, and (optionally) its power."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    usd_per_gpu_hour: Annotated[float, Field(gt=0)] = Field(description="Price of one GPU for one hour.")
    provider: str = Field(default="", description="Who sells it at that price.")
    offer: str = Field(default="", description="The instance or offer the price is for.")
    date: datetime.date | str = Field(default="", description="When the price was read.")
    source: str = Field(default="", description="Where it was read.")
    note: str = Field(default="", description="Anything else a reader must know.")
    idle_watts: Annotated[float, Field(ge=0)] | None = Field(
        default=None, description="Draw with nothing to compute, W (used when the GPU card has none).")
    max_watts: Annotated[float, Field(gt=0)] | None = Field(
        default=None, description="Draw at full load (the board power limit), W (used when the GPU card has none).")
    power_source: str = Field(default="", description="Where the power figures come from.")

    @model_validator(mode="after")
    def _power(self) -> GpuPrice:
        if (self.idle_watts is None) != (self.max_watts is None):
            raise ValueError("give both idle_watts and max_watts, or neither")
        if self.idle_watts is not None and self.idle_watts > self.max_watts:
            raise ValueError(f"idle_watts ({self.idle_watts:g}) is above max_watts ({self.max_watts:g})")
        return self


class PriceFile(BaseModel):
    """Prices per GPU type, in one currency."""

    model_config = ConfigDict(extra="forbid")

    currency: str = Field(default="USD", description="The currency of every price (the columns say $).")
    gpus: dict[str, GpuPrice] = Field(min_length=1, description="GPU type -> its price.")


@dataclass(frozen=True)
class Power:
    """A GPU's draw idle and at full load, W, and where the figures come from."""

    idle_watts: float
    max_watts: float
    source: str


@dataclass(frozen=True)
class Prices:
    """A loaded prices file: ``price(gpu)`` and ``power(gpu)`` by GPU name, case-insensitively."""

    path: Path
    file: PriceFile
    shipped: bool = False

    @classmethod
    def load(cls, path: Path | None) -> Prices:
        """The file at ``path``, or the shipped example; ScenarioError names what is wrong in it."""
        if path is None:
            with resources.as_file(resources.files("simbatch").joinpath(SHIPPED)) as shipped:
                return cls(Path(shipped), load_model(shipped, PriceFile, "prices file"), shipped=True)
        return cls(Path(path), load_model(path, PriceFile, "prices file"))

    @property
    def label(self) -> str:
        """The file as a reader knows it: the shipped example by its place in the package."""
        return f"simbatch/{SHIPPED} (the shipped example)" if self.shipped else str(self.path)

    def _entry(self, gpu: str) -> GpuPrice | None:
        return {k.lower(): v for k, v in self.file.gpus.items()}.get(gpu.lower())

    def has(self, gpu: str) -> bool:
        return self._entry(gpu) is not None

    def price(self, gpu: str) -> float:
        """Price of one GPU-hour of ``gpu`` (KeyError when the file has none: check :meth:`has` first)."""
        entry = self._entry(gpu)
        if entry is None:
            raise KeyError(gpu)
        return entry.usd_per_gpu_hour

    def power(self, gpu: str, card=None) -> Power | None:
        """The GPU's idle and full-load draw: the GPU card's ``idle_watts`` / ``max_watts`` when it has
        them, else this file's; None when neither says."""
        idle, top = getattr(card, "idle_watts", None), getattr(card, "max_watts", None)
        if idle is not None and top is not None:
            return Power(float(idle), float(top), f"GPU card {card.name}")
        entry = self._entry(gpu)
        if entry is None or entry.idle_watts is None:
            return None
        return Power(entry.idle_watts, entry.max_watts, entry.power_source or str(self.path))

    def describe(self, gpu: str) -> str:
        """``$2.69/GPU-h (RunPod, 2026-11-09)``: a price with where and when it was read."""
        entry = self._entry(gpu)
        where = ", ".join(str(x) for x in (entry.provider, entry.date) if x)
        return f"${entry.usd_per_gpu_hour:.4g}/GPU-h" + (f" ({where})" if where else "")
