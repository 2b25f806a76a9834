"""Write the committed seed corpus of the fuzz targets (``fuzz/corpus/<target>/seed-*``): small
valid inputs of each format, so the fuzzer starts from files the readers accept and mutates
them field by field. Deterministic; run from the repository root when a format changes:
``.venv/bin/python fuzz/make_corpus.py``. The GGUF seeds also include the test fixture
``tests/fixtures/gguf/spm-vocab.gguf`` (a SentencePiece vocabulary)."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import gguf
import numpy as np

from attnlm.tokenizers.hf_bpe import BYTE_TO_CHAR

ROOT = Path(__file__).resolve().parent
CORPUS = ROOT / "corpus"
BYTES = [BYTE_TO_CHAR[b] for b in range(256)]
MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a"), ("e", "r"), ("o", "n")]
CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
    "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% endif %}"
)
TEMPLATES = {
    "chatml": CHATML,
    "llama3": (
        "{{ bos_token }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + "
        "'<|end_header_id|>\\n\\n' + m['content'] | trim + '<|eot_id|>' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
        "{% endif %}"
    ),
    "mistral": (
        "{{ bos_token }}{% for m in messages %}"
        "{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
        "{{ raise_exception('roles must alternate') }}{% endif %}{% if m['role'] == 'user' %}"
        "{{ '[INST] ' + m['content'] + ' [/INST]' }}{% else %}{{ m['content'] + eos_token }}"
        "{% endif %}{% endfor %}"
    ),
    "features": (
        "{% macro turn(r, c) %}[{{ r | upper }}] {{ c | replace('2', 'two') }}{% endmacro %}"
        "{% set ns = namespace(n=0) %}{% for m in messages if m.role != 'system' %}"
        "{% set ns.n = ns.n + 1 %}{{ turn(m.role, m.content) }}{% if loop.last %}{% break %}"
        "{% endif %}\n{% endfor %}{{ ns.n }} {{ messages | length }} {{ messages[0] | tojson }}"
        "{% for i in range(3) %}{{ i }}{% endfor %}{{ strftime_now('%Y') | length }}"
    ),
}


def byte_vocab() -> dict[str, int]:
    vocab = {c: i for i, c in enumerate(BYTES)}
    for a, b in MERGES:
        vocab[a + b] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    return vocab


def gguf_seeds(out: Path) -> None:
    shutil.copy(ROOT.parent / "tests/fixtures/gguf/spm-vocab.gguf", out / "seed-spm-vocab.gguf")
    vocab = byte_vocab()
    tokens = list(vocab)
    types = [1] * (len(tokens) - 1) + [3]  # the last is a control token
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bpe.gguf"
        w = gguf.GGUFWriter(str(path), "llama")
        w.add_uint32("llama.block_count", 1)
        w.add_uint32("llama.context_length", 64)
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("gpt-2")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges([f"{a} {b}" for a, b in MERGES])
        w.add_bos_token_id(len(tokens) - 1)
        w.add_eos_token_id(len(tokens) - 1)
        w.add_chat_template(CHATML)
        w.add_tensor("output_norm.weight", np.linspace(0.5, 1.5, 32, dtype=np.float32))
        q8 = np.zeros((2, 34), dtype=np.uint8)  # two Q8_0 blocks: float16 scale + 32 codes
        q8[:, 0:2] = np.frombuffer(np.float16(0.5).tobytes(), dtype=np.uint8)
        q8[:, 2:] = np.arange(32, dtype=np.uint8)
        w.add_tensor("blk.0.ffn_up.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        shutil.copy(path, out / "seed-bpe-chatml.gguf")


def tokenizer_json_seeds(out: Path) -> None:
    vocab = byte_vocab()
    bpe = {
        "version": "1.0",
        "added_tokens": [{"id": vocab["<|endoftext|>"], "content": "<|endoftext|>",
                          "special": True, "lstrip": False, "rstrip": False,
                          "normalized": False, "single_word": False}],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
        "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "vocab": vocab, "merges": [f"{a} {b}" for a, b in MERGES]},
    }  # fmt: skip
    (out / "seed-byte-bpe.json").write_text(json.dumps(bpe, ensure_ascii=False), "utf-8")
    bpe["model"]["merges"] = [[a, b] for a, b in MERGES]  # the newer pair form
    bpe["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}"}, "behavior": "Isolated",
         "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]}  # fmt: skip
    bpe["normalizer"] = {"type": "NFC"}
    (out / "seed-byte-bpe-split.json").write_text(json.dumps(bpe, ensure_ascii=False), "utf-8")
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghijklmnopqrstuvwxyz",
             "hello", "world", "##s", "##ing", ",", "!", "1", "2", "3"]  # fmt: skip
    wordpiece = {
        "version": "1.0",
        "added_tokens": [{"id": i, "content": t, "special": True} for i, t in enumerate(words[:5])],
        "normalizer": {"type": "BertNormalizer", "lowercase": True, "strip_accents": None,
                       "clean_text": True, "handle_chinese_chars": True},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": 100, "vocab": {t: i for i, t in enumerate(words)}},
    }  # fmt: skip
    (out / "seed-wordpiece.json").write_text(json.dumps(wordpiece), "utf-8")
    from attnlm.tokenizers import CharTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        CharTokenizer.train("Hello, world!\n", unk=True).save(Path(tmp) / "char.json")
        shutil.copy(Path(tmp) / "char.json", out / "seed-attnlm-char.json")


def vocab_merges_seeds(out: Path) -> None:
    vocab = json.dumps(byte_vocab(), ensure_ascii=False).encode()
    merges = ("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in MERGES)).encode()
    config = json.dumps({"eos_token": "<|endoftext|>", "bos_token": {"content": "<|endoftext|>"}})
    (out / "seed-two-files").write_bytes(vocab + b"\0" + merges)
    (out / "seed-with-config").write_bytes(vocab + b"\0" + merges + b"\0" + config.encode())
    decoder = {
        "added_tokens_decoder": {
            str(byte_vocab()["<|endoftext|>"]): {
                "content": "<|endoftext|>",
                "special": True,
                "lstrip": False,
                "rstrip": False,
            }
        }
    }
    (out / "seed-added-decoder").write_bytes(
        vocab + b"\0" + merges + b"\0" + json.dumps(decoder).encode()
    )


def tiktoken_seeds(out: Path) -> None:
    import base64

    ranks = [bytes([b]) for b in range(256)] + [b" t", b"he", b" the", b"in", b" a", b"er"]
    lines = [base64.b64encode(t) + b" " + str(i).encode() for i, t in enumerate(ranks)]
    (out / "seed-bytes-and-merges.tiktoken").write_bytes(b"\n".join(lines) + b"\n")


def main() -> None:
    makers = {"gguf": gguf_seeds, "tokenizer_json": tokenizer_json_seeds,
              "vocab_merges": vocab_merges_seeds, "tiktoken": tiktoken_seeds}  # fmt: skip
    for name, make in makers.items():
        folder = CORPUS / name
        folder.mkdir(parents=True, exist_ok=True)
        make(folder)
    folder = CORPUS / "chat_template"
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in TEMPLATES.items():
        (folder / f"seed-{name}.jinja").write_text(text, "utf-8")


if __name__ == "__main__":
    main()
