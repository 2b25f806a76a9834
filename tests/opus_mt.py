"""A tiny OPUS-MT-style folder built offline, as the Helsinki-NLP/opus-mt-* folders are laid out:
``config.json``, ``generation_config.json``, ``model.safetensors`` (a random ``MarianMTModel``
written by ``save_pretrained``), ``source.spm`` and ``target.spm`` (unigram SentencePiece
models trained here by ``sentencepiece.SentencePieceTrainer`` on the English and French sides
of ``fixtures/pairs/tatoeba-eng-fra-500.tsv``, CC-BY 2.0 FR, see its README), ``vocab.json``
(``</s>`` 0, ``<unk>`` 1, language codes, the pieces of both models, ``<pad>`` last, as in
OPUS-MT) and ``tokenizer_config.json``; no ``tokenizer.json``.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

from tests.support import FIXTURES, randomize_marian

TATOEBA = FIXTURES / "pairs" / "tatoeba-eng-fra-500.tsv"
CODES = (">>fra<<", ">>deu<<")  # a multilingual model's target-language tokens


def tatoeba_pairs() -> list[tuple[str, str]]:
    rows = TATOEBA.read_text(encoding="utf-8").splitlines()
    return [tuple(r.split("\t")[:2]) for r in rows]


def _train_spm(lines: list[str], vocab_size: int) -> bytes:
    import sentencepiece

    buf = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=buf, vocab_size=vocab_size,
        model_type="unigram", character_coverage=0.98, minloglevel=2, num_threads=1,
    )  # fmt: skip
    return buf.getvalue()


def build_opus_folder(folder: Path, *, model: bool = True, seed: int = 0) -> Path:
    """Write the folder (see the module docstring); ``model=False``: the tokenizer files only.
    The model's weights are random (std 0.5, so greedy decoding gives varied tokens)."""
    import sentencepiece

    folder.mkdir(parents=True, exist_ok=True)
    pairs = tatoeba_pairs()
    models = {"source.spm": _train_spm([s for s, _ in pairs], 150),
              "target.spm": _train_spm([t for _, t in pairs], 170)}  # fmt: skip
    vocab = {"</s>": 0, "<unk>": 1}
    for code in CODES:
        vocab[code] = len(vocab)
    for name, data in models.items():
        (folder / name).write_bytes(data)
        sp = sentencepiece.SentencePieceProcessor(model_proto=data)
        for i in range(sp.get_piece_size()):
            if not (sp.is_control(i) or sp.is_unknown(i)):
                vocab.setdefault(sp.id_to_piece(i), len(vocab))
    vocab["<pad>"] = len(vocab)
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    config = {"source_lang": "en", "target_lang": "fr", "separate_vocabs": False}
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    if model:
        _write_model(folder, len(vocab), vocab["<pad>"], seed)
    return folder


def _write_model(folder: Path, vocab: int, pad: int, seed: int) -> None:
    import torch
    from transformers import GenerationConfig, MarianConfig, MarianMTModel

    torch.manual_seed(seed)
    cfg = MarianConfig(
        vocab_size=vocab, d_model=16, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
        decoder_ffn_dim=32, activation_function="swish", max_position_embeddings=64,
        scale_embedding=True, pad_token_id=pad, decoder_start_token_id=pad, eos_token_id=0,
        forced_eos_token_id=0, dropout=0.0, share_encoder_decoder_embeddings=True,
    )  # fmt: skip
    model = MarianMTModel(cfg).eval()
    randomize_marian(model)
    model.generation_config = GenerationConfig(
        decoder_start_token_id=pad, pad_token_id=pad, eos_token_id=0, forced_eos_token_id=0,
        bad_words_ids=[[pad]], max_length=64, num_beams=1,
    )  # fmt: skip
    model.save_pretrained(folder)
