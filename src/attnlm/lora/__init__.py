"""LoRA in one home: the adapter layers (:mod:`.layers`), a LoRA run folder (:mod:`.run`)
and the training run's two calls (:mod:`.training`)."""

from __future__ import annotations
