"""A Llama-family GGUF file as an :class:`~attnlm.runtime.engine.Engine` (the ``c-engine``
backend: the C decode step without PyTorch), without a float32 copy of any matrix. The
architectures: ``llama``, ``qwen2`` (q/k/v biases), ``qwen3`` (per-head q/k norms, a head
width other than ``n_embd / n_head``), ``phi3`` (fused q/k/v and gate/up matrices, each one
product), ``gemma2`` and ``gemma3`` (the embedding scale, post-norms, GeGLU, soft-capped
scores and logits, sliding-window layers with their own rotary base, a linear rotary
scaling), ``qwen3moe`` and Mixtral (``llama`` with experts: a mixture of experts, only the
chosen experts' rows of the stacked ``ffn_*_exps`` tensors multiplied), read by their
adapters (:data:`ADAPTERS`), every value as the PyTorch loader reads
it; any part the step does not compute (a rotary scaling other than linear, ...) leaves the
file to PyTorch. Where the products' activations are quantized llama.cpp's way, GeGLU's GELU
is llama.cpp's too (:attr:`EngineConfig.gelu_table`).
The weights are held in one of two ways:

* a file whose matrices are all Q8_0, or all Q4_0 / Q4_1 (the head may be Q8_0), has its
  blocks moved into the step's q8 / q4 layouts by :mod:`attnlm.quant.blocks` (numpy; the
  functions the PyTorch loader, :mod:`attnlm.models.gguf.loader`, uses for its q8 / q4
  layers, so both hold the same bytes: tested);
* any other mix of the types the C step multiplies as stored (F32, F16, BF16, Q8_0, Q4_0,
  Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4:
  :data:`attnlm.native.structs.GGML_FORMATS`, the
  kernels in ``native/ggml_blocks.h``), a Q4_K_M file for one, is multiplied in its blocks as
  the file stores them, read from a memory map of the file (:data:`AS_STORED`): no
  re-quantization, the file's numbers are the model's. q and k keep llama.cpp's row order
  and the step rotates adjacent pairs (what that order means in a ``llama`` file; the other
  architectures store NEOX rows, rotated in pairs ``(i, i + D/2)``); the token embedding's
  rows are dequantized as tokens ask for them.

The file is read by :mod:`attnlm.base.ggufio` (the one GGUF parser) and its tensors are placed
by the architecture's own table (:func:`attnlm.models.gguf.llama.parts` and its siblings), the
q8 / q4 layouts' q and k rows back from the ``llama`` rotary order by
:func:`attnlm.models.gguf.parts.unpermute_rows`.

:func:`engine_format` says whether the engine holds a file's model (None sends the resolver
down the PyTorch path, which handles, or refuses in one line, everything else: other
architectures, matrices of other ggml types, a format other than the file's own);
:func:`open_engine` builds it; :func:`engine_for` is the resolver's way in
(:func:`attnlm.loading.sources.resolve` with ``engine_ok``), the planner deciding.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from attnlm.base.foreign import check_finite
from attnlm.base.ggufio import GGUFFile
from attnlm.models.gguf import (
    gemma2,
    gemma3,
    gptoss,
    granite,
    llama,
    olmo2,
    phi3,
    qwen2,
    qwen3,
    qwen3moe,
    smollm3,
)  # fmt: skip
from attnlm.models.gguf.common import PERMUTED, ROPE_FREQS
from attnlm.models.gguf.parts import Part, check_parts, unpermute_rows
from attnlm.native import structs
from attnlm.nn.yarn import longrope_scale, yarn_angle_factors, yarn_scale
from attnlm.quant.blocks import (
    GROUP,
    NATIVE_FORMAT,
    SCALE_OFFSETS,
    SUPPORTED,
    codes,
    dequantize,
    pack_q4,
)
from attnlm.runtime.engine import BlockWeights, Engine, EngineConfig, LinearWeights


def engine_for(path: Path, device: Any, weights: str | None, threads: int | None) -> Any:
    """``(engine, tokenizer, chat template, stop ids)`` where the GGUF file ``path`` runs on
    the C engine for a decode on ``device`` (a ``--device`` string) in ``weights``, as the
    planner says (:func:`attnlm.runtime.planner.engine_reason`), else None; ``engine.reason``
    says why it was chosen. :func:`attnlm.loading.sources.resolve` calls it; no PyTorch is imported.
    """
    if not isinstance(device, (str, type(None))):
        return None
    from attnlm.native import default_threads
    from attnlm.runtime.planner import engine_reason
    from attnlm.tokenizers.gguf import GGUFTokenizer, gguf_chat_setup

    header = GGUFFile(path)
    ok, reason = engine_reason(engine_format(header, weights), device)
    if not ok:
        return None
    engine = open_engine(header, weights, threads or default_threads(), reason)
    if engine is None:
        return None
    tok = GGUFTokenizer.from_gguf(header)
    template, stops = gguf_chat_setup(tok, f"{path}: tokenizer.chat_template")
    return engine, tok, template, stops


#: :func:`engine_format`'s name for a model multiplied in the file's own blocks
AS_STORED = "ggml-block"


def engine_format(header: GGUFFile, weights: str | None) -> str | None:
    """The format the engine would hold ``header``'s model in (``weights`` or the file's own
    precision class; :data:`AS_STORED`: each matrix in its ggml blocks as stored, where
    ``weights`` is not given), or None where it does not apply (the PyTorch path decides)."""
    table = _table(header)
    if table is None:
        return None
    matrices = {n: i.type_name for n, i in header.tensors.items() if len(i.shape) >= 2}
    vectors = {i.type_name for i in header.tensors.values() if len(i.shape) == 1}
    if not vectors <= {"F32", "F16"}:
        return None
    if "n_expert" in table:  # experts are multiplied in their blocks as stored, nothing else
        ok = weights is None and set(matrices.values()) <= set(structs.GGML_FORMATS)
        return AS_STORED if ok else None
    native = _native_format(matrices, weights)
    if native is not None or weights is not None:
        return native
    return AS_STORED if set(matrices.values()) <= set(structs.GGML_FORMATS) else None


#: the GGUF architectures the engine runs, by their adapters (:mod:`attnlm.models.gguf`)
ADAPTERS = {"llama": llama, "qwen2": qwen2, "qwen3": qwen3, "phi3": phi3, "gemma2": gemma2,
            "gemma3": gemma3, "qwen3moe": qwen3moe, "smollm3": smollm3,
            "granite": granite, "olmo2": olmo2, "gpt-oss": gptoss}  # fmt: skip
#: the ``[model]`` table's keys the step computes (any other part sends the file to PyTorch;
#: ``rope_scaling`` linear, llama3 or yarn)
_STEP_KEYS = {"type", "arch", "vocab_size", "block_size", "n_layer", "n_head", "n_kv_head",
              "n_embd", "d_ff", "rope_theta", "rms_norm_eps", "tie_embeddings", "bos_id",
              "eos_id", "qkv_bias", "qk_norm", "d_head", "embed_scale", "mlp_act", "post_norms",
              "attn_scale", "attn_softcap", "final_softcap", "sliding_window", "layer_types",
              "rope_local_theta", "rope_scaling", "n_expert", "n_expert_used",
              "moe_norm_topk", "nope_layers", "residual_scale", "logit_scale", "qk_norm_all",
              "pre_norms", "rotary_dim", "attn_out_bias", "attn_sinks", "moe_bias",
              "moe_gating"}  # fmt: skip
#: the ``[model]`` table's keys that :class:`EngineConfig` takes by name
_NAMED_KEYS = ("embed_scale", "mlp_act", "post_norms", "attn_scale", "attn_softcap",
               "final_softcap", "sliding_window", "layer_types", "rope_local_theta",
               "n_expert", "n_expert_used", "moe_norm_topk", "nope_layers", "residual_scale",
               "logit_scale", "qk_norm_all", "pre_norms", "rotary_dim", "moe_gating")  # fmt: skip


def _table(header: GGUFFile) -> dict[str, Any] | None:
    """The ``[model]`` table of ``header``'s model where its architecture is one of
    :data:`ADAPTERS` and it uses only parts the step computes, else None (the PyTorch path
    loads the file or refuses it in one line); a file the adapter refuses raises its
    InputError."""
    adapter = ADAPTERS.get(header.get("general.architecture"))
    if adapter is None:
        return None
    # a file its own adapter refuses is refused here, in the same line (the PyTorch path would
    # refuse it too): it never reaches the step
    table = adapter.config_table(header)
    # a linear scaling, Llama 3.1's (the file's rope_freqs factors), YaRN's or LongRoPE's, as
    # llama.cpp takes them
    kinds = ("linear", "llama3", "yarn", "longrope")
    if table.get("rope_scaling", {"rope_type": "linear"})["rope_type"] not in kinds:
        return None
    return table if set(table) <= _STEP_KEYS else None


def _native_format(matrices: dict[str, str], weights: str | None) -> str | None:
    """``q4`` where every matrix is Q4_0 / Q4_1 (the step's own q4 layout holds them as
    stored), ``q8`` for Q8_0 matrices only when ``weights`` asks for it (by default they stay
    in their blocks, multiplied as llama.cpp multiplies them), else None."""
    body = {t for n, t in matrices.items() if n not in ("token_embd.weight", "output.weight")}
    classes = {NATIVE_FORMAT.get(t) for t in body}
    if len(classes) != 1 or None in classes:
        return None
    fmt = classes.pop()
    head = matrices.get("output.weight")  # as the PyTorch loader: a q4 model's head may be q8
    if weights not in (None, fmt) or matrices.get("token_embd.weight") != "Q8_0":
        return None
    if fmt == "q8" and weights is None:  # Q8_0 blocks as stored, with llama.cpp's Q8_0
        return None  # activations: its numbers (the q8 layout takes float activations)
    if head is not None and NATIVE_FORMAT.get(head) not in (fmt, "q8"):
        return None
    return fmt


def open_engine(header: GGUFFile, weights: str | None, threads: int, reason: str = ""
                ) -> Engine | None:  # fmt: skip
    """The engine of ``header`` (see :func:`engine_format`), or None where it does not hold
    the file's model; ``reason``: why the planner chose it."""
    fmt = engine_format(header, weights)
    if fmt is None:
        return None
    arch = header.get("general.architecture")
    table = ADAPTERS[arch].config_table(header)  # checks the keys as the PyTorch loader does
    # llama.cpp's "llama" rows, kept as stored, rotate adjacent pairs; its other
    # architectures (NEOX), and our q8 / q4 rows, rotate-half pairs
    turn = 2 if fmt == AS_STORED and arch in PERMUTED else 1
    named = {key: table[key] for key in _NAMED_KEYS if key in table}
    for key in ("layer_types", "nope_layers"):
        if key in named:
            named[key] = tuple(named[key])
    scaling = table.get("rope_scaling") or {}
    if scaling.get("rope_type") == "llama3":  # the file's own factors (checked by the adapter)
        named["rope_factors"] = tuple(np.frombuffer(header.raw(ROPE_FREQS), np.float32).tolist())
    elif scaling.get("rope_type") == "yarn":  # its ramp as factors, its scale on the table
        d = table.get("rotary_dim") or table.get("d_head") or table["n_embd"] // table["n_head"]
        factors = yarn_angle_factors(table["rope_theta"], d, scaling)
        named["rope_factors"] = tuple(factors.tolist())
        named["rope_mscale"] = yarn_scale(scaling["factor"], scaling.get("attention_factor"))
    elif scaling.get("rope_type") == "longrope":  # two sets of factors, the scale on the table
        named["rope_factors"] = tuple(scaling["short_factor"])
        named["rope_long_factors"] = tuple(scaling["long_factor"])
        named["rope_long_from"] = n = scaling["original_max_position_embeddings"]
        named["rope_mscale"] = longrope_scale(scaling["factor"], n, scaling.get("attention_factor"))
    config = EngineConfig(
        table["n_layer"], table["n_embd"], table["n_head"], table["n_kv_head"], table["d_ff"],
        table["vocab_size"], table["rope_theta"], table["rms_norm_eps"], table["block_size"],
        table["tie_embeddings"], turn, table.get("qkv_bias", False),
        table.get("qk_norm", False), table.get("d_head"),
        rope_linear=scaling.get("factor") if scaling.get("rope_type") == "linear" else None,
        **named,
        gelu_table=fmt == AS_STORED and _activations() != structs.ACT_FLOAT,
    )  # fmt: skip
    if config.head_dim % 2 or config.n_embd % GROUP or config.n_head % config.n_kv_head:
        return None
    parts = ADAPTERS[arch].parts(config, header)
    check_parts(header, parts)  # every tensor there, in the shape the C step will be told
    by_ours: dict[str, list[Part]] = {}
    for part in parts:
        by_ours.setdefault(part.ours, []).append(part)
    if fmt == AS_STORED:
        return _as_stored(header, config, by_ours, threads, reason)
    weights = _Weights(header, by_ours)
    blocks = [weights.block(i) for i in range(config.n_layer)]
    emb = _codes(header, by_ours["tok_emb.weight"][0])  # Q8_0 (engine_format)
    head = _linear(emb) if config.tie_embeddings else weights.matrix("lm_head.weight")
    norm = weights.norm("ln_f.weight")
    return Engine(config, blocks, norm, emb["q"], emb["s"], head, threads, reason)


class _Weights:
    """Reads our parameters' values out of ``header`` by the Llama table ``by_ours``."""

    def __init__(self, header: GGUFFile, by_ours: dict[str, list[Part]]) -> None:
        self.header, self.by_ours = header, by_ours

    def matrix(self, name: str) -> LinearWeights:
        parts = sorted(self.by_ours[name], key=lambda p: p.rows or (0,))
        pieces = [_codes(self.header, p) for p in parts]
        out = _linear({key: np.concatenate([p[key] for p in pieces]) for key in pieces[0]})
        out.bias = self.bias(name)
        return out

    def bias(self, weight: str) -> np.ndarray | None:
        """The bias of the product ``weight`` names (its parts' in row order), or None."""
        name = weight.removesuffix("weight") + "bias"
        if name not in self.by_ours:
            return None
        parts = sorted(self.by_ours[name], key=lambda p: p.rows or (0,))
        return np.concatenate([self.vector(p) for p in parts])

    def norm(self, name: str) -> np.ndarray:
        return self.vector(self.by_ours[name][0])

    def vector(self, part: Part) -> np.ndarray:
        """A float32 copy of the F32 / F16 vector ``part`` (engine_format), checked finite."""
        info = self.header.tensors[part.gguf]
        raw = self.header.raw(info)  # F32 or F16 (engine_format)
        out = raw.view(np.float32 if info.type_name == "F32" else np.float16).astype(np.float32)
        check_finite({info.name: out}, self.header.path)
        return out

    def block(self, i: int) -> BlockWeights:
        ours = f"blocks.{i}."
        return BlockWeights(
            self.head_norm(ours + "ln_1.weight"), self.head_norm(ours + "ln_2.weight"),
            self.matrix(ours + "attn.qkv_proj.weight"), self.matrix(ours + "attn.out_proj.weight"),
            self.matrix(ours + "mlp.fc.weight"), self.matrix(ours + "mlp.proj.weight"),
            None, None, None, *self.extra_norms(i),
        )  # fmt: skip

    def head_norm(self, name: str) -> np.ndarray | None:
        """An optional norm's gains (Qwen3's q / k norms, Gemma's post-norms), or None where
        the model has none."""
        return self.norm(name) if name in self.by_ours else None

    def extra_norms(self, i: int) -> list[np.ndarray | None]:
        """Block ``i``'s optional norms, in :class:`BlockWeights`' order after ``up``: q, k
        (per head), post-attention, post-feed-forward (each as stored: Gemma's converter
        writes ``1 + w``, the gains themselves)."""
        names = ("attn.q_norm", "attn.k_norm", "ln_post_attn", "ln_post_mlp")
        return [self.head_norm(f"blocks.{i}.{name}.weight") for name in names]


# -- the blocks ------------------------------------------------------------------------------


def _codes(header: GGUFFile, part: Part) -> dict[str, np.ndarray]:
    """A Q8_0 / Q4_0 / Q4_1 matrix as its codes and float16 scales
    (:func:`attnlm.quant.blocks.codes`), llama.cpp's rotary row order undone for ``part.heads``
    heads; a scale that is NaN or infinite is refused, as the PyTorch loader refuses it."""
    info = header.tensors[part.gguf]
    found = codes(header.raw(info), info.type_name, tuple(info.shape))
    for key in ("s", "d", "m"):  # a damaged file is refused, not decoded
        if key in found:
            check_finite({info.name: found[key]}, header.path, "scales of")
    if part.heads:
        found = {key: unpermute_rows(value, part.heads) for key, value in found.items()}
    return found


def _linear(found: dict[str, np.ndarray]) -> LinearWeights:
    """q8 ``{q, s}`` or q4 ``{u, d, m}`` codes in the step's layout (what
    :class:`attnlm.quant.layers.QuantLinear` stores: :func:`attnlm.quant.blocks.pack_q4`)."""
    if "q" in found:
        q, s = (np.ascontiguousarray(found[key]) for key in ("q", "s"))
        return LinearWeights(structs.Q8, q.shape[0], q.shape[1], q, s, q.shape[0])
    n, k = found["u"].shape
    packed, scales = pack_q4(found["u"], found["d"], found["m"])
    return LinearWeights(structs.Q4, n, k, packed, scales, packed.shape[0])


# -- the blocks as stored --------------------------------------------------------------------

_TYPE_IDS = {name: i for i, (name, _, _) in SUPPORTED.items()}
#: the products' activations: float (each product equals the float32 forward's, up to the
#: order of the sums) or int (quantized to 8 bits per block of 32, llama.cpp's way); unset:
#: the C step's default (int, measured faster for every block type)
ACTIVATIONS_ENV = "ATTNLM_GGML_ACTIVATIONS"
_ACTIVATIONS = {"float": structs.ACT_FLOAT, "int": structs.ACT_INT}


def _activations() -> int:
    """The ggml products' activations :data:`ACTIVATIONS_ENV` asks for (unset: ``ACT_AUTO``)."""
    return _ACTIVATIONS.get(os.environ.get(ACTIVATIONS_ENV, ""), structs.ACT_AUTO)


def _stored(header: GGUFFile, mapped: np.ndarray, part: Part) -> tuple[np.ndarray, Any]:
    """``(rows' bytes (N, row bytes) viewed in the map, the tensor's info)``; a float16 block
    scale or a float value that is NaN or infinite is refused, as the PyTorch loader refuses
    it (the strided views read every block's scales, no copy of the tensor)."""
    info = header.tensors[part.gguf]
    n = int(np.prod(info.shape[:-1]))  # a stacked experts' tensor: every expert's rows
    rows = mapped[info.offset : info.offset + info.nbytes].reshape(n, -1)
    blocks = rows.reshape(-1, SUPPORTED[info.type][2])
    name = info.type_name
    if name in SCALE_OFFSETS:
        for at in SCALE_OFFSETS[name]:
            check_finite({info.name: blocks[:, at : at + 2].view(np.float16)}, header.path,
                         "scales of")  # fmt: skip
    elif name in ("F32", "F16"):
        check_finite({info.name: rows.view(np.float32 if name == "F32" else np.float16)},
                     header.path)  # fmt: skip
    elif name == "MXFP4":  # values F 2^(e - 128), |F| <= 12: infinite only where e >= 253
        big = blocks[blocks[:, 0] >= 253]
        check_finite({info.name: dequantize(big.reshape(-1), info.type, (32 * len(big),))},
                     header.path)  # fmt: skip
    return rows, info


def _as_stored(header: GGUFFile, config: EngineConfig, by_ours: dict[str, list[Part]],
               threads: int, reason: str) -> Engine:  # fmt: skip
    """The engine multiplying every matrix in its blocks as the file stores them (see the
    module docstring)."""
    mapped = np.memmap(header.path, dtype=np.uint8, mode="r")
    norms = _Weights(header, by_ours)
    act = _activations()

    def linears(name: str) -> list[LinearWeights]:
        biases = sorted(by_ours.get(name.removesuffix("weight") + "bias", []),
                        key=lambda p: p.rows or (0,))  # fmt: skip
        out = []
        for i, part in enumerate(sorted(by_ours[name], key=lambda p: p.rows or (0,))):
            rows, info = _stored(header, mapped, part)
            n, k = rows.shape[0], info.shape[-1]
            fmt = structs.GGML_FORMATS[info.type_name]
            bias = norms.vector(biases[i]) if biases else None
            out.append(LinearWeights(fmt, n, k, rows, None, n, act, bias))
        return out

    blocks = []
    for i in range(config.n_layer):
        ours = f"blocks.{i}."
        # fused q/k/v or gate/up (Phi-3) are one product each, the step's own layouts
        q, k, v = (*linears(ours + "attn.qkv_proj.weight"), None, None)[:3]
        mlp, router = ours + "mlp.", None
        if config.n_expert:  # expert 0's parts name the stacked tensors, read whole
            (router,) = linears(mlp + "router.weight")
            mlp += "experts.0."
        gate, up = (*linears(mlp + "fc.weight"), None)[:2]
        (out,), (proj,) = linears(ours + "attn.out_proj.weight"), linears(mlp + "proj.weight")
        blocks.append(BlockWeights(norms.head_norm(ours + "ln_1.weight"),
                                   norms.head_norm(ours + "ln_2.weight"), q, out, gate, proj, k, v,
                                   up, *norms.extra_norms(i), router=router,
                                   sinks=norms.head_norm(ours + "attn.sinks")))  # fmt: skip
    (emb,) = linears("tok_emb.weight")
    head = emb if config.tie_embeddings else linears("lm_head.weight")[0]
    emb_type = _TYPE_IDS[header.tensors[by_ours["tok_emb.weight"][0].gguf].type_name]
    return Engine(config, blocks, norms.norm("ln_f.weight"), emb.w, None, head, threads,
                  reason, emb_type)  # fmt: skip
