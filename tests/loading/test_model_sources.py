"""The resolver (``attnlm.loading.sources.resolve``): a Hugging Face folder, an attnlm run, a GPT-2
folder with ``vocab.json`` + ``merges.txt``, a registered name, a Hub id read from a cache laid
out as ``huggingface_hub`` lays it out (``HF_HUB_OFFLINE=1``, never the network), and the
one-line errors."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
import torch

from attnlm.base.errors import InputError
from attnlm.loading.sources import available, hub_cached, resolve

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
transformers.logging.set_verbosity_error()
pytestmark = pytest.mark.usefixtures("one_thread")

from support_chat import tiny_chat_llama  # noqa: E402

IDS = [[5, 17, 40, 3, 99, 2, 7]]


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    return tiny_chat_llama(tmp_path_factory.mktemp("sources") / "tiny-llama")


def reference_logits(folder, ids):
    ref = transformers.LlamaForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        return ref(torch.tensor(ids)).logits


def test_hf_folder(hf_folder):
    model, tok, info = resolve(str(hf_folder))
    assert info.kind == "huggingface" and info.family.type == "llama"
    with torch.no_grad():
        ours = model(ids=torch.tensor(IDS)).logits
    torch.testing.assert_close(ours, reference_logits(hf_folder, IDS), atol=1e-5, rtol=1e-4)
    ref_tok = transformers.AutoTokenizer.from_pretrained(hf_folder)
    text = "<|im_start|>user\nthe capital of France?<|im_end|>\n"
    assert tok.encode(text) == ref_tok(text, add_special_tokens=False)["input_ids"]
    conv = [{"role": "user", "content": "hello"}]
    assert info.chat_template.render(conv, add_generation_prompt=True) == (
        ref_tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
    )
    assert ref_tok.convert_tokens_to_ids("<|im_end|>") in info.stop_ids


def test_run_folder(hf_folder, tmp_path):
    from attnlm.loading.checkpoint import save_checkpoint
    from attnlm.models import registry

    model, tok, _ = resolve(hf_folder)
    family = registry.family_of(model)
    config = {"step": 3, "model": registry.config_table(family, model.config), "train": {}}
    save_checkpoint(tmp_path / "run" / "checkpoint", model, config, tok, {"step": 3})
    m2, tok2, info = resolve(tmp_path / "run")
    assert info.kind == "run" and info.checkpoint.step == 3 and info.chat_template is None
    with torch.no_grad():
        a, b = model(ids=torch.tensor(IDS)).logits, m2(ids=torch.tensor(IDS)).logits
    torch.testing.assert_close(a, b)
    assert tok2.encode("hello user") == tok.encode("hello user")


def test_gpt2_folder_with_vocab_and_merges(tmp_path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, show_progress=False,
                                  special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tok.train_from_iterator(["the bank of the river, the bank of the town"] * 20, trainer)
    folder = tmp_path / "gpt2"
    folder.mkdir()
    tok.model.save(str(folder))  # vocab.json + merges.txt
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    cfg = transformers.GPT2Config(vocab_size=tok.get_vocab_size(), n_embd=32, n_layer=2,
                                  n_head=2, n_positions=64)  # fmt: skip
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(folder)
    model, ours, info = resolve(folder)
    assert info.family.type == "gpt"
    for text in ["the bank of the river", "  banks,\nof<|endoftext|>the t0wn é"]:
        assert ours.encode(text) == tok.encode(text).ids
    assert info.stop_ids == (tok.token_to_id("<|endoftext|>"),)


def write_hub_cache(root, repo_id, folder, commit="a" * 40):
    """``folder``'s files as huggingface_hub caches a snapshot: blobs named by their hash,
    ``snapshots/<commit>/`` links to them, ``refs/main`` naming the commit."""
    repo = root / ("models--" + repo_id.replace("/", "--"))
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    for f in sorted(folder.iterdir()):
        digest = hashlib.sha256(f.read_bytes()).hexdigest()
        shutil.copyfile(f, repo / "blobs" / digest)
        (snap / f.name).symlink_to(f"../../blobs/{digest}")
    return snap


def test_hub_id_from_cache_offline(hf_folder, tmp_path, monkeypatch):
    pytest.importorskip("huggingface_hub")
    cache = tmp_path / "hub"
    snap = write_hub_cache(cache, "someorg/tiny-llama", hf_folder)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model, tok, info = resolve("someorg/tiny-llama")
    assert info.kind == "hub" and info.name == "someorg/tiny-llama"
    assert info.path.resolve() == snap.resolve() and info.chat_template is not None
    with torch.no_grad():
        ours = model(ids=torch.tensor(IDS)).logits
    torch.testing.assert_close(ours, reference_logits(hf_folder, IDS), atol=1e-5, rtol=1e-4)
    assert hub_cached("someorg/tiny-llama") and not hub_cached("someorg/other")
    rows = {r["name"]: r for r in available()}
    assert rows["someorg/tiny-llama"]["cached"] is True
    with pytest.raises(InputError) as e:
        resolve("someorg/other")
    msg = str(e.value)
    assert "\n" not in msg and str(cache) in msg and "HF_HUB_OFFLINE=1" in msg


def test_registered_name(hf_folder, tmp_path, monkeypatch):
    from attnlm.data import pretrained

    spec = pretrained.PretrainedSpec("tiny-chat", "x==1", "x.whl", "x/", ("config.json",), "", "")
    monkeypatch.setitem(pretrained.PRETRAINED, "tiny-chat", spec)
    monkeypatch.setenv("ATTNLM_CACHE", str(tmp_path))
    assert {r["name"]: r["cached"] for r in available()}["tiny-chat"] is False
    shutil.copytree(hf_folder, tmp_path / "pretrained" / "tiny-chat")
    _, _, info = resolve("tiny-chat")
    assert info.kind == "name" and info.name == "tiny-chat" and info.family.type == "llama"
    assert {r["name"]: r["cached"] for r in available()}["tiny-chat"] is True


def test_bad_specs(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("hello")
    cases = {
        "no-such-model": "unknown model",
        str(tmp_path / "empty"): "not a model folder",
        str(tmp_path / "notes.txt"): "not a model",
        "": "give a model",
    }
    for spec, message in cases.items():
        with pytest.raises(InputError, match=message) as e:
            resolve(spec)
        assert "\n" not in str(e.value)


def test_a_missing_local_folder_is_not_looked_up_on_the_hub(tmp_path, monkeypatch):
    """``--model runs/demo`` where ``runs/`` exists but ``runs/demo`` does not: the folder is
    missing (said in one line), not "not in the Hugging Face cache"; ``org/name`` whose
    ``org`` is no local folder stays a Hub id."""
    from attnlm.loading.sources import looks_like_path

    (tmp_path / "runs").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # were it looked up: the cache alone, no network
    for spec in ("runs/demo", "./demo", "../demo", str(tmp_path / "demo"), "runs/demo/x"):
        with pytest.raises(InputError, match="no such file or folder") as e:
            resolve(spec)
        assert "\n" not in str(e.value) and "cache" not in str(e.value), spec
    assert looks_like_path("runs/demo") and not looks_like_path("someorg/tiny-llama")
    with pytest.raises(InputError, match="not in the Hugging Face cache"):
        resolve("someorg/tiny-llama")


def test_gguf_contract(hf_folder, tmp_path, monkeypatch):
    """The resolver's side of a ``.gguf`` file, with stand-ins for ``attnlm.models.gguf``'s
    ``load_model``/``load_tokenizer`` (of a parsed header, ``attnlm.base.ggufio.GGUFFile``): the
    template is the tokenizer's ``chat_template`` with the strings of its BOS/EOS ids; its EOS
    and EOT ids end a reply."""
    from attnlm import models, tokenizers
    from attnlm.base import ggufio
    from attnlm.models import gguf
    from support_chat import CHATML

    tok = tokenizers.load(hf_folder)
    vocab = [tok.decode([i]) for i in range(tok.vocab_size)]
    end = tok.special_tokens["<|im_end|>"]
    # what a GGUFTokenizer answers (tokenizers/gguf.py)
    template = CHATML + "{{ bos_token }}|{{ eos_token }}"
    answers = {"tokens": vocab, "bos_id": 1, "eos_id": end, "eot_id": 0, "unk_id": None,
               "pad_id": None, "chat_template": template}  # fmt: skip
    for name, value in answers.items():
        monkeypatch.setattr(tok, name, value, raising=False)
    monkeypatch.setattr(gguf, "load_model", lambda header, weights: models.from_hf(hf_folder))
    monkeypatch.setattr(gguf, "precision_class", lambda header: "f32")
    monkeypatch.setattr(gguf, "load_tokenizer", lambda header: tok)
    monkeypatch.setattr(ggufio, "GGUFFile", lambda path: path)
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    _, _, info = resolve(f)
    assert info.kind == "gguf" and info.family.type == "llama"
    assert info.stop_ids[:2] == (end, 0)
    text = info.chat_template.render([{"role": "user", "content": "hi"}])
    assert text.endswith(f"{vocab[1]}|<|im_end|>") and text.startswith("<|im_start|>system")


def test_load_as_checkpoint(hf_folder, tmp_path):
    from attnlm.loading.checkpoint import load_checkpoint, save_checkpoint
    from attnlm.loading.sources import load_as_checkpoint
    from attnlm.models import registry

    ck = load_as_checkpoint(hf_folder)
    assert ck.family.type == "llama" and ck.step == 0 and ck.config["source"] == "huggingface"
    assert ck.config["model"] == registry.config_table(ck.family, ck.model.config)
    config = {"step": 5, "model": ck.config["model"], "train": {"lr": 1.0}}
    save_checkpoint(tmp_path / "run" / "checkpoint", ck.model, config, ck.tokenizer, {"step": 5})
    run = load_as_checkpoint(tmp_path / "run")
    direct = load_checkpoint(tmp_path / "run")
    assert run.step == direct.step == 5 and run.train_config == direct.train_config
