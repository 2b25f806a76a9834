"""Build one of our models from a GGUF file: the architecture's config from the metadata, an
uninitialised model from the registry, then each tensor dequantized straight into its
parameter.

An architecture module (:mod:`.llama`, :mod:`.gpt2`) says two things: the ``[model]`` table
(``config_table(header)``) and where every file tensor goes (``parts(config, header)``, a list
of :class:`Part`). Everything else is here and shared: type checks before anything is built,
shape checks per tensor, the rotary row order, and the checks that every parameter was filled
and every tensor of the file used.

Memory: the model is built without its random initialisation (the parameters are filled from
the file anyway, and initialising 135M parameters costs about a second), and each tensor's
bytes are read, dequantized into the parameter (or its rows of a fused parameter) and dropped,
so the peak is the float32 model plus one tensor's bytes.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from attnlm.errors import InputError
from attnlm.foreign import check_finite, reading
from attnlm.foreign import register as _register_reader
from attnlm.ggufio import GGUFFile, type_name
from attnlm.models.gguf.parts import Part
from attnlm.models.gguf.quants import SUPPORTED, dequantize

#: GGUF ``general.architecture`` -> the module that maps it to one of our families
ARCHITECTURES = {"llama": "attnlm.models.gguf.llama", "gpt2": "attnlm.models.gguf.gpt2"}
#: Architectures refused with a reason (they are close to one we read but need more)
REFUSED = {
    "qwen2": "Qwen2 has biases on the query, key and value projections (blk.N.attn_q.bias), "
    "which attnlm's Llama does not have",
    "mistral": "Mistral files with their own architecture name use sliding-window attention",
}


def arch_module(header: GGUFFile) -> Any:
    """The adapter module of the file's ``general.architecture`` (InputError if unsupported)."""
    arch = header.get("general.architecture")
    if not isinstance(arch, str):
        raise InputError(f"{header.path}: no general.architecture in the GGUF metadata")
    if arch in REFUSED:
        raise InputError(f"{header.path}: architecture {arch!r} is not supported: {REFUSED[arch]}")
    if arch not in ARCHITECTURES:
        raise InputError(
            f"{header.path}: architecture {arch!r} is not supported "
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
    (:data:`~attnlm.models.gguf.quants.CHUNK_ELEMENTS`), too small to share between threads,
    and waking a thread pool for each piece costs more than the piece (many times more when
    the cores are busy with other work)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def unpermute_rows(src: Tensor, dest: Tensor, heads: int) -> None:
    """Copy q or k rows from llama.cpp's order into the rotate-half order of
    :class:`~attnlm.nn.positional.RotaryEmbedding`.

    Hugging Face's Llama rotates feature ``i`` with ``i + D/2`` of each head; llama.cpp rotates
    adjacent pairs ``(2i, 2i + 1)`` (Meta's original layout), so its converter stores head
    ``h``'s row ``half · D/2 + i`` at ``2i + half``. Here ``src`` ``(heads · D, C)`` in the
    file's order is written to ``dest`` in ours: ``dest[h, half, i] = src[h, i, half]``."""
    rows, width = src.shape
    d = rows // heads
    dest.view(heads, 2, d // 2, width).copy_(src.view(heads, d // 2, 2, width).transpose(1, 2))


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
            if tuple(info.shape) != tuple(dest.shape):
                raise InputError(
                    f"{where}: tensor {part.gguf!r} has shape {list(info.shape)}, expected "
                    f"{list(dest.shape)} from the metadata"
                )
            raw = header.raw(info)
            if part.heads:
                tmp = dequantize(raw, info.type, info.shape, name=part.gguf)
                unpermute_rows(tmp, dest, part.heads)
            else:
                dequantize(raw, info.type, info.shape, out=dest, name=part.gguf)
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


def load_model(path: str | Path | GGUFFile) -> nn.Module:
    """Our model (eval mode, float32) from a GGUF file (a path or an opened header); other
    weight formats: :func:`attnlm.models.gguf.quantized.load_model`."""
    where = getattr(path, "path", path)
    with reading(where, "GGUF"):
        header = path if isinstance(path, GGUFFile) else GGUFFile(path)
        model, config, module = build_empty(header)
        fill(model, header, module.parts(config, header))
    check_finite(dict(model.named_parameters()), where)  # weights; buffers may hold -inf masks
    return model.eval()


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
