"""An OPUS-MT folder as published (``source.spm``, ``target.spm``, ``vocab.json``, no
``tokenizer.json``; built offline by ``tests/opus_mt.py``) wherever a Marian folder goes:
``translate --model DIR`` gives ``transformers``' greedy ``generate`` output (ids and text),
``attention --model DIR`` draws it, ``eval --model DIR --pairs FILE`` gives its loss,
``train --init-from DIR --pairs FILE`` starts from its loss
(``MarianMTModel``'s on the same pair) and the run reloads, resumes, translates and evaluates
without the folder; with ``--lora 4`` only adapters train, only adapters are stored, and the run
reloads (translate, eval)."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from tests.support import loss_curve

pytest.importorskip("sentencepiece", reason="needs sentencepiece")
transformers = pytest.importorskip("transformers", reason="needs transformers (the reference)")

from tests.opus_mt import build_opus_folder, tatoeba_pairs  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

PAIR = ("I see.", "Je vois.")  # every batch of the fine-tuning runs holds this pair
SENTENCES = ["Go.", "I see.", ">>fra<< Help me!", "Who is Tom?", "We won. Zürich"]
QUICK = ["--batch-size", "4", "--eval-interval", "2", "--eval-iters", "1", "--no-progress"]


@pytest.fixture(scope="module")
def opus(tmp_path_factory):
    folder = build_opus_folder(tmp_path_factory.mktemp("opus") / "opus-mt-en-fr", seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Recommended: pip install sacremoses" (unused)
        tok = transformers.MarianTokenizer.from_pretrained(str(folder))
    model = transformers.MarianMTModel.from_pretrained(str(folder)).eval()
    return folder, tok, model


def _generate(tok, model, text, n):
    ids = torch.tensor([tok(text)["input_ids"]])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=n, max_length=None, num_beams=1, do_sample=False)[
            0
        ].tolist()
    return out, tok.decode(out, skip_special_tokens=True)


def _hf_loss(tok, model, pair=PAIR):
    """``MarianMTModel``'s mean cross-entropy of ``pair`` (labels: the target + ``</s>``)."""
    src = torch.tensor([tok(pair[0])["input_ids"]])
    labels = torch.tensor([tok(text_target=pair[1])["input_ids"]])
    with torch.no_grad():
        return model(input_ids=src, labels=labels).loss.item()


def _write(path, rows):
    path.write_text("".join(f"{s}\t{t}\n" for s, t in rows), encoding="utf-8")
    return path


def _finetune(cli, folder, tmp_path, *extra, steps=2):
    rows = tatoeba_pairs()
    one = _write(tmp_path / "one.tsv", [PAIR] * 4)
    valid = _write(tmp_path / "valid.tsv", rows[100:106])
    test = _write(tmp_path / "test.tsv", rows[200:204])
    run = tmp_path / "ft"
    r = cli("train", "--init-from", folder, "--pairs", one, "--valid-pairs", valid,
            "--test-pairs", test, "--out", run, "--max-iters", steps, *QUICK, *extra)  # fmt: skip
    assert r.code == 0, r.err
    assert "its tokenizers" in r.out and "encode the pairs" in r.out
    return run


def test_translate_an_opus_folder_as_generate_does(cli, opus, tmp_path):
    from attnlm.data.pairs import PairTokenizers
    from attnlm.generate.translate import translate_ids
    from attnlm.loading.sources import resolve

    folder, tok, model = opus
    ours, our_tok, info = resolve(folder)
    assert info.kind == "huggingface" and type(our_tok).__name__ == "MarianSPMTokenizer"
    pairs = PairTokenizers.from_tokenizers(our_tok)
    want = [_generate(tok, model, s, 10) for s in SENTENCES]
    got = translate_ids(ours, [pairs.encode_source(s) for s in SENTENCES], max_new_tokens=10)
    assert got == [ids for ids, _ in want]
    assert len({tuple(ids) for ids in got}) > 1  # the sentences are told apart
    r = cli("translate", "--model", folder, "--max-new-tokens", "10", *SENTENCES)
    assert r.code == 0, r.err
    assert r.out.splitlines() == [text for _, text in want]
    page = tmp_path / "attention.html"
    r = cli("attention", "--model", folder, SENTENCES[2], "--html", page)
    assert r.code == 0, r.err
    assert "fra" in page.read_text(encoding="utf-8")  # the language code's token label


def test_eval_an_opus_folder_on_pairs(cli, opus, tmp_path):
    """``eval --model DIR --pairs FILE``: the loss per target token is ``MarianMTModel``'s over
    the same pairs (the target and ``</s>``); without ``--pairs`` one line says to give it."""
    folder, tok, model = opus
    rows = tatoeba_pairs()[300:312]
    pairs = _write(tmp_path / "pairs.tsv", rows)
    r = cli("eval", "--model", folder, "--pairs", pairs, "--json")
    assert r.code == 0, r.err
    scores = json.loads(r.out)
    total = count = 0.0
    for source, target in rows:
        n = len(tok(text_target=target)["input_ids"])
        total += _hf_loss(tok, model, (source, target)) * n
        count += n
    assert scores["pairs"] == len(rows) and scores["loss"] == pytest.approx(total / count, abs=1e-4)
    r = cli("eval", "--model", folder)
    assert r.code == 2 and "--pairs FILE" in r.err and len(r.err.strip().splitlines()) == 1


def test_init_from_an_opus_folder(cli, opus, tmp_path):
    from attnlm.loading.checkpoint import load_checkpoint

    folder, tok, model = opus
    run = _finetune(cli, folder, tmp_path)
    assert loss_curve(run)[1] == pytest.approx(_hf_loss(tok, model), abs=1e-4)
    ck = load_checkpoint(run)
    pt = ck.pair_tokenizers
    assert (pt.target_ids.pad, pt.target_ids.bos, pt.target_ids.eos) == (
        tok.pad_token_id, tok.pad_token_id, tok.eos_token_id)  # fmt: skip
    for text in [*SENTENCES, "Je vois.", "Ça va ?"]:
        assert pt.encode_source(text) == tok(text)["input_ids"]
        assert pt.tokens(text, "target") + [tok.eos_token_id] == tok(text_target=text)["input_ids"]
    config = json.loads((ck.path / "config.json").read_text(encoding="utf-8"))
    assert config["init_from"]["kind"] == "huggingface"
    moved = folder.with_name("moved-away")  # the run keeps what it needs: the spm models too
    folder.rename(moved)
    try:
        r = cli("train", "--resume", run, "--max-iters", "3", "--no-progress")
        assert r.code == 0, r.err
        assert "done: 3 steps" in r.out
        r = cli("translate", "--model", run, "--max-new-tokens", "6", "Go.", "I see.")
        assert r.code == 0, r.err
        assert len(r.out.splitlines()) == 2
        r = cli("eval", "--checkpoint", run, "--json")
        assert r.code == 0, r.err
        assert 0 <= json.loads(r.out)["bleu"] <= 100
    finally:
        moved.rename(folder)


def test_lora_on_a_pairs_run(cli, opus, tmp_path):
    """``--lora 4`` on a translation model: the first loss is the base's (B starts at zero),
    the optimizer trains the adapters alone (the base's tensors are bit-identical afterwards),
    the checkpoint stores the adapters alone, and ``--model RUN`` reloads (base + adapters)."""
    from safetensors.torch import load_file

    from attnlm.loading import sources
    from attnlm.loading.checkpoint import CHECKPOINT_DIR

    folder, tok, model = opus
    lora = ["--lora", "4", "--lr", "0.05", "--set", "train.warmup_iters=0"]
    run = _finetune(cli, folder, tmp_path, *lora, steps=3)
    assert loss_curve(run)[1] == pytest.approx(_hf_loss(tok, model), abs=1e-4)
    stored = load_file(str(run / CHECKPOINT_DIR / "model.safetensors"))
    assert stored and all(".lora_" in name for name in stored), sorted(stored)[:5]
    config = json.loads((run / CHECKPOINT_DIR / "config.json").read_text(encoding="utf-8"))
    assert config["lora"]["r"] == 4 and config["lora"]["base"] == str(folder.resolve())

    base, _, _ = sources.resolve(folder)
    adapted, _, info = sources.load_lora_run(run, merge=False)
    assert isinstance(info.checkpoint.pair_tokenizers.source.encode("Go."), list)
    base_state = base.state_dict()
    trained = 0
    for name, value in adapted.state_dict().items():
        if ".lora_" in name:
            assert name in stored and torch.equal(value, stored[name]), name
            trained += ".lora_B" in name and bool(value.abs().max() > 0)
        else:  # the base's tensors (the wrapped linears' weights under .base)
            assert torch.equal(value, base_state[name.replace(".base.", ".")]), name
    assert trained  # the adapters did train
    merged, _, _ = sources.resolve(run)
    src = torch.tensor([tok("I see.")["input_ids"]])
    tgt = torch.tensor([[tok.pad_token_id, *tok(text_target="Je vois.")["input_ids"][:-1]]])
    with torch.no_grad():
        a = merged(src, tgt, src_mask=torch.ones_like(src, dtype=torch.bool)).logits
        b = base(src, tgt, src_mask=torch.ones_like(src, dtype=torch.bool)).logits
        c = adapted(src, tgt, src_mask=torch.ones_like(src, dtype=torch.bool)).logits
    assert (a - b).abs().max() > 1e-4 and (a - c).abs().max() < 1e-5
    r = cli("translate", "--model", run, "--max-new-tokens", "6", "Go.")
    assert r.code == 0, r.err
    r = cli("eval", "--model", run, "--json")
    assert r.code == 0, r.err
    assert json.loads(r.out)["pairs"] == 4


def test_a_damaged_spm_file_is_one_line_on_the_command_line(cli, opus, tmp_path):
    import shutil

    folder, _, _ = opus
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    (bad / "target.spm").write_bytes((folder / "target.spm").read_bytes()[:300])
    pairs = _write(tmp_path / "pairs.tsv", [PAIR] * 4)
    train = ["train", "--init-from", bad, "--pairs", pairs, "--out", tmp_path / "run"]
    for argv in (["translate", "--model", bad, "Go."], train):
        r = cli(*argv)
        assert r.code == 2 and len(r.err.strip().splitlines()) == 1, r.err
        assert "target.spm" in r.err and "SentencePiece" in r.err
    assert not (tmp_path / "run").exists()
