"""The C decode step's structs (``decode_step.c``), field for field, its weight-format ids and
the argument types of its functions: shared by the PyTorch glue
(:mod:`attnlm.runtime.cstep`) and the engine without PyTorch (:mod:`attnlm.runtime.engine`).
Numbers only: no tensors, no PyTorch."""

from __future__ import annotations

import ctypes

F32, BF16, Q8, Q4, F32T = 0, 1, 2, 3, 4  # Linear.fmt
# ggml's blocks as a GGUF file stores them (ggml_blocks.h): Linear.fmt
F16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K = 5, 6, 7, 8, 9, 10, 11, 12, 13
Q2_K, Q3_K, IQ4_NL, IQ4_XS, MXFP4 = 14, 15, 16, 17, 18
#: ggml type name -> Linear.fmt of its rows as stored
GGML_FORMATS = {"F32": F32, "BF16": BF16, "F16": F16, "Q8_0": Q8_0, "Q4_0": Q4_0, "Q4_1": Q4_1,
                "Q5_0": Q5_0, "Q5_1": Q5_1, "Q4_K": Q4_K, "Q5_K": Q5_K, "Q6_K": Q6_K,
                "Q2_K": Q2_K, "Q3_K": Q3_K, "IQ4_NL": IQ4_NL, "IQ4_XS": IQ4_XS,
                "MXFP4": MXFP4}  # fmt: skip
ACT_AUTO, ACT_FLOAT, ACT_INT = 0, 1, 2  # Linear.act: a ggml product's activations
RMS, LAYER = 0, 1  # Model.norm
SWIGLU, GELU, GELU_TANH, RELU, GEGLU = 0, 1, 2, 3, 4  # Model.act
GEGLU_F16 = 5  # Model.act: GeGLU whose GELU is llama.cpp's CPU backend's (float16 in and out)
SWIGLU_OAI = 6  # Model.act: gpt-oss's clamped SwiGLU


class Linear(ctypes.Structure):
    _fields_ = [("fmt", ctypes.c_int64), ("n", ctypes.c_int64), ("k", ctypes.c_int64),
                ("n_pad", ctypes.c_int64), ("w", ctypes.c_void_p), ("scales", ctypes.c_void_p),
                ("bias", ctypes.c_void_p), ("act", ctypes.c_int64)]  # fmt: skip


class Norm(ctypes.Structure):
    _fields_ = [("w", ctypes.c_void_p), ("b", ctypes.c_void_p)]


class Block(ctypes.Structure):
    _fields_ = [("ln_1", Norm), ("ln_2", Norm), ("qkv", Linear), ("out", Linear),
                ("fc", Linear), ("proj", Linear), ("k_cache", ctypes.c_void_p),
                ("v_cache", ctypes.c_void_p), ("k", Linear), ("v", Linear),
                ("up", Linear), ("q_norm", Norm), ("k_norm", Norm), ("post_attn", Norm),
                ("post_mlp", Norm), ("window", ctypes.c_int64),
                ("table", ctypes.c_int64), ("router", Linear), ("n_expert", ctypes.c_int64),
                ("n_used", ctypes.c_int64), ("norm_topk", ctypes.c_int64),
                ("sinks", ctypes.c_void_p), ("topk_softmax", ctypes.c_int64)]  # fmt: skip


class Model(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_int64)
        for name in ("n_layer", "C", "H", "Hkv", "D", "F", "V", "cap", "norm", "act", "rotary")
    ]
    _fields_ += [("eps", ctypes.c_float), ("scale", ctypes.c_float),
                 ("blocks", ctypes.c_void_p), ("ln_f", Norm), ("head", Linear),
                 ("attn_softcap", ctypes.c_float), ("final_softcap", ctypes.c_float),
                 ("residual_scale", ctypes.c_float), ("logit_scale", ctypes.c_float),
                 ("qk_all", ctypes.c_int64), ("no_pre", ctypes.c_int64),
                 ("rot", ctypes.c_int64)]  # fmt: skip


class Scratch(ctypes.Structure):
    _fields_ = [(name, ctypes.c_void_p)
                for name in ("xn", "qkv", "att", "hid", "scores", "part", "xq", "moe")]  # fmt: skip


class Rows(ctypes.Structure):
    """Where each row of a step is (``attnlm_step_rows``): ``slot`` / ``pos`` ``(M,)`` int64,
    ``cos`` / ``sin`` ``(tables, M, D/2)`` float32, ``out`` ``(R,)`` int64: the rows whose
    logits are computed."""

    _fields_ = [(name, ctypes.c_void_p) for name in ("slot", "pos", "cos", "sin", "out")]
    _fields_ += [("R", ctypes.c_int64)]


STRUCTS = (Linear, Norm, Block, Model, Scratch)
#: every struct whose size the library reports (attnlm_sizes), in its order
SIZED = (*STRUCTS, Rows)


def scratch_sizes(m: int, cap: int, threads: int, c: int, q: int, hd: int, nf: int, v: int
                  ) -> tuple[int, ...]:  # fmt: skip
    """Floats of each :class:`Scratch` buffer for ``m`` rows, ``cap`` positions and
    ``threads``: widths ``c`` (model), ``q`` ((H + 2 Hkv) D), ``hd`` (H D), ``nf`` (the
    feed-forward's first product), ``v`` (vocabulary; a column-major product's partial sums
    take the widest); ``xq`` the rows of x quantized for a ggml product (at most 8 bytes a
    value of the widest input: ``attnlm_quantized_row_bytes``)."""
    widest = max(c, hd, nf)
    return (m * c, m * q, m * hd, m * nf, threads * cap, threads * m * max(q, c, nf, v),
            2 * m * widest + 16)  # fmt: skip


def configure(lib: ctypes.CDLL) -> str | None:
    """Set the argument types of the library's functions; the reason it cannot be used (a
    stale or foreign build whose structs differ), or None."""
    sizes = [lib.attnlm_sizes(i) for i in range(len(SIZED))]
    if sizes != [ctypes.sizeof(s) for s in SIZED]:
        return "the C decode step's structs do not match (rebuild)"
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.attnlm_decode_step.argtypes = [p, p, p, i64, i64, i64, p, p, p, ctypes.c_int,
                                       ctypes.c_int]  # fmt: skip
    lib.attnlm_step_rows.argtypes = [p, p, p, i64, p, p, ctypes.c_int]
    lib.attnlm_step_rows.restype = None
    lib.attnlm_linear.argtypes = [p, p, i64, p, p, ctypes.c_int]
    lib.attnlm_activate.argtypes = [i64, p, i64]
    lib.attnlm_quantize_rows.argtypes = [p, i64, i64, p]
    lib.attnlm_quantized_row_bytes.argtypes = [i64]
    lib.attnlm_quantized_row_bytes.restype = i64
    lib.attnlm_moe_floats.argtypes = [i64, i64, i64, i64, i64]
    lib.attnlm_moe_floats.restype = i64
    return None
