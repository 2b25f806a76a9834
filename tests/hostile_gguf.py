"""Crafted GGUF files for ``tests/base/test_hostile_files.py``: a small valid Llama file (the
base, in the C engine's own format: Q8_0 matrices and embedding, F32 norms) taken apart into its
fields by an independent little parser, and :func:`gguf_cases` -> ``{case id: bytes}``, one
hostile file per case, each built by changing one field of the base and writing it back.

The classes (the first word of each id): ``header`` (magic, version, counts), ``string`` (key,
value and tensor-name lengths, UTF-8), ``array`` (counts, item types, nesting), ``vtype`` (value
type ids), ``dims`` (n_dims, zero, huge and overflowing dimensions), ``ttype`` (ggml type ids),
``offset`` (past the end, misaligned, overflowing, overlapping), ``dup`` (names twice),
``align`` (``general.alignment``), ``config`` (metadata the architecture reads), ``shape``
(tensors that disagree with the config), ``vocab`` (the tokenizer's keys), ``nan`` (weights and
scales), ``cut`` (truncations) and ``flip`` (bit flips of the base's header and data).

Written without ``gguf`` or attnlm's reader, so the parser under test is not its own oracle.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

STRING, ARRAY = 8, 9
SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
U64 = (1 << 64) - 1


def s(text: str | bytes) -> bytes:
    """A GGUF string: uint64 length + bytes."""
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


@dataclass
class Tensor:
    name: bytes
    dims: list[int]  # ggml order (the first is the fastest-varying)
    type: int
    offset: int  # relative to the data section


@dataclass
class Gguf:
    """The fields of a GGUF file; ``kv``: ``(key bytes, value type, value bytes)``."""

    version: int
    kv: list[tuple[bytes, int, bytes]]
    tensors: list[Tensor]
    data: bytes
    alignment: int = 32
    n_kv: int | None = None  # the counts written (None: the true ones)
    n_tensors: int | None = None
    extra: dict = field(default_factory=dict)

    def to_bytes(self) -> bytes:
        out = bytearray(b"GGUF" + struct.pack("<I", self.version))
        n_t = len(self.tensors) if self.n_tensors is None else self.n_tensors
        n_kv = len(self.kv) if self.n_kv is None else self.n_kv
        out += struct.pack("<QQ", n_t, n_kv)
        for key, vtype, value in self.kv:
            out += s(key) + struct.pack("<I", vtype) + value
        for t in self.tensors:
            out += s(t.name) + struct.pack("<I", len(t.dims))
            out += b"".join(struct.pack("<Q", d) for d in t.dims)
            out += struct.pack("<IQ", t.type, t.offset)
        out += b"\0" * (-len(out) % self.alignment)
        return bytes(out) + self.data

    def value(self, key: str) -> bytes:
        return next(v for k, t, v in self.kv if k == key.encode())

    def set(self, key: str, vtype: int, value: bytes) -> Gguf:
        """A copy with ``key`` set (replaced in place, or appended)."""
        kv = [(k, t, v) for k, t, v in self.kv if k != key.encode()]
        at = next((i for i, (k, _, _) in enumerate(self.kv) if k == key.encode()), len(kv))
        kv.insert(at, (key.encode(), vtype, value))
        return replace(self, kv=kv)

    def tensor(self, name: str) -> Tensor:
        return next(t for t in self.tensors if t.name == name.encode())

    def with_tensor(self, name: str, **changes) -> Gguf:
        tensors = [replace(t, **changes) if t.name == name.encode() else t for t in self.tensors]
        return replace(self, tensors=tensors)

    def data_start(self) -> int:
        return len(self.to_bytes()) - len(self.data)


def parse(raw: bytes) -> Gguf:
    """The fields of a well-formed GGUF file (the base; not a validating reader)."""
    pos = 24
    version, n_t, n_kv = struct.unpack_from("<I", raw, 4)[0], *struct.unpack_from("<QQ", raw, 8)

    def string() -> bytes:
        nonlocal pos
        (n,) = struct.unpack_from("<Q", raw, pos)
        pos += 8 + n
        return raw[pos - n : pos]

    def skip(vtype: int) -> None:
        nonlocal pos
        if vtype == STRING:
            string()
        elif vtype == ARRAY:
            itype, count = struct.unpack_from("<IQ", raw, pos)
            pos += 12
            for _ in range(count):
                skip(itype)
        else:
            pos += SIZES[vtype]

    kv = []
    for _ in range(n_kv):
        key = string()
        (vtype,) = struct.unpack_from("<I", raw, pos)
        pos += 4
        start = pos
        skip(vtype)
        kv.append((key, vtype, raw[start:pos]))
    tensors = []
    for _ in range(n_t):
        name = string()
        (n_dims,) = struct.unpack_from("<I", raw, pos)
        dims = list(struct.unpack_from(f"<{n_dims}Q", raw, pos + 4))
        pos += 4 + 8 * n_dims
        ttype, offset = struct.unpack_from("<IQ", raw, pos)
        pos += 12
        tensors.append(Tensor(name, dims, ttype, offset))
    align = 32
    for key, _, value in kv:
        if key == b"general.alignment":
            align = struct.unpack("<I", value)[0]
    start = pos + (-pos % align)
    return Gguf(version, kv, tensors, raw[start:], align)


# -- the base ------------------------------------------------------------------------------------


def write_base(folder: Path) -> Path:
    """The tiny Llama of ``tests/gguf_export_support.py`` (2 layers, width 64, 4 heads, 2 key/
    value heads, d_ff 96, about 300 tokens) exported as Q8_0 by attnlm's writer: a file the C
    engine takes (``generate`` runs it without PyTorch)."""
    from attnlm.models.gguf.writer import export_gguf
    from gguf_export_support import tiny_model

    model, tok = tiny_model("llama")
    path = Path(folder) / "base.gguf"
    export_gguf(model, tok, path, kind="q8_0", name="hostile-base")
    return path


# -- the cases -----------------------------------------------------------------------------------


def _u32(v: int) -> bytes:
    return struct.pack("<I", v)


def _u64(v: int) -> bytes:
    return struct.pack("<Q", v)


def _f32(v: float) -> bytes:
    return struct.pack("<f", v)


def _array(itype: int, count: int, items: bytes = b"") -> bytes:
    return struct.pack("<IQ", itype, count) + items


def _nested(depth: int) -> bytes:
    """An array of one array of one array ... ``depth`` deep, ending in an empty uint8 array."""
    return b"".join(struct.pack("<IQ", ARRAY, 1) for _ in range(depth - 1)) + _array(0, 0)


def _q8_blocks(n_blocks: int) -> bytes:
    """``n_blocks`` Q8_0 blocks with small finite scales (seeded)."""
    rng = np.random.default_rng(7)
    blocks = np.zeros((n_blocks, 34), np.uint8)
    blocks[:, :2] = np.full((n_blocks, 1), 0.01, np.float16).view(np.uint8)
    blocks[:, 2:] = rng.integers(0, 256, size=(n_blocks, 32), dtype=np.uint8)
    return blocks.tobytes()


def _reshaped(g: Gguf, name: str, dims: list[int]) -> Gguf:
    """``name`` given ``dims`` and bytes of its own at the end of the data (F32 for a vector,
    Q8_0 for a matrix), so the file is consistent in itself and only disagrees with the
    config."""
    t = g.tensor(name)
    n = int(np.prod(dims, dtype=object))
    blob = _f32(0.5) * n if t.type == 0 else _q8_blocks(n // 32)
    data = g.data + b"\0" * (-len(g.data) % g.alignment)
    return replace(g.with_tensor(name, dims=dims, offset=len(data)), data=data + blob)


def _q8_nan_scale(g: Gguf, name: str) -> Gguf:
    t = g.tensor(name)
    data = bytearray(g.data)
    data[t.offset : t.offset + 2] = np.array([np.nan], np.float16).tobytes()
    return replace(g, data=bytes(data))


def _f32_nan(g: Gguf, name: str) -> Gguf:
    t = g.tensor(name)
    data = bytearray(g.data)
    data[t.offset : t.offset + 4] = _f32(float("nan"))
    return replace(g, data=bytes(data))


def _structural(g: Gguf) -> dict[str, Gguf | bytes]:
    """Cases that change one field of the base ``g``."""
    raw = g.to_bytes()
    n_kv, n_t = len(g.kv), len(g.tensors)
    q = "blk.0.attn_q.weight"
    first, second = g.tensors[0], g.tensors[1]
    toks = g.value("tokenizer.ggml.tokens")
    n_tokens = struct.unpack_from("<Q", toks, 4)[0]
    cases: dict[str, Gguf | bytes] = {
        # header
        "header-magic": b"GGUF"[::-1] + raw[4:],
        "header-version-1": raw[:4] + _u32(1) + raw[8:],
        "header-version-huge": raw[:4] + _u32(0xFFFFFFFF) + raw[8:],
        "header-tensor-count-2^63": replace(g, n_tensors=1 << 63),
        "header-tensor-count-u64max": replace(g, n_tensors=U64),
        "header-kv-count-u64max": replace(g, n_kv=U64),
        "header-tensor-count-plus-one": replace(g, n_tensors=n_t + 1),
        "header-kv-count-plus-one": replace(g, n_kv=n_kv + 1),
        "header-kv-count-minus-one": replace(g, n_kv=n_kv - 1),
        "header-tensor-count-zero": replace(g, n_tensors=0, tensors=[]),
        "header-only-magic": raw[:4],
        "header-empty": b"",
        # strings
        "string-key-length-u64max": raw[:24] + _u64(U64) + raw[32:],
        "string-key-length-past-end": raw[:24] + _u64(len(raw)) + raw[32:],
        "string-value-length-huge": g.set("general.name", STRING, _u64(1 << 62) + b"x"),
        "string-value-length-past-end": g.set("general.name", STRING, _u64(len(raw)) + b"x"),
        "string-key-not-utf8": replace(g, kv=[(b"\xff\xfe", 4, _u32(1)), *g.kv]),
        "string-tensor-name-empty": replace(g, tensors=[replace(first, name=b"")] + g.tensors[1:]),
        "string-tensor-name-not-utf8": replace(
            g, tensors=[replace(first, name=b"\xc3\x28")] + g.tensors[1:]
        ),
        # arrays
        "array-count-2^62": g.set(
            "tokenizer.ggml.tokens", ARRAY, _array(STRING, 1 << 62) + toks[12:]
        ),
        "array-count-u64max-u64": g.set("tokenizer.ggml.token_type", ARRAY, _array(10, U64)),
        "array-strings-run-out": g.set(
            "tokenizer.ggml.tokens", ARRAY, _array(STRING, n_tokens * 4) + toks[12:]
        ),
        "array-item-type-unknown": g.set(
            "tokenizer.ggml.token_type", ARRAY, _array(99, 4, b"\0" * 16)
        ),
        "array-item-type-u32max": g.set("general.tags", ARRAY, _array(0xFFFFFFFF, 1, b"\0" * 8)),
        "array-nested-deep": g.set("general.tags", ARRAY, _nested(5000)),
        "array-nested-many-empty": g.set(
            "general.tags", ARRAY, _array(ARRAY, 20000, _array(0, 0) * 20000)
        ),
        "array-tokens-of-ints": g.set(
            "tokenizer.ggml.tokens", ARRAY, _array(4, n_tokens, b"\0" * 4 * n_tokens)
        ),
        # value types
        "vtype-unknown": g.set("general.name", 13, b"x"),
        "vtype-u32max": g.set("general.name", 0xFFFFFFFF, b"x"),
        # dimensions
        "dims-n-dims-0": g.with_tensor(q, dims=[]),
        "dims-n-dims-5": g.with_tensor(q, dims=[64, 64, 1, 1, 1]),
        "dims-zero": g.with_tensor(q, dims=[64, 0]),
        "dims-2^63": g.with_tensor(q, dims=[64, 1 << 63]),
        "dims-product-overflows-u64": g.with_tensor(q, dims=[1 << 32, 1 << 32, 1 << 32, 64]),
        "dims-over-2^40": g.with_tensor(q, dims=[64, (1 << 40) + 1]),
        "dims-product-wraps-to-64": g.with_tensor(q, dims=[64, 1 << 40, 1 << 24, 1]),
        # tensor types
        "ttype-unknown-99": g.with_tensor(q, type=99),
        "ttype-u32max": g.with_tensor(q, type=0xFFFFFFFF),
        "ttype-removed-q4_2": g.with_tensor(q, type=4),
        "ttype-unsupported-iq4_nl": g.with_tensor(q, type=20),
        "ttype-iq2-rows-not-blocks": g.with_tensor(q, type=16),
        "ttype-q8-rows-not-blocks": g.with_tensor(q, dims=[48, 64]),
        "ttype-f32-claims-more-bytes": g.with_tensor(q, type=0),
        # offsets
        "offset-past-end": g.with_tensor(q, offset=len(g.data) + 32),
        "offset-u64-wraps": g.with_tensor(q, offset=U64 - 31),
        "offset-misaligned": g.with_tensor(q, offset=g.tensor(q).offset + 1),
        "offset-overlaps-another": replace(
            g, tensors=[first, replace(second, offset=first.offset)] + g.tensors[2:]
        ),
        "offset-all-at-zero": replace(g, tensors=[replace(t, offset=0) for t in g.tensors]),
        # names twice
        "dup-tensor-name": replace(
            g, tensors=[first, replace(second, name=first.name)] + g.tensors[2:]
        ),
        "dup-metadata-key": replace(g, kv=[*g.kv, g.kv[-1]]),
        # alignment
        "align-zero": g.set("general.alignment", 4, _u32(0)),
        "align-not-power-of-2": g.set("general.alignment", 4, _u32(48)),
        "align-2^63": g.set("general.alignment", 10, _u64(1 << 63)),
        "align-string": g.set("general.alignment", STRING, s("32")),
        # what the architecture reads
        "config-no-architecture": replace(
            g, kv=[kv for kv in g.kv if kv[0] != b"general.architecture"]
        ),
        "config-architecture-unknown": g.set("general.architecture", STRING, s("grok")),
        "config-heads-zero": g.set("llama.attention.head_count", 4, _u32(0)),
        "config-heads-not-dividing": g.set("llama.attention.head_count", 4, _u32(3)),
        "config-kv-heads-not-dividing": g.set("llama.attention.head_count_kv", 4, _u32(3)),
        "config-kv-heads-more-than-heads": g.set("llama.attention.head_count_kv", 4, _u32(8)),
        "config-blocks-2^31": g.set("llama.block_count", 4, _u32(1 << 31)),
        "config-blocks-more-than-tensors": g.set("llama.block_count", 4, _u32(3)),
        "config-blocks-fewer-than-tensors": g.set("llama.block_count", 4, _u32(1)),
        "config-context-2^62": g.set("llama.context_length", 10, _u64(1 << 62)),
        "config-ffn-huge": g.set("llama.feed_forward_length", 4, _u32(0xFFFFFFF0)),
        "config-width-disagrees": g.set("llama.embedding_length", 4, _u32(128)),
        "config-eps-nan": g.set("llama.attention.layer_norm_rms_epsilon", 6, _f32(float("nan"))),
        "config-rope-base-inf": g.set("llama.rope.freq_base", 6, _f32(float("inf"))),
        "config-rope-base-nan": g.set("llama.rope.freq_base", 6, _f32(float("nan"))),
        "config-block-count-string": g.set("llama.block_count", STRING, s("2")),
        # tensors that disagree with the config
        "shape-attn-q-rows": _reshaped(g, q, [64, 96]),
        "shape-attn-q-transposed-wide": _reshaped(g, q, [96, 64]),
        "shape-attn-k-rows": _reshaped(g, "blk.1.attn_k.weight", [64, 64]),
        "shape-ffn-down-transposed": _reshaped(g, "blk.0.ffn_down.weight", [64, 96]),
        "shape-norm-length": _reshaped(g, "output_norm.weight", [32]),
        "shape-embedding-rows": _reshaped(g, "token_embd.weight", [64, 200]),
        "shape-matrix-as-3d": _reshaped(g, q, [64, 32, 2]),
        "shape-missing-tensor": replace(g, tensors=[t for t in g.tensors if t.name != q.encode()]),
        "shape-extra-tensor": _reshaped(
            replace(g, tensors=[*g.tensors, replace(first, name=b"blk.1.extra")]),
            "blk.1.extra",
            [64, 8],
        ),
        # the tokenizer's keys
        "vocab-bos-id-huge": g.set("tokenizer.ggml.bos_token_id", 4, _u32(0xFFFFFFFF)),
        "vocab-eos-id-negative": g.set("tokenizer.ggml.eos_token_id", 5, struct.pack("<i", -5)),
        "vocab-token-types-short": g.set(
            "tokenizer.ggml.token_type", ARRAY, _array(5, 3, b"\1\0\0\0" * 3)
        ),
        "vocab-merges-garbage": g.set(
            "tokenizer.ggml.merges", ARRAY, _array(STRING, 2, s("abc") + s(""))
        ),
        "vocab-model-unknown": g.set("tokenizer.ggml.model", STRING, s("t5")),
        "vocab-pre-unknown": g.set("tokenizer.ggml.pre", STRING, s("nonesuch")),
        # weights that are not numbers
        "nan-norm-weight": _f32_nan(g, "blk.0.attn_norm.weight"),
        "nan-q8-scale": _q8_nan_scale(g, q),
        "nan-embedding-scale": _q8_nan_scale(g, "token_embd.weight"),
    }
    return cases


def _n_dims_u32max(g: Gguf) -> bytes:
    """The first tensor's n_dims set to 2^32-1, the rest of the file as it was."""
    raw = g.to_bytes()
    header_end = 24 + sum(8 + len(k) + 4 + len(v) for k, _, v in g.kv)
    at = header_end + 8 + len(g.tensors[0].name)
    return raw[:at] + _u32(0xFFFFFFFF) + raw[at + 4 :]


def _tensor_name_length_huge(g: Gguf) -> bytes:
    raw = g.to_bytes()
    at = 24 + sum(8 + len(k) + 4 + len(v) for k, _, v in g.kv)
    return raw[:at] + _u64(1 << 60) + raw[at + 8 :]


CUTS = 14  # truncation points, spread over the header, the tensor table and the data
FLIPS = 12  # bit-flipped copies


def gguf_cases(base: bytes) -> dict[str, bytes]:
    """``{case id: file bytes}``: every crafted case of :data:`_structural`, truncations of
    ``base`` at :data:`CUTS` points and :data:`FLIPS` copies with a few bits flipped (seeded:
    the same files on every run)."""
    g = parse(base)
    out = {}
    for name, case in _structural(g).items():
        out[name] = case if isinstance(case, bytes) else case.to_bytes()
    out["dims-n-dims-u32max"] = _n_dims_u32max(g)
    out["string-tensor-name-length-huge"] = _tensor_name_length_huge(g)
    start = g.data_start()
    points = sorted({1, 7, 23, 24, 31, *np.linspace(32, start, 6, dtype=int).tolist(),
                     start + 1, start + len(g.data) // 2, len(base) - 1})  # fmt: skip
    for p in points[:CUTS]:
        out[f"cut-at-{p}"] = base[:p]
    rng = np.random.default_rng(48)
    for i in range(FLIPS):
        data = bytearray(base)
        limit = start if i < FLIPS * 3 // 4 else len(base)  # mostly the header
        for at in rng.integers(4, limit, size=3):
            data[at] ^= 1 << int(rng.integers(0, 8))
        out[f"flip-{i}"] = bytes(data)
    return out
