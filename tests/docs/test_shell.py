"""The doc blocks' shell runner: which lines run in this process, and that a line run here gives
what the same line gives in a shell (output, exit status, files)."""

from __future__ import annotations

import sys
from pathlib import Path

from shell import Step, bash_runner, plan, run_script

SRC = Path(__file__).resolve().parents[2] / "src"


def test_plain_attnlm_and_python_lines_run_here_the_rest_inbash_runner():
    steps = plan(
        "attnlm data info --text 'my file.txt'   # a comment\n"
        "cp a.txt b.txt; mkdir -p out\n"
        'echo "hi there" | attnlm tokenize encode --tokenizer \\\n    gpt2 > ids.txt\n'
        "python -c \"print('x')\" && attnlm params --prompt $'a\\nb'\n"
    )
    assert steps == [
        Step(argv=["attnlm", "data", "info", "--text", "my file.txt"]),
        Step(script="cp a.txt b.txt\nmkdir -p out"),
        Step(
            argv=["attnlm", "tokenize", "encode", "--tokenizer", "gpt2"],
            feed="echo 'hi there'",
            into="ids.txt",
        ),
        Step(argv=["python", "-c", "print('x')"]),
        Step(argv=["attnlm", "params", "--prompt", "a\nb"]),
    ]


def test_what_needs_a_shell_runs_whole_inbash_runner():
    for script in [
        'f=x.txt\nattnlm data info --text "$f"',  # variables
        "attnlm data info --text *.txt",  # a glob
        "cd runs && attnlm eval --checkpoint demo",  # state between lines
        "attnlm models | head -n 2",  # a pipe out of attnlm
        "torchrun --nproc_per_node 2 -m attnlm train",  # attnlm under another program
        "cat <<EOF > a.txt\nx\nEOF",  # a here-document
        "attnlm eval --checkpoint r 2>&1",  # fd redirection
        "attnlm eval --checkpoint 'unclosed",
    ]:
        assert plan(script) is None, script


SCRIPT = """printf 'the cat sat\\n' > t.txt
attnlm tokenize train --kind char --text t.txt --out tok.json
printf 'a cat\\n' | attnlm tokenize encode --tokenizer tok.json > ids.txt
attnlm data info --text t.txt
python -c "import sys; print(sys.argv[1:])" one 'two words'
"""


def test_a_script_run_here_gives_what_bash_gives(tmp_path, capfd):
    """The same script in this process and through bash with a real ``attnlm`` program: the
    same output, exit status and files."""
    shims = tmp_path / "bin"
    shims.mkdir()
    (shims / "attnlm").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m attnlm "$@"\n')
    (shims / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    for shim in shims.iterdir():
        shim.chmod(0o755)
    env = {"PATH": f"{shims}:/usr/bin:/bin", "COLUMNS": "100", "PYTHONPATH": str(SRC)}
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir(), there.mkdir()
    assert plan(SCRIPT) is not None  # runs here, not through bash
    got = run_script(SCRIPT, here, env, 60, capfd, bash_runner(here, env))
    want = bash_runner(there, env)(SCRIPT, "")
    assert got == want and want.code == 0 and "['one', 'two words']" in want.out
    for name in ("tok.json", "ids.txt"):
        assert (here / name).read_bytes() == (there / name).read_bytes()
    # a failing command stops the script with its status, as `bash -e`: the next line never runs
    bad = "attnlm data info --text missing.txt\ntouch after"
    got = run_script(bad, here, env, 60, capfd, bash_runner(here, env))
    assert got == bash_runner(there, env)(bad, "")
    assert got.code == 2 and got.err.startswith("attnlm: error:") and got.err.count("\n") == 1
    assert not (here / "after").exists()
    crash = run_script(
        "python -c 'raise ValueError(7)'", here, env, 60, capfd, bash_runner(here, env)
    )
    assert crash.code == 1 and "ValueError: 7" in crash.err
