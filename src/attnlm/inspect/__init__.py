"""Looking inside models: one inspection record of a forward pass for any family
(:mod:`.base` the record, :mod:`.record` building it, :mod:`.translation` for encoder-decoders),
attention heatmaps and loss curves (:mod:`.heatmap`), parameter counts
(:mod:`.params`). Names load on first use."""

from __future__ import annotations

from attnlm._lazy import lazy_exports

_EXPORTS = {
    "InspectionRecord": "attnlm.inspect.base",
    "inspect_translation": "attnlm.inspect.translation",
    "inspect": "attnlm.inspect.record",
    "plot_attention_grid": "attnlm.inspect.heatmap",
    "plot_attention_panels": "attnlm.inspect.heatmap",
    "plot_loss_curve": "attnlm.inspect.heatmap",
    "format_param_table": "attnlm.inspect.params",
}
__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
