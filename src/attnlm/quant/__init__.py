"""Quantization, in one place: the block formats and the layers that hold them.

- :mod:`.blocks` (numpy alone, so the C engine reads it without PyTorch): the byte layouts of
  ggml's types (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
  IQ4_NL, IQ4_XS, MXFP4) and of attnlm's q8 / q4,
  read as float32 (``dequantize``) or as codes and scales (``codes``), the q4 packing
  (``pack_q4``) and ggml's Q8_0 / Q4_0 quantizers (for writing GGUF files);
- :mod:`.layers` (PyTorch): ``QuantLinear`` and ``QuantEmbedding`` (linear layers and token
  embeddings stored in bf16 / q8 / q4 for decoding), ``quantize_weights(model, fmt)``,
  ``weights_format(model)`` and the kernels.

Which ggml type loads into which format by default is the GGUF adapter's
(:mod:`attnlm.models.gguf.loader`). Names load on first use.
"""

from __future__ import annotations

from attnlm._lazy import lazy_exports

__getattr__, __all__ = lazy_exports(
    __name__,
    {
        ".blocks": "codes dequantize pack_q4",
        ".layers": "QuantEmbedding QuantLinear quantize_weights weights_format",
    },
)
