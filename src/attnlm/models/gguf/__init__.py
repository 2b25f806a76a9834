"""GGUF files (llama.cpp, Ollama, LM Studio) -> our models and tokenizers.

An adapter like :mod:`attnlm.models.hf`: it imports the model families it builds, and no
model file knows that GGUF exists.

- :mod:`.loader`: ``load(path) -> (model, tokenizer)``, ``load_tokenizer``,
  ``read_config`` (the ``[model]`` table) and ``tensor_stats`` (parameters and bytes per tensor
  type, without building the model);
- :mod:`.quantized`: ``load_model(path, weights="f32")``, matrices straight into q8/q4;
- :mod:`.quants`: the ggml tensor types dequantized to float32 (F32, F16, BF16, Q8_0, Q4_0,
  Q4_1, Q4_K, Q5_K, Q6_K);
- one module per architecture with its metadata -> config mapping and its tensor table:
  :mod:`.llama` (our Llama) and :mod:`.gpt2` (our GPT).

The file's header is read by :mod:`attnlm.ggufio`, its tokenizer by
:mod:`attnlm.tokenizers.gguf`.
"""

from __future__ import annotations

from attnlm._lazy import lazy_exports

__getattr__, __all__ = lazy_exports(
    __name__,
    {
        ".loader": "load load_tokenizer read_config tensor_stats",
        ".quantized": "load_model precision_class",
        ".quants": "dequantize",
    },
)
