"""``attnlm export --model M --out DIR`` writes a folder other tools open whole: weights,
``config.json``, ``generation_config.json`` and the tokenizer (``tokenizer.json``,
``tokenizer_config.json``, ``special_tokens_map.json``). Checked against ``transformers``
(``AutoTokenizer``, ``AutoModelForCausalLM``, ``GenerationConfig``) and ``tokenizers``: a
char-level run, sampling settings carried from the source, one-line refusals, and (slow) the
real SmolLM2: attnlm's ids, chat rendering and greedy text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gguf_export_support import TABLES, tiny_run
from gguf_support import Writer, smollm2_file

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n"


def _char_run(path: Path) -> Path:
    from attnlm.loading.checkpoint import save_checkpoint
    from attnlm.models.registry import build, config_table
    from attnlm.tokenizers import CharTokenizer

    tok = CharTokenizer.train(TEXT)
    model, _, family = build({**TABLES["llama"], "vocab_size": tok.vocab_size})
    config = {"model_type": "llama", "step": 0, "model": config_table(family, model.config),
              "train": {}}  # fmt: skip
    save_checkpoint(path / "checkpoint", model, config, tok, {"step": 0})
    return path


def test_char_run_folder_opens_whole(tmp_path, cli):
    """A character-level Llama run: transformers loads tokenizer and model from the one
    folder; the ids and the logits are attnlm's."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from attnlm.loading.sources import resolve

    run = _char_run(tmp_path / "run")
    out = tmp_path / "hf"
    r = cli("export", "--model", run, "--out", out, "--json")
    assert r.code == 0, r.err
    summary = json.loads(r.out)
    assert summary["tokenizer"] == "tokenizer.json"
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
            "special_tokens_map.json"} <= names  # fmt: skip
    model, tok, _ = resolve(run, weights="f32")
    hf_tok = AutoTokenizer.from_pretrained(out)
    ids = tok.encode(TEXT)
    assert hf_tok(TEXT)["input_ids"] == ids
    assert tokenizers.Tokenizer.from_file(str(out / "tokenizer.json")).encode(TEXT).ids == ids
    assert hf_tok.decode(ids) == TEXT
    hf_model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    x = torch.tensor([ids])
    with torch.no_grad():
        ours, theirs = model.eval()(x).logits, hf_model(x).logits
    assert torch.allclose(ours, theirs, atol=1e-5, rtol=1e-4)


def test_char_run_folder_boots_in_transformer_lens(tmp_path, cli):
    """TransformerLens boots the exported folder with its own tokenizer: attnlm's ids (no
    BOS: the char tokenizer has none) and attnlm's logits."""
    tl = pytest.importorskip("transformer_lens.model_bridge")

    from attnlm.loading.sources import resolve

    run = _char_run(tmp_path / "run")
    assert cli("export", "--model", run, "--out", tmp_path / "hf").code == 0
    bridge = tl.TransformerBridge.boot_transformers(str(tmp_path / "hf"), device="cpu",
                                                    dtype=torch.float32)  # fmt: skip
    model, tok, _ = resolve(run, weights="f32")
    ids = bridge.to_tokens(TEXT, prepend_bos=False)
    assert ids[0].tolist() == tok.encode(TEXT)
    with torch.no_grad():
        assert torch.allclose(bridge(ids), model.eval()(ids).logits, atol=1e-5, rtol=1e-4)


@pytest.mark.slow  # building the OPUS-MT folder trains two SentencePiece models
def test_opus_mt_folder_keeps_its_sentencepiece_files(tmp_path, cli):
    """An OPUS-MT (Marian) folder exported again: ``MarianTokenizer`` reads the written
    ``source.spm``, ``target.spm``, ``vocab.json`` and config and gives the ids and text of
    the source folder's own tokenizer and attnlm's."""
    pytest.importorskip("sentencepiece")
    from tests.opus_mt import build_opus_folder
    from transformers import MarianTokenizer

    from attnlm.loading.sources import resolve

    source = build_opus_folder(tmp_path / "opus")
    r = cli("export", "--model", source, "--out", tmp_path / "out", "--json")
    assert r.code == 0, r.err
    assert json.loads(r.out)["tokenizer"] == "source.spm"
    theirs = MarianTokenizer.from_pretrained(source)
    ours = MarianTokenizer.from_pretrained(tmp_path / "out")
    tok = resolve(source, weights="f32").tokenizer
    for text in ["I have a cat.", "Where is the station? 42 trains", ">>fra<< Hello there"]:
        ids = theirs(text)["input_ids"]
        assert ours(text)["input_ids"] == ids == tok.encode(text) + [tok.special_tokens["</s>"]]
        target = theirs(text_target=text)["input_ids"]
        assert ours(text_target=text)["input_ids"] == target
        assert ours.decode(ids, skip_special_tokens=True) == tok.decode(ids)


def test_sampling_settings_carried_from_a_hugging_face_folder(tmp_path, cli):
    """A Hugging Face folder's own recommended sampling settings reach the exported
    ``generation_config.json``, beside the ids the tokenizer gives."""
    first, second = tmp_path / "first", tmp_path / "second"
    assert cli("export", "--model", tiny_run(tmp_path / "run", "llama"), "--out", first).code == 0
    generation = json.loads((first / "generation_config.json").read_text(encoding="utf-8"))
    advice = {"do_sample": True, "temperature": 0.7, "top_p": 0.9, "top_k": 40,
              "repetition_penalty": 1.1}  # fmt: skip
    (first / "generation_config.json").write_text(json.dumps({**generation, **advice}))
    assert cli("export", "--model", first, "--out", second).code == 0
    config = transformers.GenerationConfig.from_pretrained(second)
    assert config.eos_token_id == generation["eos_token_id"]
    assert (config.temperature, config.top_p, config.top_k) == (0.7, 0.9, 40)
    assert config.do_sample is True and config.repetition_penalty == 1.1


def test_sampling_settings_of_a_gguf_file(tmp_path):
    """A GGUF file's ``general.sampling.*`` keys (llama.cpp's names) as
    ``generation_config.json`` keys."""
    from attnlm.models.hf.tokenizer_files import source_sampling

    w = Writer(tmp_path / "advice.gguf", "llama")
    w.w.add_float32("general.sampling.temp", 0.5)
    w.w.add_int32("general.sampling.top_k", 20)
    w.w.add_float32("general.sampling.top_p", 0.75)
    w.w.add_float32("general.sampling.penalty_repeat", 1.25)
    path = w.close()
    assert source_sampling(path) == {"temperature": 0.5, "top_k": 20, "top_p": 0.75,
                                     "repetition_penalty": 1.25, "do_sample": True}  # fmt: skip
    assert source_sampling(tmp_path) == {}  # a folder without generation_config.json
    (tmp_path / "broken.gguf").write_bytes(b"GGUF" + b"\0" * 10)
    assert source_sampling(tmp_path / "broken.gguf") == {}  # advice: a damaged file gives none


@pytest.mark.parametrize(
    ("setup", "words"),
    [
        ("other-files", "holds files but is not a Hugging Face folder"),
        ("existing", "already exists (pass --overwrite to replace it)"),
    ],
)
def test_refusals_are_one_line(tmp_path, cli, setup, words):
    out = tmp_path / "out"
    out.mkdir()
    if setup == "other-files":
        (out / "notes.txt").write_text("mine")
    else:
        (out / "config.json").write_text("{}")
    r = cli("export", "--model", tiny_run(tmp_path / "run", "llama"), "--out", out)
    assert r.code == 2 and words in r.err and len(r.err.strip().splitlines()) == 1, r.err
    assert "Traceback" not in r.err
    assert sorted(p.name for p in out.iterdir()) == (
        ["notes.txt"] if setup == "other-files" else ["config.json"])  # fmt: skip


@pytest.mark.slow
def test_minilm_bert_folder_round_trip(tmp_path, cli):
    """A real BERT folder (all-MiniLM-L6-v2, WordPiece ``tokenizer.json``) exported again: its
    own ``transformers`` tokenizer and the exported one give the same ids, token types and
    text, and the encoders the same hidden states."""
    from transformers import AutoModel, AutoTokenizer

    from attnlm.base.errors import InputError
    from attnlm.data.pretrained import pretrained_path

    try:
        source = pretrained_path("minilm")
    except InputError as e:
        pytest.skip(f"minilm is not available: {e}")
    out = tmp_path / "minilm"
    r = cli("export", "--model", source, "--out", out)
    assert r.code == 0 and "no tokenizer" not in r.out, r.err
    theirs, ours = AutoTokenizer.from_pretrained(source), AutoTokenizer.from_pretrained(out)
    texts = ["Hello World! Don't stop.", "日本語 naïve café 😀", "[CLS] x [MASK] y", "a  b\n\tc"]
    for text in texts:
        a, b = theirs(text, "second part"), ours(text, "second part")
        assert a["input_ids"] == b["input_ids"] and a["token_type_ids"] == b["token_type_ids"]
        assert theirs.decode(a["input_ids"]) == ours.decode(a["input_ids"])
    x = theirs(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        h0 = AutoModel.from_pretrained(source).eval()(**x).last_hidden_state
        h1 = AutoModel.from_pretrained(out).eval()(**x).last_hidden_state
    assert torch.allclose(h0, h1, atol=1e-5)


# -- the real SmolLM2 ----------------------------------------------------------------------------

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Answer in one word."},
     {"role": "user", "content": "Capital of Italy?"},
     {"role": "assistant", "content": "Rome."},
     {"role": "user", "content": "And of Spain?"}],
]  # fmt: skip
SMOL_TEXTS = ["The capital of France is", "  spaces\n\nnewlines\t42 and 3.14159 😀 café 日本",
              "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>", ""]  # fmt: skip


@pytest.mark.slow
def test_smollm2_export_opens_whole(tmp_path):
    """``attnlm export --model smollm2-135m-instruct --out DIR``: ``transformers`` gives
    attnlm's ids, chat rendering (the default system prompt included) and greedy reply, and
    stops it where attnlm's end-of-generation ids say."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from attnlm.generate import SamplingConfig, decode
    from attnlm.loading.sources import resolve
    from support import attnlm_process

    path = smollm2_file(fetch=True)
    out = tmp_path / "smollm2"
    r = attnlm_process("export", "--model", "smollm2-135m-instruct", "--out", out, threads=2,
                       timeout=900)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "no tokenizer" not in r.stdout
    model, tok, info = resolve(path, weights="f32")
    hf_tok = AutoTokenizer.from_pretrained(out)
    raw = tokenizers.Tokenizer.from_file(str(out / "tokenizer.json"))
    for text in SMOL_TEXTS:
        ids = tok.encode(text)
        assert hf_tok(text)["input_ids"] == hf_tok(text, add_special_tokens=False)["input_ids"]
        assert hf_tok(text)["input_ids"] == ids == raw.encode(text).ids, text
        assert hf_tok.decode(ids) == tok.decode(ids) == text
    for chat in CHATS:
        for gen in (True, False):
            ours = info.chat_template.render(chat, add_generation_prompt=gen)
            assert (
                hf_tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen) == ours
            )
    default = info.chat_template.render(CHATS[0], add_generation_prompt=True)
    assert "You are a helpful AI assistant named SmolLM" in default
    names = json.loads((out / "special_tokens_map.json").read_text(encoding="utf-8"))
    assert names["eos_token"] == "<|im_end|>" == hf_tok.eos_token
    generation = transformers.GenerationConfig.from_pretrained(out)
    # EOS first, then the other ids llama.cpp ends generation at
    assert generation.eos_token_id[0] == tok.eos_id
    assert set(generation.eos_token_id) == set(tok.eog_ids) | {tok.eos_id}
    assert (generation.bos_token_id, generation.pad_token_id) == (tok.bos_id, tok.pad_id)

    rendered = info.chat_template.render(CHATS[0], add_generation_prompt=True)
    ids = tok.encode(rendered)
    prompt = hf_tok.apply_chat_template(CHATS[0], add_generation_prompt=True, tokenize=True,
                                        return_dict=True)["input_ids"]  # fmt: skip
    assert list(prompt) == ids
    ours = list(decode(model, [ids], SamplingConfig(temperature=0, max_new_tokens=24))[0])
    hf_model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    x = torch.tensor([ids])
    with torch.no_grad():
        theirs = hf_model.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                                   max_new_tokens=24)[0, len(ids) :].tolist()  # fmt: skip
    assert theirs == ours[: len(theirs)]
    if len(theirs) < 24:  # transformers stopped at an end-of-generation id
        assert theirs[-1] in generation.eos_token_id
    assert "Paris" in tok.decode(theirs)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gemma3-270m", "qwen2.5-coder-0.5b-instruct"])
def test_real_k_quant_models_export_whole(tmp_path, cli, name):
    """Gemma 3 270M (SentencePiece, BOS added) and Qwen2.5-Coder 0.5B (qwen2 byte-level BPE,
    a chat template with a default system prompt), exported from their Q4_K_M files:
    ``transformers`` gives attnlm's ids (BOS as the file asks), chat rendering and 16 greedy
    tokens."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from attnlm.base.errors import InputError
    from attnlm.generate import SamplingConfig, decode
    from attnlm.loading.sources import resolve

    try:
        from attnlm.data.pretrained import pretrained_file

        path = pretrained_file(name)
    except (ImportError, KeyError, InputError) as e:
        pytest.skip(f"{name} is not available: {e}")
    out = tmp_path / name
    r = cli("export", "--model", path, "--out", out)
    assert r.code == 0 and "no tokenizer" not in r.out, r.err
    model, tok, info = resolve(path, weights="f32")
    hf_tok = AutoTokenizer.from_pretrained(out)
    prompt = "The capital of France is"
    ids = tok.encode(prompt, add_special_tokens=True)
    assert hf_tok(prompt)["input_ids"] == ids
    if info.chat_template is not None:
        chat = [{"role": "user", "content": "Write a Python function that reverses a string."}]
        ours = info.chat_template.render(chat, add_generation_prompt=True)
        assert hf_tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == ours
        ids = tok.encode(ours)
    greedy = list(decode(model, [ids], SamplingConfig(temperature=0, max_new_tokens=16))[0])
    del model
    hf_model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    x = torch.tensor([ids])
    with torch.no_grad():
        theirs = hf_model.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                                   max_new_tokens=16)[0, len(ids) :].tolist()  # fmt: skip
    assert theirs == greedy[: len(theirs)]
