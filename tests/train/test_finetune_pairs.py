"""``attnlm train --init-from SPEC --pairs FILE``: fine-tuning a translation model (an attnlm
transformer or rnn-seq2seq run, a Marian-layout Hugging Face folder written by ``save_hf``).
The pairs are encoded with the source model's own tokenizers, the first step's loss is the
source model's loss on that batch (computed here by hand from its logits), and the run
resumes and translates; a text model with ``--pairs`` and a translation model with ``--text``
are refused in one line."""

from __future__ import annotations

import json

import pytest
import torch
from tests.support import loss_curve

pytestmark = pytest.mark.usefixtures("one_thread")

PAIR = ("two three one", "drei zwei eins")  # the one pair every fine-tuning batch holds
WORDS = {"one": "eins", "two": "zwei", "three": "drei", "four": "vier"}
FAMILIES = {  # a tiny translation model of each family, no dropout, no label smoothing
    "transformer": ["--preset", "dates-transformer", "--set", "model.d_model=16",
                    "--set", "model.n_head=2", "--set", "model.d_ff=32",
                    "--set", "model.n_encoder_layers=1", "--set", "model.n_decoder_layers=1",
                    "--set", "model.dropout=0", "--set", "model.label_smoothing=0"],
    "rnn-seq2seq": ["--preset", "dates-rnn", "--set", "model.d_emb=8",
                    "--set", "model.d_hidden=16"],
}  # fmt: skip
QUICK = ["--batch-size", "4", "--eval-interval", "2", "--eval-iters", "1", "--no-progress"]


def _write(path, pairs):
    path.write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    return path


def _pairs(tmp_path):
    """A pairs file for the source run, and a one-pair training file (every batch is that
    pair) with separate validation and test files for the fine-tuning run."""
    import random

    rng = random.Random(0)
    rows = []
    for _ in range(60):
        words = [rng.choice(list(WORDS)) for _ in range(rng.randint(1, 3))]
        rows.append((" ".join(words), " ".join(WORDS[w] for w in reversed(words))))
    return (
        _write(tmp_path / "pairs.tsv", rows),
        _write(tmp_path / "one.tsv", [PAIR] * 4),
        _write(tmp_path / "valid.tsv", rows[:5]),
        _write(tmp_path / "test.tsv", rows[5:8]),
    )


def _reference_loss(model, tokenizers, pair=PAIR):
    """Mean cross-entropy of ``pair`` under ``model`` with teacher forcing, from its logits:
    the source ends in ``</s>``, the decoder reads ``<s> + target`` and predicts
    ``target + </s>``."""
    src_ids = tokenizers.encode_source(pair[0])
    tgt = tokenizers.tokens(pair[1], "target")
    ids = tokenizers.target_ids
    src = torch.tensor([src_ids])
    tgt_in = torch.tensor([[ids.bos, *tgt]])
    want = torch.tensor([*tgt, ids.eos])
    mask = torch.ones_like(src, dtype=torch.bool)
    model.eval()
    with torch.no_grad():
        if type(model).__name__ == "RNNSeq2Seq":
            logits = model(src, mask, tgt_in).logits
        else:
            logits = model(src, tgt_in, src_mask=mask).logits
    return torch.nn.functional.cross_entropy(logits[0], want).item()


def _finetune(cli, spec, tmp_path, files, out="ft", steps=1):
    _, one, valid, test = files
    return cli("train", "--init-from", spec, "--pairs", one, "--valid-pairs", valid,
               "--test-pairs", test, "--out", tmp_path / out, "--max-iters", steps,
               *QUICK)  # fmt: skip


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_init_from_a_translation_run(cli, tmp_path, family):
    from attnlm.loading.checkpoint import load_checkpoint

    files = _pairs(tmp_path)
    source = tmp_path / "source"
    r = cli("train", *FAMILIES[family], "--pairs", files[0], "--out", source,
            "--max-iters", "3", *QUICK)  # fmt: skip
    assert r.code == 0, r.err
    src = load_checkpoint(source)
    ref = _reference_loss(src.model, src.pair_tokenizers)
    r = _finetune(cli, source, tmp_path, files)
    assert r.code == 0, r.err
    assert "its tokenizers" in r.out and "encode the pairs" in r.out
    run = tmp_path / "ft"
    assert loss_curve(run)[1] == pytest.approx(ref, abs=1e-4)  # the source's weights
    ck = load_checkpoint(run)
    assert ck.family.type == family and ck.model_config == src.model_config
    # the source's tokenizers, not new ones: the same ids and the same special ids
    for side in ("source", "target"):
        for text in ("four two", "zwei vier"):
            assert ck.pair_tokenizers.encode(text, side) == src.pair_tokenizers.encode(text, side)
    assert ck.pair_tokenizers.target_ids == src.pair_tokenizers.target_ids
    config = json.loads((ck.path / "config.json").read_text())
    assert config["init_from"]["kind"] == "run"
    # an ordinary pairs run afterwards: resume, translate, eval
    r = cli("train", "--resume", run, "--max-iters", "3", "--no-progress")
    assert r.code == 0, r.err
    assert "resuming" in r.out and "done: 3 steps" in r.out
    r = cli("translate", "--checkpoint", run, "two one", "four")
    assert r.code == 0, r.err
    assert len(r.out.splitlines()) == 2
    r = cli("eval", "--checkpoint", run, "--json")
    assert r.code == 0, r.err
    assert 0 <= json.loads(r.out)["bleu"] <= 100


def test_separate_source_and_target_tokenizers_are_kept(cli, tmp_path):
    from attnlm.loading.checkpoint import load_checkpoint

    files = _pairs(tmp_path)
    source = tmp_path / "source"
    r = cli("train", *FAMILIES["transformer"], "--set", "train.shared_vocab=false",
            "--set", "model.share_embeddings=false", "--pairs", files[0], "--out", source,
            "--max-iters", "2", *QUICK)  # fmt: skip
    assert r.code == 0, r.err
    src = load_checkpoint(source)
    assert not src.pair_tokenizers.shared
    r = _finetune(cli, source, tmp_path, files)
    assert r.code == 0, r.err
    ck = load_checkpoint(tmp_path / "ft")
    assert not ck.pair_tokenizers.shared
    assert ck.pair_tokenizers.source_ids == src.pair_tokenizers.source_ids
    assert ck.pair_tokenizers.encode("vier", "target") == src.pair_tokenizers.encode(
        "vier", "target"
    )
    ref = _reference_loss(src.model, src.pair_tokenizers)
    assert loss_curve(tmp_path / "ft")[1] == pytest.approx(ref, abs=1e-4)


def _marian_folder(folder, text):
    """A random Marian-layout encoder-decoder written by ``save_hf``, with a BPE tokenizer
    whose special tokens ``<pad>`` (also the decoder start, as in Marian) and ``</s>`` are the
    model's ids."""
    from attnlm.models.hf import save_hf
    from attnlm.models.transformer import Transformer, TransformerConfig
    from attnlm.tokenizers import train_tokenizer

    tok = train_tokenizer("bpe", text, 300, special_tokens=["<pad>", "</s>"])
    pad, eos = tok.special_tokens["<pad>"], tok.special_tokens["</s>"]
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=tok.vocab_size, d_model=16, n_head=2,
                            n_encoder_layers=1, n_decoder_layers=1, d_ff=32,
                            final_logits_bias=True, positions_layout="split", dropout=0.0,
                            pad_id=pad, bos_id=pad, eos_id=eos)  # fmt: skip
    save_hf(Transformer(cfg), folder)
    tok.save(folder / "tokenizer.json")
    return folder


def test_init_from_a_marian_folder(cli, tmp_path):
    from attnlm.loading.checkpoint import load_checkpoint
    from attnlm.loading.sources import resolve

    files = _pairs(tmp_path)
    text = files[0].read_text(encoding="utf-8").replace("\t", "\n")
    folder = _marian_folder(tmp_path / "marian", text * 4)
    model, tok, _ = resolve(folder)
    r = _finetune(cli, folder, tmp_path, files, steps=2)
    assert r.code == 0, r.err
    ck = load_checkpoint(tmp_path / "ft")
    pt = ck.pair_tokenizers
    assert pt.shared
    ids = pt.target_ids  # the model's special ids: <pad> starts the decoder, </s> ends
    assert (ids.pad, ids.bos, ids.eos) == (tok.special_tokens["<pad>"],) * 2 + (
        tok.special_tokens["</s>"],
    )
    assert pt.encode_source("two one") == [*tok.encode("two one"), ids.eos]
    assert loss_curve(tmp_path / "ft")[1] == pytest.approx(_reference_loss(model, pt), abs=1e-4)
    r = cli("translate", "--checkpoint", tmp_path / "ft", "two one")
    assert r.code == 0, r.err


def test_a_text_model_with_pairs_and_a_translation_model_with_text_are_refused(cli, tmp_path):
    files = _pairs(tmp_path)
    text = tmp_path / "text.txt"
    text.write_text("one two three four\n" * 40, encoding="utf-8")
    lm = tmp_path / "lm"
    r = cli("train", "--preset", "tiny-test", "--text", text, "--out", lm, "--max-iters", "1",
            "--no-progress")  # fmt: skip
    assert r.code == 0, r.err
    r = cli("train", "--init-from", lm, "--pairs", files[0], "--out", tmp_path / "a",
            "--max-iters", "1", "--no-progress")  # fmt: skip
    assert r.code == 2
    assert len(r.err.strip().splitlines()) == 1 and "give --text FILE, not --pairs" in r.err
    assert not (tmp_path / "a").exists()
    source = tmp_path / "source"
    r = cli("train", *FAMILIES["transformer"], "--pairs", files[0], "--out", source,
            "--max-iters", "1", *QUICK)  # fmt: skip
    assert r.code == 0, r.err
    r = cli("train", "--init-from", source, "--text", text, "--out", tmp_path / "b",
            "--max-iters", "1", "--no-progress")  # fmt: skip
    assert r.code == 2
    assert len(r.err.strip().splitlines()) == 1 and "give --pairs FILE, not --text" in r.err
    assert not (tmp_path / "b").exists()
