"""Hugging Face interop: model folders in the ``transformers`` layout, read and written without
``transformers`` (only ``torch`` and ``safetensors``).

- :mod:`.folder`: reading ``config.json``, ``generation_config.json`` and the weights, loading
  mapped weights into a model, writing a folder;
- :mod:`.mapping`: the one rule-table mechanism between our parameter names and theirs
  (transposes, fused q/k/v, optional and tied keys), applied in both directions;
- one module per architecture, each holding only its config translation (both directions)
  and its rule table: :mod:`.gpt2` (``GPT2LMHeadModel`` <-> :mod:`attnlm.models.gpt`),
  :mod:`.bert` (``BertModel`` / ``BertForMaskedLM`` <-> :mod:`attnlm.models.bert`),
  :mod:`.marian` (``MarianMTModel`` <-> :mod:`attnlm.models.transformer`).

The architecture modules translate dicts only: a Hugging Face ``config.json`` dict into the
keyword arguments of our config dataclass (and our config back into a dict), and rule tables
for our state dicts. They import no model family; the family files import them
(``GPT.from_hf`` builds ``GPTConfig(**gpt2.config_from_hf(...))`` and loads through
``gpt2.layout(config)``), so no import runs from here back to a model file. Config types
appear in annotations only (``TYPE_CHECKING``).
"""

from __future__ import annotations

from attnlm._lazy import lazy_exports

__getattr__, __all__ = lazy_exports(
    __name__,
    {
        ".folder": "read_hf_config read_generation_config read_hf_weights load_mapped_state "
        "load_hf_weights write_hf_folder",
        ".mapping": "Layout Rule to_ours to_hf",
    },
)
