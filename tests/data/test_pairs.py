"""Parallel data: reading pairs files (real Tatoeba slice and every malformed case), the split,
the length filter, pair tokenizers and encoding."""

import os
import subprocess
import sys
from collections import Counter

import pytest

from attnlm.base.errors import ConfigError, InputError
from attnlm.cli import main
from attnlm.data.pairs import (
    Pair,
    PairTokenizerConfig,
    PairTokenizers,
    encode_pairs,
    filter_pairs,
    group_references,
    parse_pairs,
    read_pairs,
    register_pair_tokenizer_kind,
    split_pairs,
    train_pair_tokenizers,
    write_pairs,
)
from attnlm.data.tasks import load_pairs
from attnlm.tokenizers import BPETokenizer, CharTokenizer, WordTokenizer
from support import FIXTURES, SRC

FIX = FIXTURES / "pairs"
TATOEBA = FIX / "tatoeba-eng-fra-500.tsv"
BAD = FIX / "malformed"


# --------------------------------------------------------------------------- the real sample


def test_tatoeba_slice_reads_every_line():
    pairs, report = read_pairs(TATOEBA)
    # independent reading: plain split on tabs, first two columns
    raw = TATOEBA.read_text(encoding="utf-8").splitlines()
    expected = [Pair(*line.split("\t")[:2]) for line in raw]
    assert pairs == expected
    assert len(pairs) == report.kept == report.lines == 500
    assert report.skipped == {} and report.header_line is None
    assert report.extra_columns == 500  # the attribution column
    assert pairs[0] == ("Go.", "Va !")
    assert report.warning() is None


def test_tatoeba_multiple_references_group_by_source():
    pairs, _ = read_pairs(TATOEBA)
    sources, refs = group_references(pairs)
    assert len(sources) == len({p.source for p in pairs})
    assert sources[0] == "Go." and refs[0] == ["Va !", "Marche.", "Bouge !"]
    assert sum(map(len, refs)) == len(pairs)


def test_reverse_swaps_columns():
    pairs, _ = read_pairs(TATOEBA, reverse=True)
    assert pairs[0] == ("Va !", "Go.")


# --------------------------------------------------------------------------- malformed cases


@pytest.mark.parametrize(
    "name, pairs, skipped, first",
    [
        ("crlf.tsv", [("Go.", "Va !"), ("Hi.", "Salut !"), ("Run!", "Cours !")], {}, {}),
        ("header.tsv", [("Go.", "Va !"), ("Hi.", "Salut !")], {}, {}),
        ("blank.tsv", [("Go.", "Va !"), ("Hi.", "Salut !")], {"blank": 4}, {"blank": [1, 3, 4, 6]}),
        (
            "empty_side.tsv",
            [("Go.", "Va !"), ("Who?", "Qui ?")],
            {"empty_source": 1, "empty_target": 1},
            {"empty_source": [2], "empty_target": [3]},
        ),
        (
            "no_tab.tsv",
            [("Go.", "Va !"), ("Run!", "Cours !")],
            {"no_tab": 2},
            {"no_tab": [2, 4]},
        ),
        ("extra_columns.tsv", [("Go.", "Va !"), ("Hi.", "Salut !")], {}, {}),
        ("bom.tsv", [("Go.", "Va !"), ("Hi.", "Salut !")], {}, {}),
    ],
)
def test_malformed_lenient(name, pairs, skipped, first):
    got, report = read_pairs(BAD / name)
    assert got == [Pair(*p) for p in pairs]
    assert report.skipped == skipped
    assert report.first_lines == first
    assert report.kept == len(pairs)
    assert report.kept + report.n_skipped + (report.header_line is not None) == report.lines


def test_malformed_report_details():
    assert read_pairs(BAD / "crlf.tsv")[1].crlf == 3
    assert read_pairs(BAD / "header.tsv")[1].header_line == 1
    assert read_pairs(BAD / "bom.tsv")[1].bom
    assert read_pairs(BAD / "extra_columns.tsv")[1].extra_columns == 2
    rep = read_pairs(BAD / "no_tab.tsv")[1]
    want = f"{BAD / 'no_tab.tsv'}: skipped 2 malformed line(s): 2 no_tab (lines 2, 4)"
    assert rep.warning() == want
    assert read_pairs(BAD / "blank.tsv")[1].warning() is None  # blank lines are harmless


def test_mixed_file():
    pairs, r = read_pairs(BAD / "mixed.tsv")
    assert pairs == [("Go.", "Va !"), ("Who?", "Qui ?")]
    assert r.lines == 8 and r.kept == 2 and r.header_line == 1 and r.bom
    assert r.skipped == {"blank": 1, "no_tab": 2, "empty_source": 1, "empty_target": 1}
    assert r.first_lines == {
        "blank": [3],
        "no_tab": [4, 8],
        "empty_source": [5],
        "empty_target": [6],
    }
    assert r.extra_columns == 1 and r.crlf == 7
    text = r.format()
    assert "2 kept of 8 lines" in text and "header on line 1" in text


@pytest.mark.parametrize(
    "name, message",
    [
        ("no_tab.tsv", r"no_tab\.tsv:2: no tab between source and target"),
        ("empty_side.tsv", r"empty_side\.tsv:2: empty source sentence"),
        ("mixed.tsv", r"mixed\.tsv:4: no tab"),
    ],
)
def test_malformed_strict(name, message):
    with pytest.raises(InputError, match=message):
        read_pairs(BAD / name, strict=True)


def test_strict_accepts_the_harmless_cases():
    for name in ("crlf.tsv", "header.tsv", "blank.tsv", "extra_columns.tsv", "bom.tsv"):
        assert read_pairs(BAD / name, strict=True) == read_pairs(BAD / name)
    assert parse_pairs("a\tb\n\tc\n", name="x")[0] == [("a", "b")]
    with pytest.raises(InputError, match=r"x:3: empty target sentence"):
        parse_pairs("a\tb\nc\td\ne\t \n", name="x", strict=True)


@pytest.mark.parametrize(
    "name, message",
    [
        ("latin1.tsv", r"latin1\.tsv:2: not valid UTF-8 \(bad byte 0xc7 at byte 11 of the line\)"),
        ("utf16.tsv", r"utf16\.tsv: looks like UTF-16"),
    ],
)
def test_not_utf8_is_one_line_error(name, message):
    for strict in (False, True):
        with pytest.raises(InputError, match=message):
            read_pairs(BAD / name, strict=strict)


def test_old_mac_line_ends():
    """A lone CR ends a line too (otherwise the whole file would be one line of columns)."""
    pairs, report = parse_pairs("Go.\tVa !\rHi.\tSalut !\r\rRun!\tCours !\r")
    assert pairs == [("Go.", "Va !"), ("Hi.", "Salut !"), ("Run!", "Cours !")]
    assert report.lines == 4 and report.skipped == {"blank": 1} and report.crlf == 4
    assert report.extra_columns == 0


def test_header_modes():
    text = "source\ttarget\nGo.\tVa !\n"
    assert parse_pairs(text)[0] == [("Go.", "Va !")]
    assert parse_pairs(text, header=False)[0] == [("source", "target"), ("Go.", "Va !")]
    assert parse_pairs("Go.\tVa !\nHi.\tSalut !\n", header=True)[0] == [("Hi.", "Salut !")]
    # a real first pair is not mistaken for a header
    assert parse_pairs("Yes.\tOui.\n")[0] == [("Yes.", "Oui.")]
    with pytest.raises(ConfigError):
        parse_pairs(text, header="maybe")


def test_missing_empty_and_folder(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        read_pairs(tmp_path / "nope.tsv")
    with pytest.raises(InputError, match="is a folder"):
        read_pairs(tmp_path)
    (tmp_path / "e.tsv").write_text("\n\n")
    with pytest.raises(InputError, match=r"no sentence pairs found \(2 blank"):
        read_pairs(tmp_path / "e.tsv")
    (tmp_path / "t.tsv").write_text("no tabs here\n")
    with pytest.raises(InputError, match=r"no sentence pairs found \(1 no_tab \(line 1\)\)"):
        read_pairs(tmp_path / "t.tsv")


@pytest.mark.parametrize(
    "name, message",
    [
        ("no_tab.tsv", ":2: no tab"),
        ("latin1.tsv", ":2: not valid UTF-8"),
        ("empty_side.tsv", ":2: empty source"),
    ],
)
def test_cli_errors_are_one_line(name, message, capsys):
    assert main(["data", "pairs", "--pairs", str(BAD / name), "--strict"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnlm: error: ") and message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_cli_pairs_summary(capsys):
    assert main(["data", "pairs", "--pairs", str(BAD / "mixed.tsv"), "--valid", "0"]) == 0
    out = capsys.readouterr().out
    assert "2 kept of 8 lines" in out and "2 no_tab (lines 4, 8)" in out
    assert main(["data", "pairs", "--pairs", str(TATOEBA), "--examples", "2"]) == 0
    out = capsys.readouterr().out
    assert "500 kept of 500 lines" in out and "Go.  ->  Va !" in out


def test_write_pairs_round_trip(tmp_path):
    rows = [("a b", "c d", "extra"), ("e", "f", "x")]
    assert write_pairs(tmp_path / "p.tsv", rows) == 2
    assert read_pairs(tmp_path / "p.tsv")[0] == [("a b", "c d"), ("e", "f")]
    with pytest.raises(InputError, match="tab or line break"):
        write_pairs(tmp_path / "q.tsv", [("a\tb", "c")])


# --------------------------------------------------------------------------- split


def _pairs():
    return read_pairs(TATOEBA)[0]


def test_split_partitions_and_groups_by_source():
    pairs = _pairs()
    s = split_pairs(pairs, valid=0.1, test=0.1, seed=0)
    assert Counter(s.train + s.valid + s.test) == Counter(pairs)
    biggest = max(Counter(p.source for p in pairs).values())
    for part in (s.valid, s.test):
        assert 50 <= len(part) < 50 + biggest  # at least the share, less than one group over
    src = {name: {p.source for p in getattr(s, name)} for name in ("train", "valid", "test")}
    assert not (src["train"] & src["valid"] or src["train"] & src["test"])
    assert not src["valid"] & src["test"]
    # each split keeps file order
    pos = {id(p): i for i, p in enumerate(pairs)}
    for part in (s.train, s.valid, s.test):
        idx = [pos[id(p)] for p in part]
        assert idx == sorted(idx)


def test_split_is_deterministic_and_seeded():
    pairs = _pairs()
    a = split_pairs(pairs, seed=1)
    assert a == split_pairs(list(pairs), seed=1)
    assert a.test != split_pairs(pairs, seed=2).test
    # independent of input order: the same pairs land in the same split
    shuffled = split_pairs(pairs[::-1], seed=1)
    assert Counter(shuffled.test) == Counter(a.test)
    # by_source=False still keeps identical pairs together and partitions everything
    b = split_pairs(pairs, by_source=False)
    assert Counter(b.train + b.valid + b.test) == Counter(pairs)


def test_split_is_the_same_in_another_process():
    """Not ``hash()``-based: a fresh interpreter with another hash seed gives the same split."""
    code = (
        "from attnlm.data.pairs import read_pairs, split_pairs;"
        f"p = read_pairs({str(TATOEBA)!r})[0];"
        "s = split_pairs(p, seed=3);"
        "print(repr([x for x in s.test]))"
    )
    env = dict(os.environ, PYTHONHASHSEED="12345")
    src = str(SRC)
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == repr(split_pairs(_pairs(), seed=3).test)


def test_split_errors():
    with pytest.raises(ConfigError, match="valid"):
        split_pairs(_pairs(), valid=1.0)
    with pytest.raises(ConfigError, match="below 1"):
        split_pairs(_pairs(), valid=0.5, test=0.5)
    with pytest.raises(InputError, match="too few pairs"):
        split_pairs([Pair("a", "b")], test=0.5)
    tiny = split_pairs([Pair("a", "b"), Pair("c", "d"), Pair("e", "f")], valid=0.0, test=0.2)
    assert len(tiny.test) == 1 and len(tiny.train) == 2 and tiny.valid == []


# --------------------------------------------------------------------------- length filter


def test_filter_by_chars_and_tokens():
    pairs = _pairs()
    kept, dropped = filter_pairs(pairs, max_chars=10)
    assert kept == [p for p in pairs if len(p.source) <= 10 and len(p.target) <= 10]
    assert dropped == len(pairs) - len(kept) > 0
    tok = train_pair_tokenizers(pairs, PairTokenizerConfig(kind="char"))
    kept_t, _ = filter_pairs(pairs, max_tokens=10, tokenizers=tok)
    assert kept_t == kept  # one token per character
    bpe = train_pair_tokenizers(pairs, PairTokenizerConfig(kind="bpe", vocab_size=400))
    kept_b, _ = filter_pairs(pairs, max_tokens=3, tokenizers=bpe)
    assert kept_b and all(
        len(bpe.source.encode(p.source)) <= 3 and len(bpe.target.encode(p.target)) <= 3
        for p in kept_b
    )
    assert len(kept_b) < len(pairs)
    with pytest.raises(ConfigError, match="needs the pair tokenizers"):
        filter_pairs(pairs, max_tokens=5)
    with pytest.raises(ConfigError, match="max_chars"):
        filter_pairs(pairs, max_chars=0)


# --------------------------------------------------------------------------- tokenizers


def test_shared_char_tokenizer_and_specials():
    pairs = _pairs()
    tk = train_pair_tokenizers(pairs, PairTokenizerConfig(kind="char", shared=True))
    assert tk.shared and isinstance(tk.source, CharTokenizer)
    alphabet = sorted(set("".join(p.source + p.target for p in pairs)))
    assert tk.source.chars == alphabet
    v = tk.source.vocab_size  # characters + <unk>
    assert v == len(alphabet) + 1
    assert (tk.source_ids.pad, tk.source_ids.bos, tk.source_ids.eos) == (v, v + 1, v + 2)
    assert tk.source_ids.vocab_size == tk.target_ids.vocab_size == v + 3
    src = tk.encode_source("Go.")
    tgt = tk.encode_target("Va !")
    assert src == [alphabet.index(c) for c in "Go."] + [v + 2]
    assert tgt == [v + 1] + [alphabet.index(c) for c in "Va !"] + [v + 2]
    assert tk.decode_target(tgt + [v, v]) == "Va !"
    assert tk.decode_target([v + 1] + tgt[1:3] + [v + 2] + tgt[3:]) == "Va"  # stops at </s>
    assert tk.encode_target("Zz\u00e6")[1:-1][-1] == tk.source.unk_id  # unseen -> <unk>


def test_separate_tokenizers():
    pairs = _pairs()
    tk = train_pair_tokenizers(pairs, PairTokenizerConfig(kind="char", shared=False))
    assert not tk.shared
    assert tk.source.chars == sorted(set("".join(p.source for p in pairs)))
    assert tk.target.chars == sorted(set("".join(p.target for p in pairs)))
    assert tk.source_ids.vocab_size == tk.source.vocab_size + 3
    assert tk.target_ids.vocab_size == tk.target.vocab_size + 3


def test_bpe_tokenizer_has_its_own_special_tokens():
    pairs = _pairs()
    cfg = PairTokenizerConfig(kind="bpe", vocab_size=300, shared=False)
    tk = train_pair_tokenizers(pairs, cfg)
    assert isinstance(tk.source, BPETokenizer) and tk.source is not tk.target
    for tok, ids in ((tk.source, tk.source_ids), (tk.target, tk.target_ids)):
        sp = tok.special_tokens
        assert (ids.pad, ids.bos, ids.eos) == (sp["<pad>"], sp["<s>"], sp["</s>"])
        assert ids.vocab_size == tok.vocab_size == 303
    # special strings inside the text are ordinary text, not special ids
    enc = tk.encode_source("<s>")
    assert enc[:-1] == tk.source.encode("<s>", disallowed_special=())
    assert tk.source_ids.bos not in enc
    assert tk.decode(tk.encode_source("Je t'aime."), "source") == "Je t'aime."


def test_wordpiece_pair_tokenizers_are_cased_and_keep_accents(tmp_path):
    from attnlm.tokenizers import WordPieceTokenizer

    pairs = _pairs()
    for shared in (True, False):
        cfg = PairTokenizerConfig(kind="wordpiece", vocab_size=400, shared=shared)
        tk = train_pair_tokenizers(pairs, cfg)
        assert isinstance(tk.target, WordPieceTokenizer) and not tk.target.lowercase
        assert (tk.source is tk.target) == shared
        ids = tk.target_ids  # its own [PAD]... are not used: <pad> <s> </s> come after them
        assert (ids.pad, ids.bos, ids.eos) == tuple(range(tk.target.vocab_size, ids.vocab_size))
        enc = tk.encode_target("Je suis désolé.")
        assert enc[0] == ids.bos and enc[-1] == ids.eos
        # cased, accents kept; the spaces WordPiece loses around "'" are cleaned up
        assert tk.decode_target(enc) == "Je suis désolé."
        assert tk.decode_target(tk.encode_target("J'ai faim !")) == "J'ai faim!"
        tk.save(tmp_path / str(shared))
        back = PairTokenizers.load(tmp_path / str(shared))
        assert back.encode_target("Je suis désolé.") == enc


def test_config_flags_for_start_and_end_tokens():
    pairs = _pairs()[:20]
    cfg = PairTokenizerConfig(source_bos=True, source_eos=False, target_bos=False, target_eos=True)
    tk = train_pair_tokenizers(pairs, cfg)
    ids = tk.source_ids
    assert tk.encode_source("Go.")[0] == ids.bos and tk.encode_source("Go.")[-1] != ids.eos
    assert tk.encode_target("Va !")[0] != ids.bos and tk.encode_target("Va !")[-1] == ids.eos
    # the same string for two roles gets one id
    same = train_pair_tokenizers(pairs, PairTokenizerConfig(pad="</s>", bos="</s>", eos="</s>"))
    v = same.source.vocab_size
    assert (same.source_ids.pad, same.source_ids.bos, same.source_ids.eos) == (v, v, v)
    assert same.source_ids.vocab_size == v + 1
    assert same.decode_target(same.encode_target("Va !")) == "Va !"


def test_save_and_load(tmp_path):
    pairs = _pairs()
    for shared in (True, False):
        cfg = PairTokenizerConfig(kind="bpe", vocab_size=280, shared=shared, source_bos=True)
        tk = train_pair_tokenizers(pairs, cfg)
        tk.save(tmp_path / str(shared))
        back = PairTokenizers.load(tmp_path / str(shared))
        assert back.config == tk.config and back.shared == shared
        assert back.source_ids == tk.source_ids and back.target_ids == tk.target_ids
        for p in pairs[:50]:
            assert back.encode_source(p.source) == tk.encode_source(p.source)
            assert back.encode_target(p.target) == tk.encode_target(p.target)
    names = sorted(f.name for f in (tmp_path / "True").iterdir())
    assert names == ["pair_tokenizers.json", "tokenizer.json"]
    with pytest.raises(InputError, match="no such file"):
        PairTokenizers.load(tmp_path / "missing")


def test_other_kinds_plug_in_by_name():
    pairs = _pairs()[:50]
    # a kind without a pair trainer falls back to its class's train() in attnlm.tokenizers
    tk = train_pair_tokenizers(pairs, PairTokenizerConfig(kind="word"))
    assert isinstance(tk.source, WordTokenizer)
    assert tk.decode_target(tk.encode_target("Va !")) == tk.target.decode(tk.target.encode("Va !"))
    calls = []

    def trainer(texts, vocab_size, specials):
        calls.append((len(texts), vocab_size, specials))
        return CharTokenizer.train("".join(texts))

    register_pair_tokenizer_kind("test-kind", trainer)
    train_pair_tokenizers(pairs, PairTokenizerConfig(kind="test-kind", vocab_size=77, shared=False))
    assert calls == [(50, 77, ["<pad>", "<s>", "</s>"])] * 2
    with pytest.raises(ConfigError, match="unknown tokenizer kind 'nope'"):
        train_pair_tokenizers(pairs, PairTokenizerConfig(kind="nope"))
    with pytest.raises(ConfigError, match="vocab_size"):
        PairTokenizerConfig(vocab_size=-1)
    assert PairTokenizerConfig(vocab_size=0).vocab_size == 0  # 0: sized from the data


def test_from_existing_tokenizers():
    tok = CharTokenizer.train("abc ")
    tk = PairTokenizers.from_tokenizers(tok, target_bos=False)
    assert tk.shared and tk.config.kind == "char"
    # ids: ' ' 0, a 1, b 2, c 3; then <pad> 4, <s> 5, </s> 6
    assert tk.encode_target("ab") == [1, 2, 6]


def test_encode_pairs():
    pairs = _pairs()
    tk = train_pair_tokenizers(pairs, PairTokenizerConfig(kind="char"))
    enc = encode_pairs(pairs, tk)
    assert len(enc) == len(pairs)
    assert [len(s) for s in enc.source] == [len(p.source) + 1 for p in pairs]
    assert [len(t) for t in enc.target] == [len(p.target) + 2 for p in pairs]
    assert enc.source_pad == enc.target_pad == tk.source_ids.pad
    assert enc.target_vocab_size == tk.target_ids.vocab_size
    assert enc.n_tokens() == (sum(map(len, enc.source)), sum(map(len, enc.target)))
    assert [tk.decode_target(t) for t in enc.target] == [p.target for p in pairs]
    strict = PairTokenizers.from_tokenizers(CharTokenizer.train("Go."))
    with pytest.raises(InputError, match=r"pair 0 \('Hi.' -> 'x'\)"):
        encode_pairs([Pair("Hi.", "x")], strict)


def test_load_pairs_resolves_a_path():
    assert load_pairs(TATOEBA) == read_pairs(TATOEBA)
