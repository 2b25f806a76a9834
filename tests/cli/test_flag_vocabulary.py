"""One vocabulary of flags: each option name means one thing in every command and is described
in the same words in every ``--help``; renamed options keep their old spelling as a hidden
alias; ``--text PATH`` is a file everywhere, a literal text an argument."""

from __future__ import annotations

import argparse
import json
import re

import pytest
from test_argument_layer import commands  # every leaf command: (its words, its parser)

from attnlm.base.validate import positive_int
from attnlm.cli import build_parser, main
from attnlm.cli.arguments import OneLineArgumentParser, add_option, arg

# Options whose name legitimately means different things in different commands, and why.
ALLOWED = {
    "--out": "what a command writes differs: a run folder, a model file, a plot",
    "--kind": "tokenize train: the tokenizer kind; attention: which attention",
    "--alpha": "ngram train: stupid backoff's factor; word2vec train: the learning rate",
    "--checkpoint": "the other spelling of --model where a command takes both; an attnlm run "
    "folder in export-checkpoint and hmm viterbi",
    "--top-k": "a sampling filter in generate/translate/chat, the length of a ranked list "
    "elsewhere (as transformers' generate and fill-mask pipeline)",
    "--compile": "what is compiled differs (the training step, the decode step)",
    "--parallel": "train: how torchrun processes share the model; serve --api: requests decoded "
    "at once (llama-server's --parallel)",
}


def meaning(help: str | None) -> str:
    """What an option's help says it is: without parenthesised details (defaults, this
    command's case) and without what follows the first colon (this command's specifics)."""
    text = help or ""
    while re.search(r"\([^()]*\)", text):
        text = re.sub(r"\s*\([^()]*\)", "", text)
    return text.split(": ")[0].strip()


def meanings() -> dict[str, dict[str, list[str]]]:
    """option -> its meaning -> the commands that say it."""
    seen: dict[str, dict[str, list[str]]] = {}
    for command, parser in commands():
        for a in parser._actions:
            if not a.option_strings or a.help == argparse.SUPPRESS:
                continue
            if isinstance(a, argparse._HelpAction):
                continue
            for option in a.option_strings:
                seen.setdefault(option, {}).setdefault(meaning(a.help), []).append(command)
    return seen


def test_every_shared_option_says_the_same_in_every_command():
    differ = {
        option: said
        for option, said in meanings().items()
        if len(said) > 1 and option not in ALLOWED
    }
    assert not differ, json.dumps(differ, indent=1)


def test_every_setting_has_one_name_in_every_command():
    """The other way round: a setting (argparse dest) is spelt the same in every command that
    has it (``top_k`` is ``--top-k`` everywhere, ``num_samples`` is ``-n/--num-samples``)."""
    names: dict[str, dict[frozenset[str], list[str]]] = {}
    for command, parser in commands():
        per_dest: dict[str, set[str]] = {}
        for a in parser._actions:
            if a.option_strings and a.help != argparse.SUPPRESS:
                per_dest.setdefault(a.dest, set()).update(a.option_strings)
        for dest, options in per_dest.items():
            names.setdefault(dest, {}).setdefault(frozenset(options), []).append(command)
    differ = {d: v for d, v in names.items() if len(v) > 1}
    assert not differ, differ


def test_progress_bars_are_switched_the_same_way_everywhere():
    """--progress and --no-progress in every command that draws bars (ngram train had only
    --progress, the others only --no-progress); the last one given wins."""
    having = {c: p for c, p in commands() if "progress" in {a.dest for a in p._actions}}
    assert {"train", "compare", "data prepare", "ngram train", "hmm fit"} <= set(having)
    for command, parser in having.items():
        options = {o for a in parser._actions if a.dest == "progress" for o in a.option_strings}
        assert options == {"--progress", "--no-progress"}, command
    ngram = having["ngram train"]
    assert ngram.get_default("progress") is False and having["compare"].get_default("progress")
    args = build_parser().parse_args(["ngram", "train", "--order", "2", "--no-progress"])
    assert args.progress is False
    args = build_parser().parse_args(["compare", "--no-progress", "--progress"])
    assert args.progress is True


def test_the_shared_options_have_help_and_are_shared():
    seen = meanings()
    for option in ("--model", "--device", "--threads", "--seed", "--text", "--json",
                   "--temperature", "--top-p", "--max-new-tokens", "--time-budget",
                   "--num-samples", "-n", "--prompt", "--tokenizer", "--set"):  # fmt: skip
        commands_ = [c for cs in seen[option].values() for c in cs]
        assert len(commands_) >= 2, option
        assert all(m for m in seen[option]), f"{option} has a command without help"
    assert len(ALLOWED) <= 7  # the exception stays the exception


def test_the_meaning_check_can_fail():
    assert meaning("random seed, 0..2**63-1: the split (default 0)") == "random seed, 0..2**63-1"
    assert meaning("a model (repeatable (one per page))") == "a model"
    assert meaning("PNG to write") != meaning("run folder")


# (new argv, old argv): the old spelling parses to the same values, and --help shows the new one
RENAMED = [
    ("word2vec similar --vectors {vectors} cat --top-k 3",
     "word2vec similar --vectors {vectors} cat --top 3", "top_k", "--top"),
    ("word2vec analogy --vectors {vectors} cat dog mat --top-k 2",
     "word2vec analogy --vectors {vectors} cat dog mat --top 2", "top_k", "--top"),
    ("lens --model {ckpt} the --top-k 4", "lens --model {ckpt} the --top 4", "top_k", "--top"),
    ("ngram sample --lm {model} --num-samples 3 --prompt the",
     "ngram sample --model {model} -n 3 --prefix the", "prompt", "--prefix"),
    ("ngram sample --lm {model}", "ngram sample --model {model}", "lm", "--model"),
    ("ngram score --lm {model} --text {text}", "ngram score --model {model} --text {text}",
     "lm", "--model"),
    ("compare --time-budget 2m", "compare --budget 2m", "time_budget", "--budget"),
    ("data task --out - --num-pairs 7", "data task --out - --n 7", "num_pairs", "--n"),
    ("generate --checkpoint {ckpt} -n 2", "generate --checkpoint {ckpt} --num-samples 2",
     "num_samples", None),
]  # fmt: skip


def _parse(argv: str, files: dict[str, str]) -> argparse.Namespace:
    return build_parser().parse_args(argv.format(**files).split())


@pytest.mark.parametrize(("new", "old", "dest", "hidden"), RENAMED, ids=[r[1] for r in RENAMED])
def test_old_spellings_still_work_and_help_shows_only_the_new(new, old, dest, hidden, files):
    got_new, got_old = _parse(new, files), _parse(old, files)
    assert vars(got_new) == vars(got_old)
    assert getattr(got_new, dest) is not None
    if hidden:
        parser = dict(commands())[" ".join(w for w in new.split()[:2] if not w.startswith("-"))]
        shown = parser.format_help()
        assert not re.search(rf"(?<![\w-]){re.escape(hidden)}(?![\w-])", shown), shown
        assert any(o in shown for o in ("--top-k", "--prompt", "--lm", "--time-budget",
                                        "--num-pairs"))  # fmt: skip


def test_help_of_every_command_lists_no_hidden_alias():
    for command, parser in commands():
        shown = parser.format_help()
        for a in parser._actions:
            if a.help == argparse.SUPPRESS:
                for option in a.option_strings:
                    assert not re.search(rf"(?<![\w-]){re.escape(option)}[ ,\]]", shown), (
                        command,
                        option,
                    )


def test_an_alias_and_its_option_are_one_choice():
    p = OneLineArgumentParser(prog="x")
    add_option(p, "--top-k", aliases=("--top",), type=arg(positive_int), default=5, required=True)
    assert p.parse_args(["--top", "3"]).top_k == 3
    assert p.parse_args(["--top-k", "4"]).top_k == 4
    with pytest.raises(SystemExit):
        p.parse_args([])  # required: one of the spellings
    with pytest.raises(SystemExit):
        p.parse_args(["--top", "3", "--top-k", "4"])  # not both


# ---------------------------------------------------------------- --text is a file everywhere


def test_text_is_a_file_everywhere():
    """Every ``--text`` option reads a file: its type checks a path, never takes a literal."""
    for command, parser in commands():
        for a in parser._actions:
            if "--text" in a.option_strings or "--target" in a.option_strings:
                assert a.metavar == "PATH", (command, a.option_strings)
                assert getattr(a.type, "text_input", None) == "file", command


@pytest.mark.parametrize("command", ["attention", "lens", "hmm viterbi"])
def test_a_literal_given_to_text_is_refused_with_the_hint(command, files, capsys):
    """``attention --text other.txt`` used to plot the nine characters "other.txt"."""
    model = ["--checkpoint", files["ckpt"]] if command != "lens" else ["--model", files["ckpt"]]
    argv = [*command.split(), *model, "--text", "To be, or not to be", "--out", files["png"]]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such file" in err
    assert "--text names a file: give a literal text as an argument" in err


def test_attention_reads_text_and_target_from_files_as_from_arguments(files, tmp_path, capsys):
    source, target = tmp_path / "source.txt", tmp_path / "target.txt"
    source.write_text("one two\n", encoding="utf-8")
    target.write_text("zwei eins\n", encoding="utf-8")
    pages = []
    for i, how in enumerate(
        (["one two", "zwei eins"], ["--text", str(source), "--target", str(target)], ["one two"])
    ):
        page = tmp_path / f"{i}.html"
        assert main(["attention", "--checkpoint", files["mt"], *how, "--html", str(page)]) == 0
        pages.append(page.read_text(encoding="utf-8"))
    assert pages[0] == pages[1] and "attention: one two" in pages[0]
    assert pages[2] != pages[0]  # the target was read: without it the model's own translation
    capsys.readouterr()
    both = ["attention", "--checkpoint", files["mt"], "one", "--text", str(source)]
    assert main([*both, "--html", str(tmp_path / "x.html")]) == 2
    assert "not both" in capsys.readouterr().err


def test_every_command_that_runs_a_model_takes_the_same_runtime_options():
    """--model, --device and --threads go together: a command that loads a model lets the user
    choose where it runs and on how many threads (attention, fill-mask, embed, contextual and
    hmm viterbi had --device alone)."""
    for command, parser in commands():
        if command == "params" or command.startswith("ngram"):  # a header read; no torch model
            continue
        options = {o for a in parser._actions for o in a.option_strings}
        if options & {"--device", "--model"}:
            assert {"--device", "--threads"} <= options, command
