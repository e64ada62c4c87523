"""`Calibration`, the pydantic model behind `contextpipe.tokens.Calibration` (imported on first use)."""

from __future__ import annotations

import pydantic

__all__ = ["Calibration"]


class Calibration(pydantic.BaseModel):
    """How far estimates are off, learned from the input tokens models report (kept in session state).

    `ratio` multiplies estimates; it moves toward each observed ``reported / estimated`` by `weight`.
    """

    ratio: float = 1.0
    samples: int = 0
    weight: float = 0.3

    def observe(self, estimated: int, reported: int) -> None:
        """Learn from one model call: `estimated` tokens by us, `reported` by the model."""
        if estimated <= 0 or reported <= 0:
            return
        observed = reported / estimated
        self.ratio = observed if self.samples == 0 else self.ratio + self.weight * (observed - self.ratio)
        self.samples += 1
