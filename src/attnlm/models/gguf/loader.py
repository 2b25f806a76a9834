"""Build one of our models from a GGUF file: the architecture's config from the metadata, an
uninitialised model from the registry, then each tensor straight into its parameter, in one of
the decode-time weight formats (:mod:`attnlm.quant`).

An architecture module (:mod:`.llama`, :mod:`.qwen2`, :mod:`.qwen3`, :mod:`.gemma2`,
:mod:`.gemma3`, :mod:`.phi3`, :mod:`.gpt2`; the Llama family's share :mod:`.common`) says
two things: the ``[model]`` table (``config_table(header)``) and where every file tensor goes
(``parts(config, header)``, a list of :class:`Part`). Everything else is here and shared:
type checks before anything is built, shape checks per tensor, the rotary row order, and the
checks that every parameter was filled and every tensor of the file used.

Memory: the model is built without its random initialisation (the parameters are filled from
the file anyway, and initialising 135M parameters costs about a second), and each tensor's
bytes are read, dequantized into the parameter (or its rows of a fused parameter) and dropped,
so the peak is the float32 model plus one tensor's bytes.

In ``q8`` / ``q4`` (:func:`load_quantized`) the float32 model is never built: its matrices are
allocated but never written (so the system gives them no memory), its linear layers and token
embedding are replaced by :class:`~attnlm.quant.layers.QuantLinear` /
:class:`~attnlm.quant.layers.QuantEmbedding` filled from the file (dropping those untouched
matrices), and only the small remaining parameters (norms, biases, positions) are dequantized
by :func:`fill`; the peak is the quantized model plus one tensor. A matrix whose ggml type is
the format's own (:data:`~attnlm.quant.blocks.NATIVE_FORMAT`: ``Q8_0`` for q8; ``Q4_0`` and
``Q4_1`` for q4) is copied as codes and float16 scales (:func:`attnlm.quant.blocks.codes`);
any other type is dequantized (that tensor alone) and quantized by the format's rule
(:func:`requantized` names those types). Quantization works row by row, so the rows of q and
k move back from llama.cpp's rotary order (:func:`~attnlm.models.gguf.parts.unpermute_rows`)
as codes and scales.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from attnlm.base.errors import InputError
from attnlm.base.foreign import check_finite, reading
from attnlm.base.foreign import register as _register_reader
from attnlm.base.ggufio import GGUFFile, type_name
from attnlm.base.validate import weights_format as check_format
from attnlm.models.gguf.parts import Part, check_parts, part_bytes, unpermute_rows
from attnlm.quant.blocks import GROUP, NATIVE_FORMAT, SUPPORTED, codes, dequantize
from attnlm.quant.layers import (
    ROWS_AT_ONCE,
    QuantEmbedding,
    QuantLinear,
    quantize_rows,
    quantize_weights,
)

#: GGUF ``general.architecture`` -> the module that maps it to one of our families
ARCHITECTURES = {
    "llama": "attnlm.models.gguf.llama",
    "qwen2": "attnlm.models.gguf.qwen2",
    "qwen3": "attnlm.models.gguf.qwen3",
    "gemma2": "attnlm.models.gguf.gemma2",
    "gemma3": "attnlm.models.gguf.gemma3",
    "phi3": "attnlm.models.gguf.phi3",
    "gpt2": "attnlm.models.gguf.gpt2",
    "qwen3moe": "attnlm.models.gguf.qwen3moe",
    "smollm3": "attnlm.models.gguf.smollm3",
    "granite": "attnlm.models.gguf.granite",
    "olmo2": "attnlm.models.gguf.olmo2",
    "gpt-oss": "attnlm.models.gguf.gptoss",
}
_MOE = (
    "a mixture of experts of a kind attnlm's models do not have (shared experts, sigmoid "
    "or grouped routing, q/k norms over all heads)"
)
#: Architectures refused with a reason (close to one we read, but with a part we do not have)
REFUSED = {
    **dict.fromkeys(
        (
            "qwen2moe",
            "llama4",
            "phimoe",
            "olmoe",
            "granitemoe",
            "deepseek",
        ),
        _MOE,
    ),  # fmt: skip
    **dict.fromkeys(
        ("deepseek2", "minicpm3", "kimi-linear"),
        "multi-head latent attention (MLA), which attnlm's models do not have",
    ),
    **dict.fromkeys(
        ("clip", "qwen2vl", "qwen3vl", "qwen3vlmoe", "gemma3n", "mllama"),
        "a vision (or audio) tower, which attnlm's models do not have",
    ),
    **dict.fromkeys(
        (
            "granitehybrid",
            "nemotron_h",
            "falcon-h1",
            "jamba",
            "mamba",
            "mamba2",
            "qwen3next",
            "qwen35",
            "lfm2",
        ),
        "recurrent (state-space or linear-attention) layers, which attnlm's models do not have",
    ),  # fmt: skip
    "mistral3": "Mistral 3's attention temperature scaling and YaRN rotary are not supported",
}
#: ggml tensor type -> the weights format that keeps its precision (a file's default format)
PRECISION = {"F32": "f32", "F16": "bf16", "BF16": "bf16", "Q8_0": "q8", "Q6_K": "q8",
             "Q5_K": "q8", "Q4_0": "q4", "Q4_1": "q4", "Q4_K": "q4", "Q3_K": "q4", "Q2_K": "q4",
             "IQ4_NL": "q4", "IQ4_XS": "q4", "MXFP4": "q4"}  # fmt: skip


def arch_module(header: GGUFFile) -> Any:
    """The adapter module of the file's ``general.architecture`` (InputError if unsupported)."""
    arch = header.get("general.architecture")
    if not isinstance(arch, str):
        raise InputError(f"{header.path}: no general.architecture in the GGUF metadata")
    if arch not in ARCHITECTURES:
        why = f": {REFUSED[arch]}" if arch in REFUSED else ""
        raise InputError(
            f"{header.path}: architecture {arch!r} is not supported{why} "
            f"(supported: {', '.join(ARCHITECTURES)})"
        )
    return importlib.import_module(ARCHITECTURES[arch])


def check_types(header: GGUFFile) -> None:
    """Every tensor of a type we can dequantize, else InputError naming the first one."""
    for info in header.tensors.values():
        if info.type not in SUPPORTED:
            known = ", ".join(v[0] for v in SUPPORTED.values())
            raise InputError(
                f"{header.path}: tensor {info.name!r} has type {type_name(info.type)}, which is "
                f"not supported (supported: {known})"
            )


@contextlib.contextmanager
def no_init() -> Iterator[None]:
    """Build modules without initialising their parameters: ``torch.nn.init``'s in-place
    functions (which the layers' ``reset_parameters`` and our families' initialisers call)
    return their tensor untouched, so the memory is allocated but not written."""
    names = [n for n in dir(nn.init) if n.endswith("_") and not n.startswith("_")]
    saved = {n: getattr(nn.init, n) for n in names}
    try:
        for n in names:
            setattr(nn.init, n, lambda tensor, *args, **kwargs: tensor)
        yield
    finally:
        for n, fn in saved.items():
            setattr(nn.init, n, fn)


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run torch on one thread inside: dequantization works in cache-sized pieces
    (:data:`~attnlm.quant.blocks.CHUNK_ELEMENTS`), too small to share between threads,
    and waking a thread pool for each piece costs more than the piece (many times more when
    the cores are busy with other work)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def fill(
    model: nn.Module, header: GGUFFile, parts: list[Part], consumed: set[str] | None = None
) -> None:
    """Dequantize every tensor of ``parts`` into ``model``; missing, misshapen and unused
    tensors (besides ``consumed``, read elsewhere), and parameters left unfilled, are
    InputErrors naming them."""
    params = dict(model.named_parameters())  # a tied weight appears once
    filled: dict[str, int] = {}
    used: set[str] = set(consumed or ())
    where = header.path
    with torch.no_grad(), one_thread():
        for part in parts:
            info = header.tensors.get(part.gguf)
            if info is None:
                raise InputError(f"{where}: tensor {part.gguf!r} is missing")
            used.add(part.gguf)
            if not part.ours:
                continue
            target = params[part.ours].data
            dest = target[part.rows[0] : part.rows[1]] if part.rows else target
            raw, shape = part_bytes(header.raw(info), info, part)
            if shape != tuple(dest.shape):
                raise InputError(
                    f"{where}: tensor {part.gguf!r} has shape {list(info.shape)}, expected "
                    f"{list(dest.shape)} from the metadata"
                )
            if part.heads:
                tmp = dequantize(raw, info.type, shape, name=part.gguf)
                dest.copy_(torch.from_numpy(unpermute_rows(tmp, part.heads)))
            else:  # straight into the parameter's memory
                dequantize(raw, info.type, shape, out=dest.numpy(), name=part.gguf)
            del raw
            filled[part.ours] = filled.get(part.ours, 0) + dest.numel()
    unused = [n for n in header.tensors if n not in used]
    if unused:
        raise InputError(
            f"{where}: tensor {unused[0]!r} is not part of a {header.get('general.architecture')} "
            f"model attnlm can build ({len(unused)} unused tensor(s))"
        )
    for name, p in params.items():
        if filled.get(name, 0) != p.numel():
            raise InputError(f"{where}: nothing in the file fills parameter {name!r}")


def load_model(path: str | Path | GGUFFile, weights: str = "f32") -> nn.Module:
    """Our model (eval mode) from a GGUF file (a path or an opened header), its weights in
    ``weights`` (:mod:`attnlm.quant`): ``f32`` dequantizes every tensor (:func:`fill`);
    ``q8``/``q4`` load the matrices straight into that format (:func:`load_quantized`;
    :func:`requantized` names the ggml types that went through float32); ``bf16`` rounds the
    float32 model."""
    check_format(weights)
    where = getattr(path, "path", path)
    with reading(where, "GGUF"):
        header = path if isinstance(path, GGUFFile) else GGUFFile(path)
        model, config, module = build_empty(header)
        parts = module.parts(config, header)
        check_parts(header, parts)
        if weights in ("q8", "q4"):
            load_quantized(header, model, parts, weights)
        else:
            fill(model, header, parts)
    check_finite(dict(model.named_parameters()), where)  # weights; buffers may hold -inf masks
    if weights in ("q8", "q4"):
        return model.eval()
    return quantize_weights(model, weights).eval()


# -- matrices straight into q8 / q4 ---------------------------------------------------------


def precision_class(header: GGUFFile) -> str:
    """A GGUF file's own weights format: that of the ggml type holding most of its matrix
    elements (2-D tensors; the SmolLM2 file: Q4_1 -> ``q4``)."""
    counts: dict[str, int] = {}
    for info in header.tensors.values():
        if len(info.shape) == 2:
            counts[info.type_name] = counts.get(info.type_name, 0) + info.n_elements
    return PRECISION.get(max(counts, key=counts.get), "f32") if counts else "f32"


def _float_codes(raw: Any, info: Any, shape: tuple[int, ...], fmt: str, where: Any
                 ) -> dict[str, Tensor]:  # fmt: skip
    """A matrix ``shape`` of another type dequantized and quantized by the format's rule, a
    few thousand rows at a time (the float32 copy of an LM head is never whole)."""
    n, k = shape
    rows = raw.reshape(n, -1)  # bytes per row: whole blocks
    pieces = []
    for i in range(0, n, ROWS_AT_ONCE):
        piece = rows[i : i + ROWS_AT_ONCE]
        w = dequantize(piece.reshape(-1), info.type, (piece.shape[0], k), name=info.name)
        check_finite({info.name: w}, where)
        pieces.append(quantize_rows(torch.from_numpy(w), fmt))
    return {key: torch.cat([p[key] for p in pieces]) for key in pieces[0]}


def _matrix(header: GGUFFile, part: Part, fmt: str) -> dict[str, Tensor]:
    """One file matrix as ``fmt`` codes and scales (``q``, ``s`` or ``u``, ``d``, ``m``), in
    our row order."""
    info = header.tensors[part.gguf]
    raw, shape = part_bytes(header.raw(info), info, part)
    if NATIVE_FORMAT.get(info.type_name) == fmt:
        stored = codes(raw, info.type_name, shape)
        for key in ("s", "d", "m"):  # as the C engine: a damaged scale is refused, not held
            if key in stored:
                check_finite({info.name: stored[key]}, header.path, "scales of")
        found = {key: torch.from_numpy(value) for key, value in stored.items()}
    else:
        found = _float_codes(raw, info, shape, fmt, header.path)
    if part.heads:
        found = {key: unpermute_rows(value, part.heads) for key, value in found.items()}
    return found


def _layer(pieces: list[dict[str, Tensor]], fmt: str) -> QuantLinear:
    rows = pieces[0] if len(pieces) == 1 else {key: torch.cat([p[key] for p in pieces])
                                               for key in pieces[0]}  # fmt: skip
    return QuantLinear.from_codes(rows, fmt)


def load_quantized(header: GGUFFile, model: nn.Module, parts: list[Part], fmt: str) -> None:
    """Fill ``model`` (built under :func:`no_init`) from ``header``, its linear layers and
    token embedding in ``fmt`` (``q8`` or ``q4``; the embedding q8, and in q4 the LM head q8
    unless the file stores it in 4 bits, as :func:`attnlm.quant.layers.quantize_weights`)."""
    by_weight: dict[str, list[Part]] = {}
    for part in parts:
        by_weight.setdefault(part.ours, []).append(part)
    done: set[str] = set()
    tied = getattr(model.config, "tie_embeddings", False)
    native_q4 = {kind for kind, held in NATIVE_FORMAT.items() if held == "q4"}
    with torch.no_grad():
        for name, module in list(model.named_modules()):
            is_emb = name == "tok_emb" and isinstance(module, nn.Embedding)
            if not (isinstance(module, nn.Linear) or is_emb) or module.weight.shape[1] % GROUP:
                continue
            source = "tok_emb.weight" if name == "lm_head" and tied else f"{name}.weight"
            layer_parts = sorted(by_weight.get(source, []), key=lambda p: (p.rows or (0,))[0])
            if not layer_parts:
                continue
            stored = {header.tensors[p.gguf].type_name for p in layer_parts}
            head_q8 = name == "lm_head" and not stored <= native_q4
            layer_fmt = "q8" if is_emb or (fmt == "q4" and head_q8) else fmt
            emb = model.tok_emb
            if source == "tok_emb.weight" and not is_emb and isinstance(emb, QuantEmbedding):
                if emb.table.fmt == layer_fmt:  # a tied head: the embedding's codes, shared
                    model.lm_head = emb.table
                    continue
            layer = _layer([_matrix(header, p, layer_fmt) for p in layer_parts], layer_fmt)
            bias_parts = by_weight.get(f"{name}.bias")
            if bias_parts:  # one tensor, or the rows of a fused one (q/k/v biases)
                bias = torch.empty(module.weight.shape[0])
                for part in bias_parts:
                    b = header.tensors[part.gguf]
                    raw, shape = part_bytes(header.raw(b), b, part)  # (an expert's of a stack)
                    values = dequantize(raw, b.type, shape, name=part.gguf)
                    start, stop = part.rows or (0, bias.shape[0])
                    if values.shape != (stop - start,):
                        raise InputError(
                            f"{header.path}: tensor {part.gguf!r} has shape {list(b.shape)}, "
                            f"expected {[stop - start]} from the metadata"
                        )
                    bias[start:stop] = torch.from_numpy(values)
                    done.add(part.gguf)
                layer.set_bias(bias)
            parent, _, attr = name.rpartition(".")
            owner = model.get_submodule(parent) if parent else model
            setattr(owner, attr, QuantEmbedding(layer) if is_emb else layer)
            done.update(p.gguf for p in layer_parts)
        rest = [p for p in parts if p.gguf not in done]
        fill(model, header, rest, consumed=done)


def requantized(header: GGUFFile, model: nn.Module) -> list[str]:
    """The ggml types of ``header``'s matrices that ``model`` (loaded from it in q8 or q4)
    holds re-quantized, as its layers tell: those a :class:`QuantLinear` (or the embedding's
    table) holds in a format whose codes they are not (:data:`NATIVE_FORMAT`)."""
    tied = getattr(model.config, "tie_embeddings", False)
    held: dict[str, set[str]] = {}  # our weight -> the formats holding it
    for name, m in model.named_modules(remove_duplicate=False):  # a shared table twice
        if isinstance(m, QuantLinear) and m.fmt in ("q8", "q4"):
            shared = name == "tok_emb.table" or (name == "lm_head" and tied)
            held.setdefault("tok_emb.weight" if shared else f"{name}.weight", set()).add(m.fmt)
    found = set()
    for part in arch_module(header).parts(model.config, header):
        info = header.tensors.get(part.gguf)
        if info and any(NATIVE_FORMAT.get(info.type_name) != f for f in held.get(part.ours, ())):
            found.add(info.type_name)
    return sorted(found)


def build_empty(header: GGUFFile) -> tuple[nn.Module, Any, Any]:
    """``(model, config, architecture module)`` for the file, built without initialisation
    (:func:`no_init`: allocated, never written), after the type checks."""
    from attnlm.models.registry import build

    module = arch_module(header)
    check_types(header)
    with no_init():
        model, config, _ = build(module.config_table(header))
    return model, config, module


def read_config(path: str | Path | GGUFFile) -> dict[str, Any]:
    """The ``[model]`` table (with ``type``) a GGUF file's metadata describes."""
    header = path if isinstance(path, GGUFFile) else GGUFFile(path)
    return arch_module(header).config_table(header)


def load_tokenizer(path: str | Path | GGUFFile) -> Any:
    """The tokenizer in a GGUF file's metadata (:mod:`attnlm.tokenizers.gguf`)."""
    from attnlm.tokenizers.gguf import GGUFTokenizer

    return GGUFTokenizer.from_gguf(path)


def load(path: str | Path) -> tuple[nn.Module, Any]:
    """``(model, tokenizer)`` from a GGUF file, its header parsed once."""
    with reading(path, "GGUF"):
        header = GGUFFile(path)
    return load_model(header), load_tokenizer(header)


def tensor_stats(path: str | Path | GGUFFile) -> dict[str, Any]:
    """What ``params`` reports for a GGUF file without building the model: ``parameters``
    (elements of every tensor; a tied LM head is stored once) and ``by_type``
    ``{type: {"tensors", "parameters", "bytes"}}``, largest first."""
    header = path if isinstance(path, GGUFFile) else GGUFFile(path)
    by_type: dict[str, dict[str, int]] = {}
    for info in header.tensors.values():
        row = by_type.setdefault(info.type_name, {"tensors": 0, "parameters": 0, "bytes": 0})
        row["tensors"] += 1
        row["parameters"] += info.n_elements
        row["bytes"] += info.nbytes or 0
    ordered = dict(sorted(by_type.items(), key=lambda kv: -kv[1]["bytes"]))
    return {"parameters": sum(r["parameters"] for r in ordered.values()), "by_type": ordered}


_register_reader("GGUF", f"{__name__}.load")
_register_reader("GGUF", f"{__name__}.load_model")
