"""The tokenizer files of an exported Hugging Face folder (``attnlm export --out``,
:mod:`attnlm.models.hf.tokenizer_files`) against the independent reference, ``transformers``'
``AutoTokenizer`` (on ``tokenizers``): the ids of attnlm's tokenizer on varied text, decoding,
BOS, the chat template and the generation config, for GGUF byte-level BPE vocabularies with
SmolLM2's, Qwen2's and Llama 3's pre-tokenizers, a SentencePiece-style GGUF vocabulary (against
llama.cpp's own ids) and attnlm's own byte-level BPE; and the real SmolLM2 (slow): the folder
loads in ``transformers`` and continues a prompt as attnlm does."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from attnlm.models.gguf.writer import export_gguf
from attnlm.models.registry import build
from attnlm.tokenizers import load
from gguf_export_support import TABLES, tiny_run
from gguf_support import Writer, smollm2_file
from support import FIXTURES

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

TEXTS = [
    "Hello world, hello there!",
    "12345 3.14159 x=1000000 2024-01-31",
    "I'm you're THEY'RE we'll she'd it's",
    "line one\nline two\r\n\n\nindented:\n    return x**2\n\t\ttabs",
    "multiple   spaces    here  and trailing   ",
    "日本語 中文 한국어 😀👍🏽 naïve café Ελληνικά",
    "<|im_start|>user\nhi there<|im_end|>\n<|endoftext|>",
    "inside<|im_end|>word and <tool> call",
    "an unreachable word",
    "",
]
SPECIALS = ["<|endoftext|>", "<|begin_of_text|>", "<|im_start|>", "<|im_end|>"]
USER_DEFINED = "<tool>"
UNREACHABLE = "Ġunreachable"  # " unreachable" in GPT-2's byte alphabet
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 12 + 30?"},
    {"role": "assistant", "content": "42."},
    {"role": "user", "content": "And 1 + 1?"},
]


def _vocab_gguf(path: Path, pre: str) -> Path:
    """A byte-level BPE trained by ``tokenizers`` on whole lines (its merges cross spaces,
    digits and punctuation, so that how the pre-tokenizer splits shows in the ids), written
    as a GGUF vocabulary with pre-tokenizer ``pre``: control tokens, one user-defined token,
    BOS / EOS / padding ids (BOS added as ``pre`` implies: yes for Llama 3's)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=[*SPECIALS, USER_DEFINED],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)  # fmt: skip
    corpus = [t * 4 for t in TEXTS] + ["the cat sat on the mat 2024 1999 don't we'll " * 5]
    hf.train_from_iterator(corpus, trainer)
    doc = json.loads(hf.to_str())
    vocab = doc["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    tokens.append(UNREACHABLE)  # no merge makes it: only Llama 3's ignore_merges finds it
    types = [3 if t in SPECIALS else 4 if t == USER_DEFINED else 1 for t in tokens]
    w = Writer(path, "llama")
    w.w.add_tokenizer_model("gpt2")
    w.w.add_tokenizer_pre(pre)
    w.w.add_token_list(tokens)
    w.w.add_token_types(types)
    w.w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in doc["model"]["merges"]])
    w.w.add_bos_token_id(vocab["<|begin_of_text|>"])
    w.w.add_eos_token_id(vocab["<|im_end|>"])
    w.w.add_pad_token_id(vocab["<|endoftext|>"])
    return w.close()


def _model_gguf(tmp_path: Path, pre: str) -> Path:
    """A tiny Llama with the ``pre`` vocabulary and :data:`TEMPLATE`, as a GGUF model file."""
    tok = load(_vocab_gguf(tmp_path / "vocab.gguf", pre))
    model, _, _ = build({**TABLES["llama"], "vocab_size": tok.vocab_size})
    path = tmp_path / f"{pre}.gguf"
    export_gguf(model.eval(), tok, path, "f32", chat_template=TEMPLATE)
    return path


def _check_ids_and_decoding(hf, tok, texts=TEXTS):
    for text in texts:
        ids = tok.encode(text)
        assert hf(text, add_special_tokens=False)["input_ids"] == ids, text
        assert hf(text)["input_ids"] == tok.encode(text, add_special_tokens=True), text
        assert hf.decode(ids) == tok.decode(ids) == text
        assert hf.decode(ids, skip_special_tokens=True) == tok.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("pre", ["gpt-2", "smollm", "qwen2", "llama-bpe"])
def test_gguf_byte_level_bpe_folder_loads_in_transformers(tmp_path, cli, pre):
    from transformers import AutoTokenizer

    source = _model_gguf(tmp_path, pre)
    out = tmp_path / "hf"
    r = cli("export", "--model", source, "--out", out, "--json")
    assert r.code == 0, r.err
    summary = json.loads(r.out)
    assert summary["tokenizer"] == "tokenizer.json"
    assert summary["files"] == [
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "generation_config.json",
    ]
    tok = load(source)
    hf = AutoTokenizer.from_pretrained(out)
    _check_ids_and_decoding(hf, tok)
    # the texts tell the pre-tokenizers apart: GPT-2's (for GPT-2's: no split at all) would
    # give other ids for some
    doc = json.loads((out / "tokenizer.json").read_text(encoding="utf-8"))
    doc["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                            "use_regex": pre != "gpt-2"}  # fmt: skip
    other = tokenizers.Tokenizer.from_str(json.dumps(doc))
    assert any(other.encode(t, add_special_tokens=False).ids != tok.encode(t) for t in TEXTS)

    unreachable = tok.ids[UNREACHABLE]
    assert (unreachable in tok.encode(" unreachable")) == (pre == "llama-bpe")
    bos = tok.ids["<|begin_of_text|>"]
    assert tok.add_bos == (pre == "llama-bpe")  # llama.cpp's default for Llama 3's
    assert (hf("hi")["input_ids"][0] == bos) == tok.add_bos
    config = json.loads((out / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert (config["bos_token"], config["eos_token"], config["pad_token"]) == (
        "<|begin_of_text|>", "<|im_end|>", "<|endoftext|>")  # fmt: skip
    assert (config["add_bos_token"], config["add_eos_token"]) == (tok.add_bos, False)
    assert config["model_max_length"] == TABLES["llama"]["block_size"] == hf.model_max_length
    assert config["chat_template"] == TEMPLATE
    assert config["clean_up_tokenization_spaces"] is False
    assert hf.pad_token_id == tok.ids["<|endoftext|>"]
    # the chat template renders as attnlm's (the same special tokens passed in)
    from attnlm.loading.sources import resolve

    info = resolve(source, weights="f32").info
    for gen in (True, False):
        ours = info.chat_template.render(CHAT, add_generation_prompt=gen)
        assert hf.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=gen) == ours
        assert ours.startswith("<|begin_of_text|><|im_start|>system\n")
    # end-of-generation ids: EOS first, then the others llama.cpp stops at
    generation = json.loads((out / "generation_config.json").read_text(encoding="utf-8"))
    eog = [tok.eos_id] + sorted(tok.eog_ids - {tok.eos_id})
    assert generation == {"bos_token_id": bos, "eos_token_id": eog, "pad_token_id": tok.pad_id}
    assert transformers.GenerationConfig.from_pretrained(out).eos_token_id == eog
    # attnlm reads its own folder back: the same ids
    assert resolve(out, weights="f32").tokenizer.encode(TEXTS[3]) == tok.encode(TEXTS[3])


def test_sentencepiece_gguf_vocabulary_equals_llamacpp(tmp_path):
    """The SentencePiece-style vocabulary as ``tokenizers`` BPE with byte fallback: the ids
    llama.cpp gave (``tests/fixtures/gguf/llamacpp-tokens.json``, control tokens parsed),
    with and without BOS, and attnlm's decoding."""
    from transformers import AutoTokenizer

    from attnlm.models.hf.tokenizer_files import write_tokenizer_files

    tok = load(FIXTURES / "gguf" / "spm-vocab.gguf")
    config = SimpleNamespace(vocab_size=tok.vocab_size, block_size=256)
    assert write_tokenizer_files(tok, tmp_path, config)[0] == "tokenizer.json"
    hf = AutoTokenizer.from_pretrained(tmp_path)
    refs = json.loads((FIXTURES / "gguf" / "llamacpp-tokens.json").read_text(encoding="utf-8"))
    refs = refs["files"]["spm-vocab.gguf"]
    assert len(refs) >= 25
    # variants (add_special, parse_special): (F, F), (F, T), (T, F), (T, T); transformers parses
    for text, (_, plain, _, with_bos) in refs.items():
        assert hf(text, add_special_tokens=False)["input_ids"] == plain, text
        assert hf(text)["input_ids"] == with_bos, text
        assert hf.decode(plain) == tok.decode(plain), text
        assert hf.decode(with_bos, skip_special_tokens=True) == tok.decode(with_bos, True), text
    assert hf.bos_token == "<s>" and hf.unk_token == "<unk>" and hf.model_max_length == 256


def test_attnlm_byte_level_bpe_run_loads_in_transformers(tmp_path, cli):
    """attnlm's own byte-level BPE (GPT-2's pattern): the existing export, now with a config
    and the generation config."""
    from transformers import AutoTokenizer

    run = tiny_run(tmp_path / "run", "llama")
    assert cli("export", "--model", run, "--out", tmp_path / "hf").code == 0
    tok = load(run / "checkpoint" / "tokenizer.json")
    hf = AutoTokenizer.from_pretrained(tmp_path / "hf")
    for text in TEXTS:  # tiktoken's rules: special tokens in the text when allowed
        ids = tok.encode(text, allowed_special="all")
        assert hf(text)["input_ids"] == hf(text, add_special_tokens=False)["input_ids"] == ids
        assert hf.decode(ids) == tok.decode(ids) == text
    eot = tok.special_tokens["<|endoftext|>"]
    assert hf.eos_token == "<|endoftext|>" and hf.bos_token is None
    generation = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    assert generation == {"eos_token_id": eot}


def test_other_tokenizers_write_no_tokenizer_files(tmp_path, cli):
    """A word-level tokenizer (no tokenizer.json form): the model alone, said in one line
    naming the kind, and tokenizer files an earlier export left are removed (they would
    describe another tokenizer)."""
    from attnlm.loading.checkpoint import save_checkpoint
    from attnlm.models.registry import config_table
    from attnlm.tokenizers.word import WordTokenizer

    out = tmp_path / "hf"
    assert cli("export", "--model", tiny_run(tmp_path / "run", "llama"), "--out", out).code == 0
    assert (out / "tokenizer_config.json").is_file()
    tok = WordTokenizer(["the", "cat", "sat"])
    table = {**TABLES["llama"], "vocab_size": tok.vocab_size}
    model, _, family = build(table)
    config = {"model_type": "llama", "step": 0, "model": config_table(family, model.config),
              "train": {}}  # fmt: skip
    save_checkpoint(tmp_path / "char" / "checkpoint", model, config, tok, {"step": 0})
    r = cli("export", "--model", tmp_path / "char", "--out", out, "--overwrite")
    assert r.code == 0 and "no tokenizer files: a word tokenizer has no" in r.out, r.err
    assert len(r.out.strip().splitlines()) == 1
    assert (out / "config.json").is_file()
    assert not any((out / n).exists() for n in ("tokenizer.json", "tokenizer_config.json",
                                                "special_tokens_map.json",
                                                "generation_config.json"))  # fmt: skip


# -- the real SmolLM2 ----------------------------------------------------------------------------

PROMPT = "The capital of France is"


@pytest.mark.slow
def test_smollm2_folder_tokenizes_and_continues_as_attnlm(tmp_path):
    """``attnlm export --model smollm2-135m-instruct --out DIR``: ``transformers`` loads the
    folder (tokenizer and float32 model) and gives attnlm's ids and its 16-token greedy
    continuation."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from attnlm.generate import SamplingConfig, decode
    from attnlm.loading.sources import resolve
    from support import attnlm_process

    path = smollm2_file(fetch=True)
    out = tmp_path / "smollm2"
    r = attnlm_process("export", "--model", "smollm2-135m-instruct", "--out", out, threads=2,
                       timeout=900)  # fmt: skip
    assert r.returncode == 0, r.stderr
    model, tok, info = resolve(path, weights="f32")
    hf_tok = AutoTokenizer.from_pretrained(out)
    refs = json.loads((FIXTURES / "gguf" / "llamacpp-tokens.json").read_text(encoding="utf-8"))
    texts = [*TEXTS, *refs["files"]["smollm2-135m-instruct"]]
    _check_ids_and_decoding(hf_tok, tok, texts)
    chat = CHAT[1:]
    assert hf_tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == (
        info.chat_template.render(chat, add_generation_prompt=True))  # fmt: skip

    ids = tok.encode(PROMPT)
    ours = decode(model, [ids], SamplingConfig(temperature=0, max_new_tokens=16))[0]
    hf_model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    prompt = torch.tensor([ids])
    with torch.no_grad():
        theirs = hf_model.generate(prompt, attention_mask=torch.ones_like(prompt),
                                   do_sample=False, max_new_tokens=16)  # fmt: skip
    assert theirs[0, len(ids) :].tolist() == list(ours)
    assert "Paris" in tok.decode(list(ours))
