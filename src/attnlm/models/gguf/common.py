"""What the Llama-family GGUF adapters share (:mod:`.llama`, :mod:`.qwen2`, :mod:`.qwen3`,
:mod:`.phi3`, :mod:`.gemma2`, :mod:`.gemma3`): typed readers of one architecture's metadata
keys (:class:`Meta`: a key that is not one the adapter reads is refused, naming it), the
``[model]`` table every member has (:func:`base_table`), and the tensor table of a block
(:func:`block_parts`) with the parts the config names: q/k/v biases, q/k norms, post-norms,
fused q/k/v (Phi-3's ``attn_qkv``) and fused gate/up (Phi-3's ``ffn_up``).

llama.cpp's rotary pairs: its ``llama`` architecture stores q and k rows permuted into
adjacent pairs (Meta's layout, undone by :func:`~attnlm.models.gguf.parts.unpermute_rows`);
every other architecture here is "NEOX" style in llama.cpp (pairs ``(i, i + D/2)``, ours), so
their rows are read as stored (``permuted=False``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from attnlm.base.errors import InputError
from attnlm.base.ggufio import GGUFFile
from attnlm.models.gguf.parts import Part, check_block_count

#: the longest context a file may declare (2^27 tokens, ten times the longest of today's models:
#: the model's position limits are sized from it)
MAX_CONTEXT = 1 << 27

#: the keys every Llama-family adapter reads
BASE_KEYS = frozenset({
    "block_count", "embedding_length", "feed_forward_length", "attention.head_count",
    "attention.head_count_kv", "attention.layer_norm_rms_epsilon", "rope.freq_base",
    "context_length", "vocab_size", "rope.dimension_count", "attention.key_length",
    "attention.value_length", "rope.scaling.type",
})  # fmt: skip


def float32(value: Any) -> float:
    """A float32 from the file as its shortest decimal (``1e-05``, not ``9.99999974e-06``)."""
    return float(str(np.float32(value)))


class Meta:
    """The ``<arch>.`` keys of one file. Construction refuses any ``<arch>.`` key outside
    ``keys`` (naming it): nothing the file says is ignored unread."""

    def __init__(self, header: GGUFFile, arch: str, keys: Iterable[str]) -> None:
        self.header, self.arch, self.path = header, arch, header.path
        known = set(keys)
        for key in header:
            if key.startswith(f"{arch}.") and key[len(arch) + 1 :] not in known:
                raise InputError(f"{self.path}: metadata key {key} is not supported")

    def full(self, key: str) -> str:
        return f"{self.arch}.{key}"

    def has(self, key: str) -> bool:
        return self.full(key) in self.header

    def get(self, key: str, default: Any = None) -> Any:
        return self.header.get(self.full(key), default)

    def int(self, key: str, default: int | None = None, zero: bool = False) -> int:
        """A positive integer (``zero``: or 0); ``default`` when absent (None: required)."""
        full = self.full(key)
        value = self.header.get(full, default)
        if value is None:
            raise InputError(f"{self.path}: the GGUF metadata has no {full}")
        if isinstance(value, (list, np.ndarray)):
            raise InputError(f"{self.path}: {full} is a per-layer list, which is not supported")
        ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
        if not ok or value < 0 or (value == 0 and not zero):
            raise InputError(f"{self.path}: {full} must be a positive integer, got {value!r}")
        return int(value)

    def float(self, key: str, default: float | None = None, what: str = "invalid") -> float:
        """A positive finite float (as float32's shortest decimal); ``default`` when absent."""
        full = self.full(key)
        value = self.header.get(full, default)
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, float) or not 0 < value < math.inf:
            raise InputError(f"{self.path}: {full} {value!r} is {what}")
        return float32(value)

    def refuse(self, key: str, why: str) -> None:
        raise InputError(f"{self.path}: {self.full(key)} = {self.get(key)!r}: {why}")


def vocab_size(header: GGUFFile, arch: str) -> int:
    """Rows of ``token_embd``, checked against the token list and ``<arch>.vocab_size``."""
    info = header.tensors.get("token_embd.weight")
    if info is None or len(info.shape) != 2:
        raise InputError(f"{header.path}: tensor 'token_embd.weight' is missing or not 2-D")
    rows = info.shape[0]
    tokens = header.get("tokenizer.ggml.tokens")
    for what, n in (("tokenizer.ggml.tokens", len(tokens) if tokens is not None else None),
                    (f"{arch}.vocab_size", header.get(f"{arch}.vocab_size"))):  # fmt: skip
        if n is not None and n != rows:
            raise InputError(
                f"{header.path}: {what} gives {n} tokens but token_embd.weight has {rows} rows"
            )
    return rows


def token_id(header: GGUFFile, which: str) -> int | None:
    value = header.get(f"tokenizer.ggml.{which}_token_id")
    return int(value) if isinstance(value, (int, np.integer)) else None


def head_width(meta: Meta, n_embd: int, n_head: int, free: bool, partial: bool = False) -> int:
    """The head width D: ``attention.key_length`` where the file has it (``free``; else it
    must be ``n_embd / n_head``), else ``n_embd / n_head``; ``value_length`` and
    ``rope.dimension_count`` must equal it (other value widths are not supported, nor partial
    rotary but where the adapter reads it itself: ``partial``)."""
    if not meta.has("attention.key_length") or not free:
        if n_embd % n_head:
            raise InputError(
                f"{meta.path}: {meta.full('embedding_length')} {n_embd} is not a multiple of "
                f"{meta.full('attention.head_count')} {n_head}"
            )
        d = n_embd // n_head
    else:
        d = meta.int("attention.key_length")
    for key in ("attention.key_length", "attention.value_length", "rope.dimension_count"):
        if meta.has(key) and meta.int(key) != d and not (partial and key.startswith("rope")):
            what = "partial rotary" if key.startswith("rope") else "a different width"
            raise InputError(
                f"{meta.path}: {meta.full(key)} = {meta.get(key)} differs from the head "
                f"width {d} (not supported: {what})"
            )
    return d


def base_table(meta: Meta, *, free_head: bool = True, scalings: tuple[str, ...] = (),
               partial: bool = False) -> dict:  # fmt: skip
    """The ``[model]`` table of our Llama every member shares: widths, heads (``d_head`` where
    it is not ``n_embd / n_head``), norms' epsilon, rotary base (absent: 10000, llama.cpp's
    default), context, vocabulary, tied head (no ``output.weight``), BOS / EOS, and the rotary
    scaling (``none``, or one of ``scalings``: ``linear`` with ``rope.scaling.factor``; in the
    architectures of :data:`FACTORS_ARCHS`, Llama 3.1's from a :data:`ROPE_FREQS` tensor,
    :func:`llama3_scaling`)."""
    header, path = meta.header, meta.path
    n_embd, n_head = meta.int("embedding_length"), meta.int("attention.head_count")
    d = head_width(meta, n_embd, n_head, free_head, partial)
    n_kv_head = meta.int("attention.head_count_kv", n_head)
    if n_head % n_kv_head:
        raise InputError(
            f"{path}: {meta.full('attention.head_count_kv')} {n_kv_head} does not divide "
            f"{meta.full('attention.head_count')} {n_head}"
        )
    n_layer = meta.int("block_count")
    check_block_count(header, meta.full("block_count"), n_layer)
    context = meta.int("context_length")
    if context > MAX_CONTEXT:
        raise InputError(
            f"{path}: {meta.full('context_length')} {context:,} is beyond any model's (at most "
            f"{MAX_CONTEXT:,})"
        )
    table = {
        "type": "llama",
        "arch": meta.arch,
        "vocab_size": vocab_size(header, meta.arch),
        "block_size": context,
        "n_layer": n_layer,
        "n_head": n_head,
        "n_kv_head": n_kv_head,
        "n_embd": n_embd,
        "d_ff": meta.int("feed_forward_length"),
        "rope_theta": meta.float("rope.freq_base", 10000.0),
        "rms_norm_eps": meta.float("attention.layer_norm_rms_epsilon", what="missing or invalid"),
        "tie_embeddings": "output.weight" not in header.tensors,
        "bos_id": token_id(header, "bos"),
        "eos_id": token_id(header, "eos"),
    }
    if d * n_head != n_embd:
        table["d_head"] = d
    scaling = meta.get("rope.scaling.type", "none")
    if scaling == "linear" and "linear" in scalings:
        table["rope_scaling"] = {"rope_type": "linear", "factor": meta.float("rope.scaling.factor")}
    elif scaling == "yarn" and "yarn" in scalings:
        table["rope_scaling"] = yarn_scaling(meta, context)
    elif scaling != "none":
        supported = ", ".join(("none", *scalings))
        raise InputError(
            f"{path}: {meta.full('rope.scaling.type')} {scaling!r} is not supported ({supported})"
        )
    factors = meta.arch in FACTORS_ARCHS
    if factors and ROPE_FREQS in header.tensors and scaling == "none":
        table["rope_scaling"] = llama3_scaling(header, table["rope_theta"], d)
    for name in header.tensors:
        if (factors and name == ROPE_FREQS) or (name in LONGROPE and meta.arch in LONGROPE_ARCHS):
            continue
        if name.startswith("rope_freqs") or ".rope_freqs" in name or "rope_factors" in name:
            raise InputError(
                f"{path}: tensor {name!r} (rotary frequency factors: Llama 3.1 or longrope "
                "scaling) is not supported"
            )
    return table


#: the keys of YaRN's scaling (:func:`yarn_scaling`), read by the architectures that allow it
YARN_KEYS = frozenset({
    "rope.scaling.factor", "rope.scaling.original_context_length", "rope.scaling.attn_factor",
    "rope.scaling.finetuned", "rope.scaling.yarn_beta_fast", "rope.scaling.yarn_beta_slow",
    "rope.scaling.yarn_ext_factor", "rope.scaling.yarn_attn_factor",
    "rope.scaling.yarn_log_multiplier",
})  # fmt: skip
#: what llama.cpp's graphs of these architectures take for YaRN's other keys (they read none
#: of them): files that say otherwise are refused
_YARN_FIXED = {"rope.scaling.yarn_beta_fast": 32.0, "rope.scaling.yarn_beta_slow": 1.0,
               "rope.scaling.yarn_ext_factor": 1.0,
               "rope.scaling.yarn_log_multiplier": 0.0}  # fmt: skip


def yarn_scaling(meta: Meta, context: int) -> dict[str, Any]:
    """YaRN's ``rope_scaling`` as llama.cpp applies it to a file: ``rope.scaling.factor``,
    the original context ``rope.scaling.original_context_length`` (absent: the file's
    context), the betas 32 and 1, and cos and sin times ``0.1 ln(factor) + 1`` and
    ``rope.scaling.attn_factor`` (llama.cpp computes that scale itself: a
    ``yarn_attn_factor`` must agree with it)."""
    from attnlm.nn.yarn import yarn_mscale

    factor = meta.float("rope.scaling.factor")
    n = meta.int("rope.scaling.original_context_length", context)
    for key, value in _YARN_FIXED.items():
        got = meta.get(key, value)
        number = isinstance(got, (int, float, np.number)) and not isinstance(got, bool)
        if not number or float(got) != value:
            meta.refuse(key, f"not {value:g} (llama.cpp's {meta.arch} graph does not read it)")
    mscale = yarn_mscale(factor)
    if meta.has("rope.scaling.yarn_attn_factor"):
        given = meta.float("rope.scaling.yarn_attn_factor")
        if abs(given - mscale) > 1e-3 * mscale:
            meta.refuse("rope.scaling.yarn_attn_factor", f"not 0.1 ln(factor) + 1 = {mscale:.4f}")
    scaling = {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": n}
    extra = meta.float("rope.scaling.attn_factor", 1.0)
    if extra != 1.0:
        scaling["attention_factor"] = mscale * extra
    return scaling


#: LongRoPE's two sets of factors, one per rotary pair: llama.cpp's converter writes them for
#: Phi-3's 128k models (``rope_scaling = {"rope_type": "longrope", ...}``), short then long
LONGROPE = ("rope_factors_short.weight", "rope_factors_long.weight")
#: the architectures whose files may hold them
LONGROPE_ARCHS = ("phi3",)


#: Llama 3.1's rotary frequency factors, one per rotary pair: llama.cpp's converter writes them
#: for a source model with ``rope_scaling = {"rope_type": "llama3", ...}``, and no key
ROPE_FREQS = "rope_freqs.weight"
#: the architectures whose files may hold :data:`ROPE_FREQS` (read and written as Llama 3.1's
#: scaling); in the others the tensor is refused
FACTORS_ARCHS = ("llama", "granite")
#: the architectures whose q and k rows llama.cpp stores in its interleaved (NORM) rotary order
#: (their adapters read them with ``block_parts(..., permuted=True)``); every other is NEOX
PERMUTED = ("llama", "smollm3", "granite")
#: the original contexts and (low, high) frequency factors :func:`llama3_scaling` tries
_LLAMA3_CONTEXTS = (8192, *(2**k for k in range(4, 22) if 2**k != 8192))
_LLAMA3_BANDS = ((1.0, 4.0), (1.0, 2.0), (1.0, 8.0), (2.0, 4.0), (2.0, 8.0), (0.5, 4.0))


def llama3_factors(theta: float, d: int, scaling: dict[str, Any]) -> np.ndarray:
    """``(D/2,)`` float32: the ``rope_freqs`` factors llama.cpp's converter writes for Llama
    3.1's scaling ``scaling`` (:data:`attnlm.nn.positional.ROPE_SCALING_KEYS`), in float32 as
    it computes them. llama.cpp divides pair ``i``'s angle by factor ``i``: 1 for wavelengths
    below ``N / high_freq_factor``, ``factor`` above ``N / low_freq_factor``, and
    ``1 / ((1 - s) / factor + s)`` between, ``s = (N / wavelength - low) / (high - low)``."""
    f32 = np.float32
    factor, low = f32(scaling["factor"]), f32(scaling["low_freq_factor"])
    high, n = f32(scaling["high_freq_factor"]), f32(scaling["original_max_position_embeddings"])
    freqs = f32(1.0) / (f32(theta) ** (np.arange(0, d, 2, dtype=f32) / f32(d)))
    wavelen = f32(2 * math.pi) / freqs
    smooth = (n / wavelen - low) / (high - low)
    between = f32(1.0) / ((f32(1.0) - smooth) / factor + smooth)
    out = np.where(wavelen < n / high, f32(1.0), np.where(wavelen > n / low, factor, between))
    return out.astype(f32)


def llama3_scaling(header: GGUFFile, theta: float, d: int) -> dict[str, Any]:
    """The ``rope_scaling`` of a file's :data:`ROPE_FREQS` tensor: the Llama 3.1 scaling whose
    factors (:func:`llama3_factors`) it holds, its ``factor`` the largest, the original
    context and band tried from common values; InputError (one line) for a tensor of another
    type or shape, or factors of no such scaling (nothing is guessed: every factor must
    match within float32 rounding)."""
    info, path = header.tensors[ROPE_FREQS], header.path
    if info.type_name != "F32" or tuple(info.shape) != (d // 2,):
        raise InputError(
            f"{path}: tensor {ROPE_FREQS!r} must be F32 with {d // 2} values (one per rotary "
            f"pair), got {info.type_name} {list(info.shape)}"
        )
    factors = np.frombuffer(header.raw(info), dtype=np.float32)
    factor = float(factors.max()) if np.isfinite(factors).all() else math.nan
    if factor >= 1.0:
        for n in _LLAMA3_CONTEXTS:
            for low, high in _LLAMA3_BANDS:
                scaling = {"rope_type": "llama3", "factor": factor, "low_freq_factor": low,
                           "high_freq_factor": high,
                           "original_max_position_embeddings": n}  # fmt: skip
                if np.allclose(factors, llama3_factors(theta, d, scaling), rtol=1e-5, atol=0):
                    return scaling
    raise InputError(
        f"{path}: tensor {ROPE_FREQS!r} holds rotary frequency factors of no Llama 3.1 scaling "
        "(other factors, such as longrope's, are not supported)"
    )


#: the keys of a mixture of experts (:func:`moe_fields`)
MOE_KEYS = frozenset({"expert_count", "expert_used_count", "expert_feed_forward_length"})


def moe_fields(meta: Meta, table: dict) -> dict[str, Any]:
    """A mixture of experts' fields of the ``[model]`` table, as llama.cpp reads them
    (empty without ``expert_count``, or with 0: a dense model): ``n_expert``,
    ``n_expert_used`` and each expert's width ``d_ff`` (``expert_feed_forward_length``;
    absent, llama.cpp's fallbacks: ``feed_forward_length`` in a ``llama`` file (Mixtral),
    ``feed_forward_length / expert_used_count`` in the others).
    The chosen experts' weights are renormalised (llama.cpp's ``llama`` and ``qwen3moe``
    graphs always do); a per-layer list of experts is refused."""
    n = meta.int("expert_count", 0, zero=True)
    if not n:
        return {}
    used = meta.int("expert_used_count")
    if used > n:
        meta.refuse("expert_used_count", f"more than the {n} experts")
    width = table["d_ff"]
    if meta.has("expert_feed_forward_length"):
        width = meta.int("expert_feed_forward_length")
    elif meta.arch != "llama":
        width = table["d_ff"] // used
    return {"n_expert": n, "n_expert_used": used, "d_ff": width, "moe_norm_topk": True}


def swa_pattern(meta: Meta, n_layer: int, period: int) -> tuple[str, ...]:
    """Each layer's kind as llama.cpp decides it: ``attention.sliding_window_pattern`` as a
    per-layer list of booleans (true: sliding), or a period ``n`` (default ``period``) where
    layer ``i`` slides unless ``i % n == n - 1`` (``n = 0``: every layer slides)."""
    value = meta.get("attention.sliding_window_pattern", period)
    if isinstance(value, (list, np.ndarray)):
        flags = list(value)
        if len(flags) != n_layer or not all(isinstance(f, (bool, np.bool_)) for f in flags):
            meta.refuse("attention.sliding_window_pattern", f"not {n_layer} booleans")
    else:
        n = meta.int("attention.sliding_window_pattern", period, zero=True)
        flags = [n == 0 or i % n < n - 1 for i in range(n_layer)]
    return tuple("sliding_attention" if f else "full_attention" for f in flags)


def embed_scale(n_embd: int) -> float:
    """Gemma's embedding scale as llama.cpp computes it: ``sqrtf(n_embd)`` in float32."""
    return float(np.sqrt(np.float32(n_embd), dtype=np.float32))


def block_parts(config: Any, header: GGUFFile, *, permuted: bool = False) -> list[Part]:
    """Where each tensor of the file goes in our Llama (with the parts ``config`` names), with
    the shape the config implies (checked by :func:`~attnlm.models.gguf.parts.check_parts`
    before the C engine or the PyTorch loader reads a byte). ``permuted``: q and k rows are in
    llama.cpp's ``llama`` order (moved back on load). A fused ``blk.N.attn_qkv`` (Phi-3) or
    ``ffn_up`` of twice the width without ``ffn_gate`` (Phi-3: gate rows first) fill our fused
    parameters as stored."""
    c, d, f, v = config.n_embd, config.head_dim, config.ffn_width, config.vocab_size
    q, kv = config.n_head * d, config.n_kv_head * d
    out = [Part("token_embd.weight", "tok_emb.weight", shape=(v, c)),
           Part("output_norm.weight", "ln_f.weight", shape=(c,))]  # fmt: skip
    r = getattr(config, "rotary_width", d)  # (the rotated features: partial rotary's fewer)
    for name in (ROPE_FREQS, *LONGROPE):  # (base_table read them, or refused the file)
        if name in header.tensors:
            out.append(Part(name, "", shape=(r // 2,)))
    if not config.tie_embeddings:
        out.append(Part("output.weight", "lm_head.weight", shape=(v, c)))
    for i in range(config.n_layer):
        blk, ours = f"blk.{i}.", f"blocks.{i}."
        qkv = ours + "attn.qkv_proj."
        pre = getattr(config, "pre_norms", True)  # (OLMo 2 has none)
        if pre:
            out.append(Part(blk + "attn_norm.weight", ours + "ln_1.weight", shape=(c,)))
        if blk + "attn_qkv.weight" in header.tensors:
            out.append(Part(blk + "attn_qkv.weight", qkv + "weight", shape=(q + 2 * kv, c)))
            if config.qkv_bias:
                out.append(Part(blk + "attn_qkv.bias", qkv + "bias", shape=(q + 2 * kv,)))
        else:
            spans = {"q": (0, q, config.n_head), "k": (q, q + kv, config.n_kv_head),
                     "v": (q + kv, q + 2 * kv, 0)}  # fmt: skip
            for name, (start, stop, heads) in spans.items():
                rows = stop - start
                turn = heads if permuted else 0
                out.append(Part(f"{blk}attn_{name}.weight", qkv + "weight", (start, stop),
                                heads=turn, shape=(rows, c)))  # fmt: skip
                if config.qkv_bias:
                    out.append(Part(f"{blk}attn_{name}.bias", qkv + "bias", (start, stop),
                                    shape=(rows,)))  # fmt: skip
        out.append(Part(blk + "attn_output.weight", ours + "attn.out_proj.weight", shape=(c, q)))
        if config.qk_norm:  # each head's (D,), or all heads' at once (OLMo 2)
            widths = (q, kv) if getattr(config, "qk_norm_all", False) else (d, d)
            out += [Part(f"{blk}attn_{x}_norm.weight", f"{ours}attn.{x}_norm.weight", shape=(w,))
                    for x, w in zip("qk", widths, strict=True)]  # fmt: skip
        if pre:
            out.append(Part(blk + "ffn_norm.weight", ours + "ln_2.weight", shape=(c,)))
        if getattr(config, "n_expert", None):
            out += expert_parts(config, blk, ours)
        else:
            out += dense_parts(header, blk, ours, c, f)
        if config.post_norms:
            out += [Part(blk + "post_attention_norm.weight", ours + "ln_post_attn.weight",
                         shape=(c,)),
                    Part(blk + "post_ffw_norm.weight", ours + "ln_post_mlp.weight",
                         shape=(c,))]  # fmt: skip
    return out


def dense_parts(header: GGUFFile, blk: str, ours: str, c: int, f: int) -> list[Part]:
    """The feed-forward's tensors: ``ffn_gate`` and ``ffn_up`` into the rows of our fused
    ``mlp.fc`` (or, without ``ffn_gate``, Phi-3's ``ffn_up`` of twice the width as stored),
    ``ffn_down`` -> ``mlp.proj``."""
    fc = ours + "mlp.fc.weight"
    if blk + "ffn_gate.weight" in header.tensors or not _fused_up(header, blk, f):
        out = [Part(blk + "ffn_gate.weight", fc, (0, f), shape=(f, c)),
               Part(blk + "ffn_up.weight", fc, (f, 2 * f), shape=(f, c))]  # fmt: skip
    else:
        out = [Part(blk + "ffn_up.weight", fc, shape=(2 * f, c))]
    return [*out, Part(blk + "ffn_down.weight", ours + "mlp.proj.weight", shape=(c, f))]


def expert_parts(config: Any, blk: str, ours: str) -> list[Part]:
    """A mixture of experts' tensors (llama.cpp's names): the router ``ffn_gate_inp``
    ``(E, C)`` -> ``mlp.router``, and expert ``e``'s matrix of the stacked
    ``ffn_gate_exps`` / ``ffn_up_exps`` ``(E, F, C)`` (our ``mlp.experts.{e}.fc``'s gate and
    up rows) and ``ffn_down_exps`` ``(E, C, F)`` (its ``proj``)."""
    c, f, n = config.n_embd, config.ffn_width, config.n_expert
    out = [Part(blk + "ffn_gate_inp.weight", ours + "mlp.router.weight", shape=(n, c))]
    for e in range(n):
        mine = f"{ours}mlp.experts.{e}."
        out += [Part(blk + "ffn_gate_exps.weight", mine + "fc.weight", (0, f), shape=(n, f, c),
                     expert=e),
                Part(blk + "ffn_up_exps.weight", mine + "fc.weight", (f, 2 * f),
                     shape=(n, f, c), expert=e),
                Part(blk + "ffn_down_exps.weight", mine + "proj.weight", shape=(n, c, f),
                     expert=e)]  # fmt: skip
    return out


def _fused_up(header: GGUFFile, blk: str, f: int) -> bool:
    info = header.tensors.get(blk + "ffn_up.weight")
    return info is not None and len(info.shape) == 2 and info.shape[0] == 2 * f


def has_tensor(header: GGUFFile, suffix: str) -> bool:
    """Whether block 0 has ``blk.0.<suffix>`` (the parts a file has are decided by its
    tensors where llama.cpp decides them so: biases, fused projections)."""
    return f"blk.0.{suffix}" in header.tensors


def gemma_parts(
    meta: Meta, table: dict, *, scale_layers: int, period: int | None,
    local_default: float | None,
) -> dict[str, Any]:  # fmt: skip
    """What Gemma 2 and 3 add to :func:`base_table`, as llama.cpp decides it: the embedding
    scale, GeGLU, post-norms, the score scale (``1/sqrt(n_embd / n_head)`` for the model of
    ``scale_layers`` layers, else the default ``1/sqrt(D)``), and with sliding layers
    (``period``: :func:`swa_pattern`) their kinds and rotary base (``rope.freq_base_swa``,
    absent: ``local_default``, None: the global base)."""
    n_embd, n_head = table["n_embd"], table["n_head"]
    out: dict[str, Any] = {"embed_scale": embed_scale(n_embd), "mlp_act": "gelu_tanh",
                           "post_norms": True}  # fmt: skip
    if table["n_layer"] == scale_layers:
        out["attn_scale"] = float(np.float32(1.0) / np.sqrt(np.float32(n_embd // n_head)))
    if period is not None:
        out["layer_types"] = list(swa_pattern(meta, table["n_layer"], period))
        local = meta.float("rope.freq_base_swa", local_default or table["rope_theta"])
        if local_default is not None or local != table["rope_theta"]:
            out["rope_local_theta"] = local
    return out
