"""Streaming text (issue 15): tokens are decoded incrementally, and the streamed pieces join to
exactly the text a one-shot decode of the ids gives, cut before the first stop string."""

from __future__ import annotations

import random

import pytest
import torch

from attnlm.generate.sampling import SamplingConfig
from attnlm.generate.text import _RowText, generate_text
from attnlm.tokenizers import BPETokenizer, CharTokenizer, WordTokenizer

TEXT = (
    "na\u00efve caf\u00e9 \u2014 \u4e2d\u6587\u5b57 \U0001f600\U0001f680 stra\u00dfe \u00fcber "
    "the cat sat on the mat. \u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac!\n"
) * 20


def reference(tok, ids, stops):
    """The row text by one-shot decodes: the first prefix whose text holds a stop string ends
    the row before it (stop strings checked in order); else the decode of every id."""
    for k in range(1, len(ids) + 1):
        text = tok.decode(ids[:k])
        for s in stops:
            i = text.find(s)
            if i >= 0:
                return text[:i], k
    return tok.decode(ids), len(ids)


def stream(tok, ids, stops, context=()):
    row = _RowText(tok, stops, context=context)
    pieces = []
    for t in ids:
        piece, stopped = row.push(t)
        pieces.append(piece)
        if stopped:
            break
    pieces.append(row.flush())
    return pieces, row.text(), len(row.ids)


@pytest.fixture(scope="module")
def bpe():
    return BPETokenizer.train(TEXT, 300)


STOPS = [(), ("\u4e2d\u6587",), ("\U0001f680", "\u00e9 "), ("cat sat", "."), ("\u03ba\u03ac!\n",)]


@pytest.mark.parametrize("stops", STOPS)
def test_bpe_stream_equals_one_shot_decode(bpe, stops):
    rng = random.Random(0)
    ids = bpe.encode(TEXT)
    cases = [ids, ids[3:], [rng.randrange(bpe.vocab_size) for _ in range(400)]]
    # byte tokens alone: every multi-byte character is split across tokens
    cases.append([bpe.encode_ordinary(ch)[0] for ch in "x"] + list(bpe.encode("\u4e2d")))
    raw = TEXT.encode("utf-8")
    cases.append([bpe.ranks[bytes([b])] for b in raw[:300]])
    for case in cases:
        pieces, text, k = stream(bpe, case, stops)
        want, k_ref = reference(bpe, case, stops)
        assert "".join(pieces) == text == want
        assert k == k_ref
        assert not any(s in "".join(pieces) for s in stops)


@pytest.mark.parametrize("stops", STOPS[:3])
def test_char_and_word_stream_equals_one_shot_decode(stops):
    for tok in (CharTokenizer.train(TEXT), WordTokenizer.train(TEXT)):
        ids = tok.encode(TEXT)[:300]
        pieces, text, k = stream(tok, ids, stops)
        want, k_ref = reference(tok, ids, stops)
        assert "".join(pieces) == text == want and k == k_ref


def test_word_level_text_reads_on_from_the_prompt():
    """A word tokenizer's new text starts with the space that separates it from the prompt;
    a WordPiece ``##`` piece glues to the prompt's last word; a stop string still cuts."""
    from attnlm.tokenizers import WordPieceTokenizer

    word = WordTokenizer.train("the cat sat on the mat . it is n't here .")
    prompt, new = word.encode("the cat"), word.encode("sat on the mat .")
    for stops, want in (((), " sat on the mat."), (("mat",), " sat on the ")):
        pieces, text, _ = stream(word, new, stops, context=prompt)
        assert "".join(pieces) == text == want
        assert word.decode(prompt) + text == "the cat" + want
    piece = WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "play", "##ing"])
    assert stream(piece, [6], (), context=[5])[1] == "ing"  # "play" + "ing" reads "playing"
    assert stream(piece, [6], ())[1] == piece.decode([6])  # without the prompt: alone


def test_stream_decodes_each_token_once(bpe):
    """Incremental: decoding is called with one id per token, never the whole row."""
    calls = []
    real = bpe.decode_bytes

    class Counting:
        def __init__(self):
            self.kind = "bpe"

        def decode_bytes(self, ids):
            ids = list(ids)
            calls.append(len(ids))
            return real(ids)

        def decode(self, ids):
            return real(list(ids)).decode("utf-8", errors="replace")

    ids = bpe.encode(TEXT)
    pieces, text, _ = stream(Counting(), ids, ())
    assert text == bpe.decode(ids)
    assert max(calls) == 1 and len(calls) == len(ids)


def test_generate_stream_equals_batch_text(bpe):
    """End to end: the streamed pieces of a sampled row equal the non-streamed text."""
    from attnlm.models import registry

    torch.manual_seed(0)
    table = {"type": "gpt", "vocab_size": bpe.vocab_size, "block_size": 64, "n_layer": 1}
    model, _, _ = registry.build({**table, "n_head": 2, "n_embd": 16})
    model.eval()
    for stop in ((), ("\u00e9",), ("a", "\u4e2d")):
        sampling = SamplingConfig(max_new_tokens=120, temperature=1.0, seed=3, stop=stop)
        batch = generate_text(model, bpe, ["caf"], sampling)[0]
        pieces = []
        streamed = generate_text(
            model, bpe, ["caf"], sampling, on_text=lambda r, p, out=pieces: out.append(p)
        )
        assert "".join(pieces) == streamed[0] == batch
