"""The CLI bad-input table (issue 15): every numeric, path and choice option of a command, given
a bad value, makes ``attnlm`` exit with code 2 and print exactly one line on stderr, with no
traceback.

Add a command by adding rows to ``CASES``: ``(command argv with {placeholders}, stdin bytes
or None)``. Placeholders name the fixtures built by ``files`` in ``tests/cli/conftest.py`` (a good
corpus, a corrupt file, a folder, a trained tokenizer and n-gram model, ...).
"""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest

from attnlm.cli import main
from support import attnlm_process

# ---------------------------------------------------------------- the table
# (id, argv, stdin)
CASES: list[tuple[str, str, bytes | None]] = [
    # -- data info
    ("data info --text missing", "data info --text {missing}", None),
    ("data info --text non-utf8", "data info --text {binary}", None),
    ("data info --text empty", "data info --text {empty}", None),
    ("data info --text folder without .txt", "data info --text {emptydir}", None),
    ("data bogus action", "data bogus", None),
    # -- tokenize train
    ("tokenize train --kind bogus", "tokenize train --kind bogus --out {out}", None),
    ("tokenize train no --kind", "tokenize train --out {out} --text {text}", None),
    ("tokenize train no --out", "tokenize train --kind char --text {text}", None),
    ("--vocab-size -1", "tokenize train --kind bpe --vocab-size -1 --out {out}", None),
    ("--vocab-size 0", "tokenize train --kind bpe --vocab-size 0 --out {out}", None),
    ("--vocab-size x", "tokenize train --kind bpe --vocab-size x --out {out}", None),
    ("--vocab-size 1.5", "tokenize train --kind word --vocab-size 1.5 --out {out}", None),
    (
        "--vocab-size 100 bpe",
        "tokenize train --kind bpe --vocab-size 100 --text {text} --out {out}",
        None,
    ),
    ("--vocab-size missing for bpe", "tokenize train --kind bpe --text {text} --out {out}", None),
    ("--min-freq 0", "tokenize train --kind word --min-freq 0 --text {text} --out {out}", None),
    ("--min-freq -3", "tokenize train --kind word --min-freq -3 --text {text} --out {out}", None),
    ("--min-freq x", "tokenize train --kind word --min-freq x --text {text} --out {out}", None),
    (
        "--min-freq too high",
        "tokenize train --kind word --min-freq 10000 --text {text} --out {out}",
        None,
    ),
    (
        "--pattern capture group",
        "tokenize train --kind bpe --vocab-size 260 --pattern ([a-z]+) --text {text} --out {out}",
        None,
    ),
    (
        "--pattern empty match",
        "tokenize train --kind bpe --vocab-size 260 --pattern \\w* --text {text} --out {out}",
        None,
    ),
    (
        "--pattern invalid regex",
        "tokenize train --kind bpe --vocab-size 260 --pattern [a- --text {text} --out {out}",
        None,
    ),
    (
        "--pattern unknown name",
        "tokenize train --kind bpe --vocab-size 260 --pattern gpt9 --text {text} --out {out}",
        None,
    ),
    (
        "tokenize train --text missing",
        "tokenize train --kind char --text {missing} --out {out}",
        None,
    ),
    (
        "tokenize train --text non-utf8",
        "tokenize train --kind char --text {binary} --out {out}",
        None,
    ),
    ("--out is a folder", "tokenize train --kind char --text {text} --out {dir}", None),
    ("--out under a file", "tokenize train --kind char --text {text} --out {text}/x.json", None),
    (
        "--tiktoken-out is a folder",
        "tokenize train --kind bpe --vocab-size 260 --text {text} --out {out} --tiktoken-out {dir}",
        None,
    ),
    (
        "--tiktoken-out for char",
        "tokenize train --kind char --text {text} --out {out} --tiktoken-out {out}.tk",
        None,
    ),
    (
        "--special for char",
        "tokenize train --kind char --text {text} --out {out} --special <s>",
        None,
    ),
    # -- tokenize encode / decode / show / info
    ("encode --tokenizer missing", "tokenize encode --tokenizer {missing} abc", None),
    ("encode --tokenizer folder", "tokenize encode --tokenizer {dir} abc", None),
    ("encode --tokenizer corrupt", "tokenize encode --tokenizer {corrupt} abc", None),
    ("encode --tokenizer non-utf8", "tokenize encode --tokenizer {binary} abc", None),
    ("encode --engine bogus", "tokenize encode --tokenizer {tok} --engine bogus abc", None),
    ("encode .tiktoken without --pattern", "tokenize encode --tokenizer {tiktoken} abc", None),
    (
        "encode .tiktoken bad --pattern",
        "tokenize encode --tokenizer {tiktoken} --pattern (x) abc",
        None,
    ),
    ("encode unknown character", "tokenize encode --tokenizer {tok} xyz!", None),
    ("encode stdin non-utf8", "tokenize encode --tokenizer {tok}", b"the caf\xe9\n"),
    ("decode not an id", "tokenize decode --tokenizer {tok} 1 x", None),
    ("decode id out of range", "tokenize decode --tokenizer {tok} 99999", None),
    ("decode negative id", "tokenize decode --tokenizer {tok} -- -1", None),
    ("decode stdin non-utf8", "tokenize decode --tokenizer {tok}", b"1 2 \xff\n"),
    ("show --max-chars -1", "tokenize show --tokenizer {tok} --max-chars -1 abc", None),
    ("show --max-chars x", "tokenize show --tokenizer {tok} --max-chars x abc", None),
    ("show --color bogus", "tokenize show --tokenizer {tok} --color bogus abc", None),
    ("show --text missing", "tokenize show --tokenizer {tok} --text {missing}", None),
    ("info --tokenizer missing", "tokenize info --tokenizer {missing}", None),
    ("info --tokenizer absurd ids", "tokenize info --tokenizer {absurd}", None),
    ("tokenize no action", "tokenize", None),
    # -- ngram train
    ("--order 0", "ngram train --order 0 --text {text} --arpa {out}", None),
    ("--order -1", "ngram train --order -1 --text {text} --arpa {out}", None),
    ("--order x", "ngram train --order x --text {text} --arpa {out}", None),
    ("ngram train no output", "ngram train --order 2 --text {text}", None),
    (
        "--smoothing bogus",
        "ngram train --order 2 --smoothing bogus --text {text} --arpa {out}",
        None,
    ),
    ("--k 0", "ngram train --order 2 --smoothing addk --k 0 --text {text} --out {out}", None),
    ("--k nan", "ngram train --order 2 --smoothing addk --k nan --text {text} --out {out}", None),
    ("--k -1", "ngram train --order 2 --smoothing addk --k -1 --text {text} --out {out}", None),
    (
        "--alpha 0",
        "ngram train --order 2 --smoothing stupid --alpha 0 --text {text} --out {out}",
        None,
    ),
    (
        "--alpha 1.5",
        "ngram train --order 2 --smoothing stupid --alpha 1.5 --text {text} --out {out}",
        None,
    ),
    (
        "--alpha inf",
        "ngram train --order 2 --smoothing stupid --alpha inf --text {text} --out {out}",
        None,
    ),
    ("--pad bogus", "ngram train --order 2 --pad bogus --text {text} --arpa {out}", None),
    ("ngram train --text missing", "ngram train --order 2 --text {missing} --arpa {out}", None),
    ("ngram train --text non-utf8", "ngram train --order 2 --text {binary} --arpa {out}", None),
    ("ngram train --arpa folder", "ngram train --order 2 --text {text} --arpa {dir}", None),
    ("ngram train --out folder", "ngram train --order 2 --text {text} --out {dir}", None),
    ("addk with --arpa", "ngram train --order 2 --smoothing addk --text {text} --arpa {out}", None),
    # -- ngram score
    ("score --lm missing", "ngram score --lm {missing} --text {text}", None),
    ("score --arpa missing", "ngram score --arpa {missing} --text {text}", None),
    ("score --arpa corrupt", "ngram score --arpa {corrupt_arpa} --text {text}", None),
    ("score --arpa NaN value", "ngram score --arpa {nan_arpa} --text {text}", None),
    ("score --lm incomplete npz", "ngram score --lm {bad_npz} --text {text}", None),
    ("score --lm and --arpa", "ngram score --lm {model} --arpa {model} --text {text}", None),
    ("score --pad bogus", "ngram score --lm {model} --pad bogus --text {text}", None),
    ("score --text missing", "ngram score --lm {model} --text {missing}", None),
    # -- ngram sample
    ("sample -n -1", "ngram sample --lm {model} -n -1", None),
    ("sample -n x", "ngram sample --lm {model} -n x", None),
    ("sample --seed -1", "ngram sample --lm {model} --seed -1", None),
    ("sample --seed 2**63", "ngram sample --lm {model} --seed 9223372036854775808", None),
    ("sample --seed x", "ngram sample --lm {model} --seed x", None),
    ("sample --temperature nan", "ngram sample --lm {model} --temperature nan", None),
    ("sample --temperature inf", "ngram sample --lm {model} --temperature inf", None),
    ("sample --temperature 0", "ngram sample --lm {model} --temperature 0", None),
    ("sample --temperature -1", "ngram sample --lm {model} --temperature -1", None),
    ("sample --max-len 0", "ngram sample --lm {model} --max-len 0", None),
    ("sample --lm missing", "ngram sample --lm {missing}", None),
    # -- demo (every case fails before training starts)
    ("demo --threads -1", "demo --threads -1 --text {text} --out {outdir}", None),
    ("demo --threads 0", "demo --threads 0 --text {text} --out {outdir}", None),
    ("demo --threads x", "demo --threads x --text {text} --out {outdir}", None),
    ("demo --text missing", "demo --text {missing} --out {outdir}", None),
    ("demo --text non-utf8", "demo --text {binary} --out {outdir}", None),
    ("demo --preset unknown", "demo --preset nosuch --text {text} --out {outdir}", None),
    ("demo --preset non-utf8", "demo --preset {binary_toml} --text {text} --out {outdir}", None),
    (
        "demo --time-budget bogus",
        "demo --preset tiny-test --time-budget soon --text {text} --out {outdir}",
        None,
    ),
    (
        "demo --out holds another run",
        "demo --preset tiny-test --text {text} --out {otherrun}",
        None,
    ),
    # -- top level
    # -- train, eval, generate, params, models, attention
    ("train --threads -1", "train --preset tiny-test --threads -1 --out {trainout}", None),
    ("train --threads 0", "train --preset tiny-test --threads 0 --out {trainout}", None),
    ("train --max-iters 0", "train --preset tiny-test --max-iters 0 --out {trainout}", None),
    ("train --max-iters x", "train --preset tiny-test --max-iters x --out {trainout}", None),
    ("train --batch-size 0", "train --preset tiny-test --batch-size 0 --out {trainout}", None),
    ("train --grad-accum 0", "train --preset tiny-test --grad-accum 0 --out {trainout}", None),
    ("train --lr nan", "train --preset tiny-test --lr nan --out {trainout}", None),
    ("train --lr -1", "train --preset tiny-test --lr -1 --out {trainout}", None),
    (
        "train --eval-interval 0",
        "train --preset tiny-test --eval-interval 0 --out {trainout}",
        None,
    ),
    ("train --eval-iters -1", "train --preset tiny-test --eval-iters -1 --out {trainout}", None),
    ("train --early-stop -1", "train --preset tiny-test --early-stop -1 --out {trainout}", None),
    ("train --seed -1", "train --preset tiny-test --seed -1 --out {trainout}", None),
    (
        "train --seed 2**63",
        "train --preset tiny-test --seed 9223372036854775808 --out {trainout}",
        None,
    ),
    ("train --device bogus", "train --preset tiny-test --device bogus --out {trainout}", None),
    ("train --device cuda:99", "train --preset tiny-test --device cuda:99 --out {trainout}", None),
    ("train --dtype float16", "train --preset tiny-test --dtype float16 --out {trainout}", None),
    (
        "train --time-budget soon",
        "train --preset tiny-test --time-budget soon --out {trainout}",
        None,
    ),
    ("train --time-budget 0s", "train --preset tiny-test --time-budget 0s --out {trainout}", None),
    ("train --text missing", "train --preset tiny-test --text {missing} --out {trainout}", None),
    ("train --text non-utf8", "train --preset tiny-test --text {binary} --out {trainout}", None),
    ("train --out a file", "train --preset tiny-test --text {text} --out {text}", None),
    ("train --out under a file", "train --preset tiny-test --out {text}/run", None),
    ("train --resume missing", "train --resume {missing}", None),
    ("train --resume no checkpoint", "train --resume {dir}", None),
    ("train --resume crafted state.pt", "train --resume {crafted_run} --threads 1", None),
    ("train --resume garbage state.pt", "train --resume {garbage_run} --threads 1", None),
    ("train --preset missing", "train --preset no-such-preset --out {trainout}", None),
    ("train --preset non-utf8", "train --preset {binary_toml} --out {trainout}", None),
    (
        "train --preset [model] type 3",
        "train --preset {bad_type_toml} --text {text} --out {trainout}",
        None,
    ),
    (
        "train --preset unknown family",
        "train --preset {unknown_family_toml} --text {text} --out {trainout}",
        None,
    ),
    (
        "train --set unknown key",
        "train --preset tiny-test --set train.lrate=1 --out {trainout}",
        None,
    ),
    (
        "train --set bad model value",
        "train --preset tiny-test --set model.n_head=0 --text {text} --out {trainout}",
        None,
    ),
    (
        "train --tokenizer bogus",
        "train --preset tiny-test --tokenizer bogus --text {text} --out {trainout}",
        None,
    ),
    ("eval --device bogus", "eval --checkpoint {ckpt} --device bogus", None),
    ("eval --threads 0", "eval --checkpoint {ckpt} --threads 0", None),
    ("eval --threads -1", "eval --checkpoint {ckpt} --threads -1", None),
    ("eval --max-tokens 0", "eval --checkpoint {ckpt} --max-tokens 0", None),
    ("eval --max-tokens -5", "eval --checkpoint {ckpt} --max-tokens -5", None),
    ("eval --max-tokens 1", "eval --checkpoint {ckpt} --max-tokens 1", None),
    ("eval --max-tokens x", "eval --checkpoint {ckpt} --max-tokens x", None),
    ("eval --batch-size 0", "eval --checkpoint {ckpt} --batch-size 0", None),
    ("eval --split bogus", "eval --checkpoint {ckpt} --split bogus", None),
    ("eval --checkpoint missing", "eval --checkpoint {missing}", None),
    ("eval --checkpoint not a checkpoint", "eval --checkpoint {dir}", None),
    ("eval --text missing", "eval --checkpoint {ckpt} --text {missing}", None),
    ("eval --text unencodable", "eval --checkpoint {ckpt} --text {greek}", None),
    ("eval absurd tokenizer ids", "eval --checkpoint {absurd_ckpt} --text {text}", None),
    ("eval tokenizer bigger than model", "eval --checkpoint {mismatch_ckpt} --text {text}", None),
    ("generate --device bogus", "generate --checkpoint {ckpt} --device bogus", None),
    ("generate --device cuda:99", "generate --checkpoint {ckpt} --device cuda:99", None),
    ("generate --threads 0", "generate --checkpoint {ckpt} --threads 0", None),
    ("generate --threads -1", "generate --checkpoint {ckpt} --threads -1", None),
    (
        "generate --max-new-tokens 10**12",
        "generate --checkpoint {ckpt} --max-new-tokens 1000000000000",
        None,
    ),
    ("generate --max-new-tokens -1", "generate --checkpoint {ckpt} --max-new-tokens -1", None),
    ("generate --temperature nan", "generate --checkpoint {ckpt} --temperature nan", None),
    ("generate --temperature -1", "generate --checkpoint {ckpt} --temperature -1", None),
    ("generate --top-k 0", "generate --checkpoint {ckpt} --top-k 0", None),
    ("generate --top-p 0", "generate --checkpoint {ckpt} --top-p 0", None),
    ("generate --top-p 1.5", "generate --checkpoint {ckpt} --top-p 1.5", None),
    ("generate --top-p nan", "generate --checkpoint {ckpt} --top-p nan", None),
    ("generate --seed -1", "generate --checkpoint {ckpt} --seed -1", None),
    ("generate --num-samples 0", "generate --checkpoint {ckpt} --num-samples 0", None),
    ("generate --checkpoint missing", "generate --checkpoint {missing}", None),
    ("generate absurd tokenizer ids", "generate --checkpoint {absurd_ckpt}", None),
    ("generate tokenizer bigger than model", "generate --checkpoint {mismatch_ckpt}", None),
    ("generate unencodable prompt", "generate --checkpoint {ckpt} --prompt ΩΩ", None),
    ("params --vocab-size 0", "params --preset tiny-test --vocab-size 0", None),
    ("params --vocab-size x", "params --preset tiny-test --vocab-size x", None),
    ("params --preset missing", "params --preset no-such-preset", None),
    ("params --preset non-utf8", "params --preset {binary_toml}", None),
    ("params --preset [model] type 3", "params --preset {bad_type_toml}", None),
    ("params --preset unknown family", "params --preset {unknown_family_toml}", None),
    ("params no --preset", "params", None),
    ("models unknown option", "models --bogus", None),
    (
        "attention --layer -1",
        "attention --checkpoint {ckpt} the --out {png} --layer -1",
        None,
    ),
    (
        "attention --layer 99",
        "attention --checkpoint {ckpt} the --out {png} --layer 99",
        None,
    ),
    ("attention --head x", "attention --checkpoint {ckpt} the --out {png} --head x", None),
    ("attention --head 99", "attention --checkpoint {ckpt} the --out {png} --head 99", None),
    (
        "attention --device bogus",
        "attention --checkpoint {ckpt} the --out {png} --device bogus",
        None,
    ),
    (
        "attention --kind bogus",
        "attention --checkpoint {ckpt} the --out {png} --kind bogus",
        None,
    ),
    (
        "attention --kind cross on a GPT",
        "attention --checkpoint {ckpt} the --out {png} --kind cross",
        None,
    ),
    (
        "attention --checkpoint missing",
        "attention --checkpoint {missing} the --out {png}",
        None,
    ),
    ("attention --out a folder", "attention --checkpoint {ckpt} the --out {dir}", None),
    (
        "attention --out under a file",
        "attention --checkpoint {ckpt} the --out {text}/a.png",
        None,
    ),
    (
        "attention --html under a file",
        "attention --checkpoint {ckpt} the --html {text}/a.html",
        None,
    ),
    ("attention no --out", "attention --checkpoint {ckpt} the", None),
    ("attention unencodable text", "attention --checkpoint {ckpt} Ω --out {png}", None),
    ("attention --model unknown", "attention --model bogus the --out {png}", None),
    ("attention both models", "attention --checkpoint {ckpt} --model x a --out {png}", None),
    # -- eval --model
    ("eval --model unknown", "eval --model bogus", None),
    ("eval --model missing folder", "eval --model {missing}", None),
    ("eval --pairs on a text model", "eval --checkpoint {ckpt} --pairs {text}", None),
    # -- compare
    ("compare --models bogus", "compare --models ngram,bogus --out {outdir}", None),
    ("compare --models twice", "compare --models ngram,ngram --out {outdir}", None),
    ("compare --time-budget x", "compare --time-budget x --out {outdir}", None),
    ("compare --tokenizer bogus", "compare --tokenizer bogus --out {outdir}", None),
    ("compare --text missing", "compare --text {missing} --out {outdir}", None),
    ("compare --val-chars 0", "compare --val-chars 0 --out {outdir}", None),
    ("compare --val-chars x", "compare --val-chars x --out {outdir}", None),
    ("compare --threads -1", "compare --threads -1 --out {outdir}", None),
    ("compare --set bad", "compare --set nokey --out {outdir}", None),
    # -- translate
    ("translate --checkpoint missing", "translate --checkpoint {missing} one", None),
    ("translate a text model", "translate --checkpoint {ckpt} one", None),
    ("translate --beam 0", "translate --checkpoint {ckpt} --beam 0 one", None),
    ("translate --beam x", "translate --checkpoint {ckpt} --beam x one", None),
    ("translate --temperature -1", "translate --checkpoint {ckpt} --temperature -1 one", None),
    ("translate --early-stopping x", "translate --checkpoint {ckpt} --early-stopping x a", None),
    ("translate --pairs missing", "translate --checkpoint {ckpt} --pairs {missing}", None),
    # -- fill-mask / embed / contextual
    ("fill-mask --model unknown", "fill-mask --model bogus [MASK]", None),
    ("fill-mask a GPT", "fill-mask --checkpoint {ckpt} [MASK]", None),
    ("fill-mask no model", "fill-mask [MASK]", None),
    ("fill-mask --top-k 0", "fill-mask --checkpoint {ckpt} --top-k 0 [MASK]", None),
    ("embed --checkpoint missing", "embed --checkpoint {missing} a b", None),
    ("embed a GPT", "embed --checkpoint {ckpt} the cat", None),
    ("contextual --model unknown", "contextual --model bogus --word a a b", None),
    ("contextual word absent", "contextual --checkpoint {ckpt} --word zzz the cat", None),
    ("contextual no --word", "contextual --checkpoint {ckpt} the cat", None),
    # -- serve (all refused before binding a port)
    ("serve nothing", "serve", None),
    ("serve --port -1", "serve --checkpoint {ckpt} --port -1", None),
    ("serve --port x", "serve --checkpoint {ckpt} --port x", None),
    ("serve --max-chars 0", "serve --checkpoint {ckpt} --max-chars 0", None),
    ("serve --checkpoint missing", "serve --checkpoint {missing}", None),
    ("serve --model unknown", "serve --model bogus", None),
    ("serve --threads x", "serve --checkpoint {ckpt} --threads x", None),
    # -- data task / data pairs
    ("data task -n 0", "data task -n 0 --out {out}", None),
    ("data task -n x", "data task -n x --out {out}", None),
    ("data task --out folder", "data task -n 3 --out {dir}", None),
    ("data pairs --pairs missing", "data pairs --pairs {missing}", None),
    ("data pairs --pairs non-utf8", "data pairs --pairs {binary}", None),
    ("data pairs --pairs empty", "data pairs --pairs {empty}", None),
    ("data pairs --valid 2", "data pairs --pairs {text} --valid 2", None),
    ("data pairs --header bogus", "data pairs --pairs {text} --header bogus", None),
    ("demo --translate-budget x", "demo --translate-budget x --out {outdir}", None),
    ("demo --compare-budget -1s", "demo --compare-budget -1s --out {outdir}", None),
    ("unknown command", "bogus", None),
]


def _argv(template: str, files: dict[str, str]) -> list[str]:
    return [a.format(**files) for a in template.split()]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_exits_2_with_one_line(case, files, capsys, monkeypatch):
    _, template, stdin = case
    if stdin is not None:
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    try:
        rc = main(_argv(template, files))
        created = Path(files["outdir"]).exists()
    finally:  # a row that wrongly creates the folder must not fail the rows after it
        shutil.rmtree(files["outdir"], ignore_errors=True)
    out = capsys.readouterr()
    assert rc == 2, f"exit {rc}; stdout {out.out[:200]!r}; stderr {out.err[:300]!r}"
    assert "Traceback" not in out.err
    lines = out.err.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}: {out.err[:500]!r}"
    assert lines[0].startswith("attnlm: error: "), lines[0]
    assert not created, "a failed command must not create its output folder"


@pytest.mark.parametrize(
    "argv",
    [["ngram", "sample", "--seed", "-1", "--lm", "x"], ["tokenize", "encode", "--tokenizer"]],
)
def test_real_process_exit_code(argv):
    """The same through the console entry point: exit status 2, one stderr line."""
    r = attnlm_process(*argv, env={"PATH": "/usr/bin:/bin"})
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
