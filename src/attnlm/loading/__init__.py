"""Loading, runs and checkpoints: every way to name a model (``sources.resolve``), its
weights format, the run and checkpoint files, the objectives a model is trained and scored on,
and evaluation. Names load on first use."""

from __future__ import annotations
