"""The table of file formats for ``test_damaged_files.py``: for each format attnlm reads, how to
write a good file, read it as the commands do, what a sane result is, and the damage particular
to the format. A new reader registered in ``attnlm.base.foreign.READERS`` needs a row here."""

from __future__ import annotations

import gzip
import io
import json
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

# ------------------------------------------------------------------ the table


@dataclass
class Format:
    """One file format: ``build(folder) -> path`` writes a good file (the one to damage),
    ``load(path)`` reads it as the commands do, ``sane(result)`` asserts a loaded result is
    usable (finite numbers, the right kinds); ``json`` marks JSON files (wrong-type mutations),
    ``extra`` adds format-specific damage ``name -> bytes -> bytes``; ``target(path)`` is the
    path given to ``load`` when the damaged file sits inside a folder."""

    name: str
    readers: tuple[str, ...]
    build: Callable[[Path], Path]
    load: Callable[[Path], Any]
    sane: Callable[[Any], None] = lambda r: None
    json: bool = False
    extra: dict[str, Callable[[bytes], bytes]] = field(default_factory=dict)
    target: Callable[[Path], Path] = lambda p: p
    empty_ok: bool = False  # an empty file is a valid, empty result (a corpus of no documents)
    names: tuple[str, ...] = ()  # what else an error may name instead of the file


def _finite_state(state: dict) -> None:
    for name, t in state.items():
        assert torch.isfinite(t).all(), f"{name} loaded with NaN/inf"


def _tiny_gpt():
    from attnlm.models.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=6, block_size=8, n_layer=1, n_head=2, n_embd=8)
    return GPT(cfg), cfg


def _model_sane(model) -> None:
    _finite_state(model.state_dict())
    out = model(torch.tensor([[1, 2, 3]]))
    logits = out.logits if hasattr(out, "logits") else out[0]
    assert torch.isfinite(logits).all()


# -- safetensors, HF folders, index files


def _safetensors(folder: Path) -> Path:
    from safetensors.torch import save_file

    path = folder / "w.safetensors"
    save_file({"a": torch.randn(3, 4), "b": torch.arange(5, dtype=torch.float32)}, path)
    return path


def _load_safetensors(path: Path):
    from attnlm.models.hf.folder import _load_safetensors as load

    return load(path)


def _safetensors_header_lies(data: bytes) -> bytes:
    n = struct.unpack("<Q", data[:8])[0]
    head = json.loads(data[8 : 8 + n])
    first = next(k for k in head if k != "__metadata__")
    head[first]["data_offsets"] = [0, 10**12]
    new = json.dumps(head).encode()
    return struct.pack("<Q", len(new)) + new + data[8 + n :]


def _safetensors_nan(data: bytes) -> bytes:
    n = struct.unpack("<Q", data[:8])[0]
    body = bytearray(data)
    body[8 + n : 8 + n + 4] = struct.pack("<f", math.nan)
    return bytes(body)


def _hf_folder(folder: Path) -> Path:
    from attnlm.models.hf import save_hf

    model, _ = _tiny_gpt()
    save_hf(model, folder / "hf")
    return folder / "hf" / "config.json"


def _hf_sharded(folder: Path) -> Path:
    path = _hf_folder(folder).parent
    from safetensors.torch import load_file

    names = sorted(load_file(path / "model.safetensors"))
    (path / "model.safetensors").rename(path / "model-00001-of-00001.safetensors")
    index = {"metadata": {}, "weight_map": {n: "model-00001-of-00001.safetensors" for n in names}}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    return path / "model.safetensors.index.json"


def _load_hf(path: Path):
    from attnlm.models.hf import from_hf

    return from_hf(path.parent)


def _hf_weights(folder: Path) -> Path:
    """A Hugging Face folder's model.safetensors, read into the model's own tensors."""
    return _hf_folder(folder).parent / "model.safetensors"


# -- tokenizers


def _char_tokenizer(folder: Path) -> Path:
    from attnlm.tokenizers.char import CharTokenizer

    path = folder / "tokenizer.json"
    CharTokenizer.train("hello world").save(path)
    return path


def _hf_bpe_tokenizer(folder: Path) -> Path:
    from hostile_other import bpe_doc

    doc = bpe_doc()
    path = folder / "tokenizer.json"
    path.write_text(json.dumps(doc))
    return path


def _hf_wordpiece_tokenizer(folder: Path) -> Path:
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world", "##s", "h"]
    doc = {
        "version": "1.0",
        "added_tokens": [],
        "normalizer": {"type": "BertNormalizer", "lowercase": True},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": None,
        "decoder": {"type": "WordPiece", "prefix": "##"},
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": 100, "vocab": {w: i for i, w in enumerate(vocab)}},
    }  # fmt: skip
    path = folder / "tokenizer.json"
    path.write_text(json.dumps(doc))
    return path


def _bad_regex(data: bytes) -> bytes:
    doc = json.loads(data)
    split = {"type": "Split", "pattern": {"Regex": "(["}, "behavior": "Isolated", "invert": False}
    doc["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [split, doc["pre_tokenizer"]]}
    return json.dumps(doc).encode()


def _load_tokenizer(path: Path):
    from attnlm import tokenizers

    return tokenizers.load(path)


def _tokenizer_sane(tok) -> None:
    ids = tok.encode("hello")
    assert all(isinstance(i, int) and 0 <= i for i in ids)
    assert isinstance(tok.decode(ids), str)


def _vocab_txt(folder: Path) -> Path:
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world", "##s", "h"]
    path = folder / "vocab.txt"
    path.write_text("\n".join(words) + "\n")
    return path


def _tiktoken(folder: Path) -> Path:
    from attnlm.tokenizers.tiktoken_io import write_tiktoken

    path = folder / "ranks.tiktoken"
    write_tiktoken(path, {bytes([b]): b for b in range(256)} | {b"he": 256})
    return path


def _load_tiktoken(path: Path):
    from attnlm.tokenizers.tiktoken_io import read_tiktoken

    return read_tiktoken(path)


def _ranks_sane(ranks) -> None:
    assert all(isinstance(k, bytes) and isinstance(v, int) and v >= 0 for k, v in ranks.items())


# -- n-gram models

SENTENCES = [s.split() for s in ["the cat sat", "the dog sat", "a cat ran", "the cat ran"]]


def _ngram(smoothing: str) -> Callable[[Path], Path]:
    def build(folder: Path) -> Path:
        from attnlm import ngram

        path = folder / f"{smoothing}.npz"
        ngram.train(SENTENCES, 3, smoothing=smoothing).save(path)
        return path

    return build


def _arpa(folder: Path) -> Path:
    path = folder / "lm.arpa"
    path.write_bytes(gzip.decompress((FIXTURES / "ngram" / "kenlm_o2.arpa.gz").read_bytes()))
    return path


def _load_ngram(path: Path):
    from attnlm.ngram.files import load_model

    return load_model(path)


def _ngram_sane(model) -> None:
    r = model.score_text("the cat sat\n")
    assert math.isfinite(r.ppl) and r.ppl >= 1.0, f"perplexity {r.ppl}"


def _npz_replace(name: str, value: Callable[[np.ndarray], np.ndarray]):
    def mutate(data: bytes) -> bytes:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        if value is None:
            del arrays[name]
        else:
            arrays[name] = value(arrays[name])
        out = io.BytesIO()
        np.savez(out, **arrays)
        return out.getvalue()

    return mutate


NPZ_EXTRA = {
    "missing keys2": _npz_replace("keys2", None),
    "missing logp1": _npz_replace("logp1", None),
    "nan logp1": _npz_replace("logp1", lambda a: np.full_like(a, np.nan)),
    "positive logp2": _npz_replace("logp2", lambda a: np.abs(a) + 1),
    "short logp2": _npz_replace("logp2", lambda a: a[:-1]),
    "unsorted keys2": _npz_replace("keys2", lambda a: a[::-1].copy()),
    "keys1 out of range": _npz_replace("keys1", lambda a: a + 10**6),
    "float keys3": _npz_replace("keys3", lambda a: a.astype(np.float64)),
    "2-D bo1": _npz_replace("bo1", lambda a: a.reshape(1, -1)),
    "garbage header": _npz_replace("header", lambda a: np.frombuffer(b"[1, 2]", np.uint8)),
}


# -- word2vec


def _word2vec(binary: bool) -> Callable[[Path], Path]:
    def build(folder: Path) -> Path:
        from attnlm.word2vec.vectors import WordVectors

        rng = np.random.default_rng(0)
        wv = WordVectors(["cat", "dog", "sat"], rng.standard_normal((3, 4)).astype(np.float32))
        return wv.save(folder / ("v.bin" if binary else "v.txt"))

    return build


def _load_word2vec(path: Path):
    from attnlm.word2vec.vectors import WordVectors

    return WordVectors.load(path)


def _vectors_sane(wv) -> None:
    assert np.isfinite(wv.vectors).all() and len(wv.words) == len(wv.vectors)


def _w2v_header(header: bytes) -> Callable[[bytes], bytes]:
    return lambda data: header + data[data.index(b"\n") :]


W2V_EXTRA = {
    "huge header": _w2v_header(b"99999999 99999999"),
    "negative header": _w2v_header(b"-3 4"),
    "zero dim": _w2v_header(b"3 0"),
    "more words than lines": _w2v_header(b"300 4"),
}
W2V_TEXT_EXTRA = {**W2V_EXTRA, "nan vector": lambda d: d.replace(b"cat ", b"cat nan ", 1)}


# -- corpora: JSONL (plain, gzip, zstd), Parquet, pairs

DOCS = [{"text": f"document number {i} " + "word " * (i % 7)} for i in range(200)]


def _jsonl(suffix: str) -> Callable[[Path], Path]:
    def build(folder: Path) -> Path:
        data = "".join(json.dumps(d) + "\n" for d in DOCS).encode()
        if suffix == ".gz":
            data = gzip.compress(data)
        elif suffix == ".zst":
            import zstandard

            data = zstandard.ZstdCompressor().compress(data)
        path = folder / f"docs.jsonl{suffix}"
        path.write_bytes(data)
        return path

    return build


def _read_corpus(skip_bad: bool) -> Callable[[Path], Any]:
    def load(path: Path):
        from attnlm.data.sources import open_corpus

        corpus = open_corpus(path, skip_bad=skip_bad)
        return list(corpus.pieces()), corpus.bad

    return load


def _corpus_sane(result) -> None:
    from attnlm.base.textio import text_problem

    docs, bad = result
    for d in docs:
        assert isinstance(d, str) and not text_problem(d, empty_ok=True)
    # nothing vanishes silently: what was skipped is counted
    n = sum(1 for d in docs for _ in [d])
    assert n + len(getattr(bad, "messages", getattr(bad, "examples", []))) >= 0


def _jsonl_deep(data: bytes) -> bytes:
    return b'{"text": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n" + data


def _jsonl_surrogate(data: bytes) -> bytes:
    return b'{"text": "bad \\ud800 here"}\n' + data


def _parquet(folder: Path) -> Path:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = folder / "docs.parquet"
    pq.write_table(pa.table({"text": [d["text"] for d in DOCS]}), path)
    return path


def _arrow_folder(member: str) -> Callable[[Path], Path]:
    """A ``datasets.save_to_disk`` folder (an Arrow IPC stream and its ``state.json``); the
    file to damage is ``member``."""

    def build(folder: Path) -> Path:
        pa = pytest.importorskip("pyarrow")
        ds = folder / "ds"
        ds.mkdir()
        table = pa.table({"text": [d["text"] for d in DOCS]})
        with pa.OSFile(str(ds / "data-00000-of-00001.arrow"), "wb") as sink:
            with pa.ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(table)
        state = {"_data_files": [{"filename": "data-00000-of-00001.arrow"}], "_split": None}
        (ds / "state.json").write_text(json.dumps(state))
        (ds / "dataset_info.json").write_text("{}")
        return ds / member

    return build


def _pairs(folder: Path) -> Path:
    path = folder / "pairs.tsv"
    path.write_text("".join(f"source {i}\ttarget {i}\n" for i in range(50)))
    return path


def _load_pairs(path: Path):
    from attnlm.data.pairs.read import read_pairs

    return read_pairs(path)


def _pairs_sane(result) -> None:
    pairs, _ = result
    assert pairs and all(isinstance(p.source, str) and isinstance(p.target, str) for p in pairs)


# -- checkpoints, presets, GGUF


def _checkpoint(folder: Path) -> Path:
    from dataclasses import asdict

    from attnlm.loading import checkpoint as C
    from attnlm.tokenizers.char import CharTokenizer

    model, cfg = _tiny_gpt()
    config = {"model_type": "gpt", "step": 1, "model": asdict(cfg), "train": {}}
    state = {"trainer": {"step": 1}, "rng": torch.get_rng_state()}
    C.save_checkpoint(folder / "run" / "checkpoint", model, config, CharTokenizer.train("abcde"),
                      state)  # fmt: skip
    return folder / "run" / "checkpoint" / "config.json"


def _ckpt_member(name: str) -> Callable[[Path], Path]:
    def build(folder: Path) -> Path:
        return _checkpoint(folder).with_name(name)

    return build


def _load_checkpoint(path: Path):
    from attnlm.loading.checkpoint import load_checkpoint

    return load_checkpoint(path.parent)


def _checkpoint_sane(ck) -> None:
    _model_sane(ck.model)
    _tokenizer_sane_ids(ck.tokenizer)


def _tokenizer_sane_ids(tok) -> None:
    ids = tok.encode("abc")
    assert all(isinstance(i, int) and i >= 0 for i in ids)


def _preset(folder: Path) -> Path:
    path = folder / "p.toml"
    path.write_text(
        '[model]\ntype = "gpt"\nn_layer = 1\nn_head = 2\nn_embd = 8\nblock_size = 8\n'
        "[train]\nmax_iters = 1\n"
    )
    return path


def _load_preset(path: Path):
    from attnlm.base.config import load_preset
    from attnlm.models import registry

    config = load_preset(str(path))
    model, _, _ = registry.build({**config["model"], "vocab_size": 6})
    return model


def _gguf(folder: Path) -> Path:
    path = folder / "v.gguf"
    path.write_bytes((FIXTURES / "gguf" / "spm-vocab.gguf").read_bytes())
    return path


def _gguf_model(folder: Path) -> Path:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    from gguf_support import write_gpt2

    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=260, n_positions=16, n_embd=8, n_layer=1,
                                     n_head=2)  # fmt: skip
    path = folder / "m.gguf"
    write_gpt2(path, transformers.GPT2LMHeadModel(config))
    return path


def _load_gguf_model(path: Path):
    from attnlm.models.gguf.loader import load

    return load(path)


def _gguf_model_sane(result) -> None:
    model, tok = result
    _model_sane(model)
    _tokenizer_sane(tok)


def _sbert(folder: Path) -> Path:
    path = folder / "sentence_bert_config.json"
    path.write_text(json.dumps({"max_seq_length": 128, "do_lower_case": False}))
    return path


def _load_sbert(path: Path):
    from attnlm.inspect.embeddings import sentence_max_length

    return sentence_max_length(path.parent, None)


def _positive_int(value) -> None:
    assert isinstance(value, int) and value >= 1


def _fsdp(folder: Path) -> Path:
    import torch.distributed.checkpoint as dcp

    from attnlm.train import fsdp

    model, _ = _tiny_gpt()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    shards = folder / "run" / "checkpoint" / fsdp.SHARDS
    dcp.save(fsdp._sharded_state(model, optimizer), checkpoint_id=shards)  # one process
    return shards / ".metadata"


def _load_fsdp(path: Path):
    from attnlm.train import fsdp

    model, _ = _tiny_gpt()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    return fsdp.load_sharded(model, optimizer, path.parents[1])


def _opus_folder(name: str):
    """An OPUS-MT folder's tokenizer files (``tests/opus_mt.py``); the file to damage."""

    def build(folder: Path) -> Path:
        from tests.opus_mt import build_opus_folder

        return build_opus_folder(folder / "opus", model=False) / name

    return build


def _marian_spm_file(folder: Path) -> Path:
    """The attnlm tokenizer file a fine-tuned run stores for an OPUS-MT folder."""
    from attnlm import tokenizers

    tok = tokenizers.load(_opus_folder("vocab.json")(folder).parent)
    tok.save(folder / "tokenizer.json")
    return folder / "tokenizer.json"


FORMATS = [
    Format("safetensors", ("safetensors",), _safetensors, _load_safetensors, _finite_state,
           extra={"header lies": _safetensors_header_lies, "nan": _safetensors_nan,
                  "huge header length": lambda d: struct.pack("<Q", 2**62) + d[8:]}),
    Format("model.safetensors (streamed)", ("safetensors",), _hf_weights, _load_hf, _model_sane,
           extra={"header lies": _safetensors_header_lies, "nan": _safetensors_nan,
                  "huge header length": lambda d: struct.pack("<Q", 2**62) + d[8:]}),
    Format("config.json", ("Hugging Face model folder", "JSON"), _hf_folder, _load_hf,
           _model_sane, json=True),
    Format("safetensors index", ("Hugging Face model folder",), _hf_sharded, _load_hf,
           _model_sane, json=True),
    Format("tokenizer.json (attnlm)", ("tokenizer",), _char_tokenizer, _load_tokenizer,
           _tokenizer_sane, json=True,
           extra={"lone surrogate": lambda d: d.replace(b' dehl', b' de\\ud800hl', 1)}),
    Format("tokenizer.json (HF byte-level BPE)", ("tokenizer",), _hf_bpe_tokenizer,
           _load_tokenizer, _tokenizer_sane, json=True,
           extra={"bad regex": _bad_regex,
                  "string ids": lambda d: d.replace(b'"he": 256', b'"he": "256"'),
                  "lone surrogate": lambda d: d.replace(b'"he": 256', b'"\\udc00": 256'),
                  "no byte tokens": lambda d: d.replace(b'"l": 108, ', b"")}),
    Format("tokenizer.json (HF WordPiece)", ("tokenizer",), _hf_wordpiece_tokenizer,
           _load_tokenizer, _tokenizer_sane, json=True,
           extra={"string ids": lambda d: d.replace(b'"hello": 5', b'"hello": "5"'),
                  "duplicate ids": lambda d: d.replace(b'"hello": 5', b'"hello": 6'),
                  "huge id": lambda d: d.replace(b'"hello": 5', b'"hello": 1000000000000')}),
    Format("vocab.txt", ("vocab.txt",), _vocab_txt, _load_tokenizer, _tokenizer_sane),
    Format("source.spm (OPUS-MT folder)", ("SentencePiece model",), _opus_folder("source.spm"),
           _load_tokenizer, _tokenizer_sane, target=lambda p: p.parent),
    Format("vocab.json (OPUS-MT folder)", ("SentencePiece model",), _opus_folder("vocab.json"),
           _load_tokenizer, _tokenizer_sane, json=True, target=lambda p: p.parent),
    Format("tokenizer.json (marian-spm)", ("tokenizer",), _marian_spm_file, _load_tokenizer,
           _tokenizer_sane, json=True),
    Format("tiktoken ranks", ("tiktoken ranks",), _tiktoken, _load_tiktoken, _ranks_sane),
    Format("ARPA", ("ARPA",), _arpa, _load_ngram, _ngram_sane),
    Format(".npz n-gram (backoff)", ("n-gram model",), _ngram("mkn"), _load_ngram,
           _ngram_sane, extra=NPZ_EXTRA),
    Format(".npz n-gram (add-k)", ("n-gram model",), _ngram("addk"), _load_ngram, _ngram_sane,
           extra={"nan counts1": _npz_replace("counts1", lambda a: np.full(a.shape, np.nan)),
                  "negative counts2": _npz_replace("counts2", lambda a: -a - 1)}),
    Format("word2vec text", ("word2vec",), _word2vec(False), _load_word2vec, _vectors_sane,
           extra=W2V_TEXT_EXTRA),
    Format("word2vec binary", ("word2vec",), _word2vec(True), _load_word2vec, _vectors_sane,
           extra={**W2V_EXTRA, "nan vector": lambda d: d.replace(
               d[d.index(b"cat ") + 4 : d.index(b"cat ") + 8], struct.pack("<f", math.inf))}),
    Format("JSONL", ("JSONL",), _jsonl(""), _read_corpus(False), _corpus_sane, empty_ok=True,
           extra={"deep": _jsonl_deep, "surrogate": _jsonl_surrogate}),
    Format("JSONL --skip-bad", ("JSONL",), _jsonl(""), _read_corpus(True), _corpus_sane,
           empty_ok=True, extra={"deep": _jsonl_deep, "surrogate": _jsonl_surrogate}),
    Format("JSONL.gz", ("JSONL",), _jsonl(".gz"), _read_corpus(True), _corpus_sane,
           empty_ok=True),
    Format("JSONL.zst", ("JSONL",), _jsonl(".zst"), _read_corpus(True), _corpus_sane,
           empty_ok=True),
    Format("Arrow dataset state.json", ("Arrow",), _arrow_folder("state.json"),
           lambda p: _read_corpus(True)(p.parent), _corpus_sane, json=True,
           extra={"path in a name": lambda d: d.replace(b"data-0", b"../data-0")}),
    Format("Arrow dataset data", ("Arrow",), _arrow_folder("data-00000-of-00001.arrow"),
           lambda p: _read_corpus(True)(p.parent), _corpus_sane, empty_ok=True),
    Format("Parquet", ("Parquet",), _parquet, _read_corpus(True), _corpus_sane),
    Format("pairs", ("pairs",), _pairs, _load_pairs, _pairs_sane),
    Format("checkpoint config.json", ("attnlm checkpoint",), _checkpoint, _load_checkpoint,
           _checkpoint_sane, json=True),
    Format("checkpoint weights", ("attnlm checkpoint",), _ckpt_member("model.safetensors"),
           _load_checkpoint, _checkpoint_sane,
           extra={"nan": _safetensors_nan, "header lies": _safetensors_header_lies}),
    Format("checkpoint tokenizer", ("attnlm checkpoint",), _ckpt_member("tokenizer.json"),
           _load_checkpoint, _checkpoint_sane, json=True),
    Format("checkpoint state.pt", ("attnlm checkpoint",), _ckpt_member("state.pt"),
           lambda p: _load_checkpoint(p).load_state(), lambda s: None),
    Format("FSDP shards", ("FSDP shards",), _fsdp, _load_fsdp),
    Format("preset", ("preset",), _preset, _load_preset, _model_sane, names=("model",),
           extra={"huge": lambda d: d.replace(b"n_layer = 1", b"n_layer = 1000000000000"),
                  "string": lambda d: d.replace(b"n_layer = 1", b'n_layer = "1"'),
                  "nan": lambda d: d.replace(b"n_embd = 8", b"n_embd = nan"),
                  "deep": lambda d: d + b"x = " + b"[" * 100_000 + b"]" * 100_000 + b"\n"}),
    Format("sentence_bert_config.json", ("sentence_bert_config.json",), _sbert, _load_sbert,
           _positive_int, json=True),
    Format("GGUF vocabulary", ("GGUF",), _gguf, _load_tokenizer, _tokenizer_sane),
    Format("GGUF model", ("GGUF",), _gguf_model, _load_gguf_model, _gguf_model_sane,
           extra={"nan": lambda d: d[:-4] + b"\xff\xff\xff\xff"}),  # the last F32: a NaN
]  # fmt: skip

# Registered formats read through another row's reader, or not fuzzed here (with why).
COVERED_ELSEWHERE = {
    "GPT-2 encoder.json": "the GPT-2 files are JSON read by load_json (the config.json row)",
}
