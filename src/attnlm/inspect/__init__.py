"""Looking inside models: one inspection record of a forward pass for any family
(:mod:`.base` the record, :mod:`.record` building it, :mod:`.translation` for encoder-decoders),
attention heatmaps and loss curves (:mod:`.heatmap`), parameter counts
(:mod:`.params`). Names load on first use."""

from __future__ import annotations

from attnlm._lazy import lazy_exports

__getattr__, __all__ = lazy_exports(
    __name__,
    {
        ".base": "InspectionRecord",
        ".translation": "inspect_translation",
        ".record": "inspect",
        ".heatmap": "plot_attention_grid plot_attention_panels plot_loss_curve",
        ".params": "format_param_table",
    },
)
