"""GGUF files (llama.cpp, Ollama, LM Studio) -> our models and tokenizers.

An adapter like :mod:`attnlm.models.hf`: it imports the model families it builds, and no
model file knows that GGUF exists.

- :mod:`.loader`: ``load(path) -> (model, tokenizer)``, ``load_model(path, weights="f32")``
  (matrices straight into q8 / q4 where asked), ``precision_class`` (a file's own weights
  format), ``requantized``, ``load_tokenizer``, ``read_config`` (the ``[model]`` table) and
  ``tensor_stats`` (parameters and bytes per tensor type, without building the model);
- :mod:`.parts`: where the file's tensors go (``Part``) and llama.cpp's rotary row order;
- :mod:`.writer` (and :mod:`.vocab`): our Llama / GPT back to a GGUF file;
- one module per architecture with its metadata -> config mapping and its tensor table:
  :mod:`.llama` (our Llama) and :mod:`.gpt2` (our GPT).

The file's header is read by :mod:`attnlm.base.ggufio`, its tokenizer by
:mod:`attnlm.tokenizers.gguf`, its tensors' blocks by :mod:`attnlm.quant.blocks`.
"""

from __future__ import annotations

from attnlm._lazy import lazy_exports

__getattr__, __all__ = lazy_exports(
    __name__,
    {
        ".loader": "load load_model load_tokenizer precision_class read_config requantized "
        "tensor_stats",
    },
)
