"""``attnlm train --init-from SPEC``: a run that starts from a pretrained model (a Hugging Face
folder written by ``save_hf``, a quantized GGUF file), resumes, generates, refuses architecture
changes, and ``--freeze-embeddings`` / ``--freeze-layers``."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from tests.support import ROMEO, loss_curve

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_gpt2_folder(folder, block_size=128, seed=0):
    """A random GPT-2 written as a Hugging Face folder by ``save_hf``, with a BPE tokenizer
    trained on ROMEO (attnlm's tokenizer file as ``tokenizer.json``)."""
    from attnlm.models.gpt import GPT, GPTConfig
    from attnlm.models.hf import save_hf
    from attnlm.tokenizers import make_tokenizer

    tok = make_tokenizer("bpe", "", ROMEO, 300)
    torch.manual_seed(seed)
    cfg = GPTConfig(vocab_size=tok.vocab_size, block_size=block_size, n_layer=2, n_head=2,
                    n_embd=32)  # fmt: skip
    save_hf(GPT(cfg), folder)
    tok.save(folder / "tokenizer.json")
    return folder


@pytest.fixture()
def gpt2_folder(tmp_path):
    return tiny_gpt2_folder(tmp_path / "gpt2")


def _text(tmp_path, text=ROMEO):
    path = tmp_path / "text.txt"
    path.write_text(text)
    return path


def _train_ids(run):
    from attnlm.data.windows import read_token_file

    return np.asarray(read_token_file(run / "train.bin").open()).astype(np.int64)


def _config(run):
    return json.loads((run / "checkpoint" / "config.json").read_text())


def test_first_step_loss_is_the_pretrained_models_loss(cli, tmp_path, gpt2_folder):
    """With one window in the training split, every row of the first batch is that window:
    the first step's loss must be what ``transformers`` computes with the source weights."""
    transformers = pytest.importorskip("transformers")
    short = _text(tmp_path, ROMEO[:220])
    first = tmp_path / "prepare"
    assert cli("train", "--init-from", gpt2_folder, "--text", short, "--out", first,
                   "--max-iters", "1", "--no-progress").code == 0  # fmt: skip
    ids = _train_ids(first)
    run = tmp_path / "run"
    r = cli("train", "--init-from", gpt2_folder, "--text", short, "--out", run,
                "--max-iters", "1", "--block-size", len(ids) - 1, "--batch-size", 2,
                "--no-progress")  # fmt: skip
    assert r.code == 0, r.err
    assert "init-from:" in r.out
    np.testing.assert_array_equal(_train_ids(run), ids)  # encoded with the source's tokenizer
    hf = transformers.GPT2LMHeadModel.from_pretrained(gpt2_folder).eval()
    x = torch.as_tensor(ids)[None]
    with torch.no_grad():
        want = hf(x, labels=x).loss.item()  # HF shifts the labels itself
        logits = hf(x[:, :-1]).logits
    ref = torch.nn.functional.cross_entropy(logits[0], x[0, 1:]).item()
    assert want == pytest.approx(ref, abs=1e-6)
    assert loss_curve(run)[1] == pytest.approx(ref, abs=1e-4)


def test_run_records_init_from_and_loads_without_the_source(cli, tmp_path, gpt2_folder):
    import shutil

    from attnlm.loading.checkpoint import load_checkpoint
    from attnlm.loading.sources import resolve
    from attnlm.train.finetune import weights_fingerprint

    run = tmp_path / "run"
    r = cli("train", "--init-from", gpt2_folder, "--text", _text(tmp_path), "--out",
                run, "--max-iters", "4", "--eval-interval", "2", "--no-progress")  # fmt: skip
    assert r.code == 0, r.err
    config = _config(run)
    src = resolve(gpt2_folder).model
    assert config["init_from"] == {"spec": str(gpt2_folder.resolve()), "kind": "huggingface",
                                   "fingerprint": weights_fingerprint(src)}  # fmt: skip
    assert config["train"]["init_from"] == str(gpt2_folder.resolve())
    shutil.rmtree(gpt2_folder)  # the run stands alone
    ck = load_checkpoint(run)
    assert ck.model.config == src.config
    assert ck.tokenizer.encode("ROMEO: soft") == resolve(run).tokenizer.encode("ROMEO: soft")
    # resume continues from step 4 with the stored tokenizer and architecture
    r = cli("train", "--resume", run, "--max-iters", "6", "--eval-interval", "2",
                "--no-progress")  # fmt: skip
    assert r.code == 0, r.err
    assert "resuming" in r.out and "done: 6 steps" in r.out
    assert _config(run)["init_from"] == config["init_from"]
    r = cli("generate", "--model", run, "--prompt", "ROMEO:", "--max-new-tokens", "5",
                "--seed", "1")  # fmt: skip
    assert r.code == 0, r.err
    assert r.out.startswith("ROMEO:")


@pytest.mark.parametrize(
    "extra, field",
    [
        (["--set", "model.n_layer=3"], "model.n_layer"),
        (["--set", "model.n_kv_head=1"], "model.n_kv_head"),
        (["--preset", "shakespeare-char"], "model."),
    ],
)
def test_architecture_changes_are_refused(cli, tmp_path, gpt2_folder, extra, field):
    r = cli("train", "--init-from", gpt2_folder, "--text", _text(tmp_path), "--out",
                tmp_path / "run", "--max-iters", "1", *extra)  # fmt: skip
    assert r.code == 2
    assert field in r.err and "init-from" in r.err and len(r.err.strip().splitlines()) == 1
    assert not (tmp_path / "run" / "checkpoint").exists()


def test_training_settings_may_change(cli, tmp_path, gpt2_folder):
    r = cli("train", "--init-from", gpt2_folder, "--text", _text(tmp_path), "--out",
                tmp_path / "run", "--max-iters", "1", "--set", "train.lr=3e-4",
                "--set", "model.n_layer=2", "--no-progress")  # fmt: skip
    assert r.code == 0, r.err
    assert _config(tmp_path / "run")["train"]["lr"] == 3e-4


def test_own_tokenizer_is_refused(cli, tmp_path, gpt2_folder):
    r = cli("train", "--init-from", gpt2_folder, "--tokenizer", "char",
                "--out", tmp_path / "run")  # fmt: skip
    assert r.code == 2 and "--tokenizer" in r.err


def test_unknown_source_is_one_line(cli, tmp_path):
    r = cli("train", "--init-from", tmp_path / "nope", "--out", tmp_path / "run")
    assert r.code == 2 and "no such file" in r.err and len(r.err.strip().splitlines()) == 1


def test_freeze_embeddings_and_layers(cli, tmp_path, gpt2_folder):
    from attnlm.loading.checkpoint import load_checkpoint
    from attnlm.loading.sources import resolve

    run = tmp_path / "run"
    r = cli("train", "--init-from", gpt2_folder, "--text", _text(tmp_path), "--out",
                run, "--max-iters", "3", "--lr", "1e-2", "--freeze-embeddings",
                "--freeze-layers", "1", "--no-progress")  # fmt: skip
    assert r.code == 0, r.err
    assert "frozen:" in r.out
    before = resolve(gpt2_folder).model.state_dict()
    after = load_checkpoint(run).model.state_dict()
    frozen = {k for k in before if k.startswith(("tok_emb", "pos_emb", "blocks.0.", "lm_head"))}
    assert frozen and any(k.startswith("blocks.0.") for k in frozen)
    for name, value in before.items():
        same = torch.equal(value, after[name])
        assert same == (name in frozen), name
    state = torch.load(run / "checkpoint" / "state.pt", weights_only=False)
    held = state["optimizer"]["state"]
    trainable = {id(p) for k, p in load_checkpoint(run).model.named_parameters()
                 if not k.startswith(("tok_emb", "pos_emb", "blocks.0."))}  # fmt: skip
    assert len(held) == len(trainable)  # no optimizer state for the frozen parameters


def test_freeze_layers_beyond_the_model(cli, tmp_path, gpt2_folder):
    r = cli("train", "--init-from", gpt2_folder, "--text", _text(tmp_path), "--out",
                tmp_path / "run", "--max-iters", "1", "--freeze-layers", "5")  # fmt: skip
    assert r.code == 2 and "freeze_layers" in r.err and "2 blocks" in r.err


def test_quantized_gguf_source(cli, tmp_path):
    """A Llama in a GGUF file with quantized matrices: dequantized to float32 (said in one
    line), the run's starting weights are exactly what the GGUF loader reads, its GGUF
    vocabulary encodes the text, and the run resumes and loads alone."""
    transformers = pytest.importorskip("transformers")
    from tests.gguf_support import write_llama

    from attnlm.loading.sources import resolve

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=128)  # fmt: skip
    path = tmp_path / "tiny.gguf"
    write_llama(path, transformers.LlamaForCausalLM(cfg), types=("Q8_0", "Q4_1", "F16"))
    run = tmp_path / "run"
    text = _text(tmp_path, "the cat sat on the mat. " * 40)
    r = cli("train", "--init-from", path, "--text", text, "--out", run,
                "--max-iters", "1", "--lr", "1e-9", "--set", "train.min_lr=0",
                "--no-progress")  # fmt: skip
    assert r.code == 0, r.err
    (note,) = [ln for ln in r.out.splitlines() if "dequantized" in ln]
    assert "Q8_0" in note and "Q4_1" in note and "float32" in note
    src = resolve(path, weights="f32")  # what the run started from
    ours = resolve(run)
    assert type(ours.tokenizer).__name__ == "GGUFTokenizer"
    np.testing.assert_array_equal(_train_ids(run)[:50], src.tokenizer.encode(text.read_text())[:50])
    x = torch.as_tensor([src.tokenizer.encode("the cat sat")])
    with torch.no_grad():
        a, b = src.model(ids=x).logits, ours.model(ids=x).logits
    torch.testing.assert_close(a, b, atol=1e-4, rtol=0)  # lr 1e-9: one negligible step
    r = cli("train", "--resume", run, "--max-iters", "2", "--no-progress")
    assert r.code == 0, r.err


def test_the_source_model_is_handed_over_not_copied(gpt2_folder):
    """The run trains the model read from the source (no second model, no copy of the
    weights): take_model gives it once, in training mode, with the fingerprinted weights."""
    transformers = pytest.importorskip("transformers")
    from attnlm.base.errors import ConfigError
    from attnlm.train.finetune import load_init_source, take_model, weights_fingerprint

    init = load_init_source(str(gpt2_folder))
    model = init.model
    taken = take_model(init)
    assert taken is model and taken.training and init.model is None
    assert init.record["fingerprint"] == weights_fingerprint(taken)
    hf = transformers.GPT2LMHeadModel.from_pretrained(gpt2_folder).eval()
    x = torch.randint(0, hf.config.vocab_size, (2, 20))
    with torch.no_grad():
        ours = taken.eval()(x).logits
        want = hf(x).logits
    assert torch.allclose(ours, want, atol=1e-4)
    with pytest.raises(ConfigError, match="handed over already"):
        take_model(init)
