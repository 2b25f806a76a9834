"""Nothing is lost (docs/reliability.md): every command that writes files is SIGKILLed at its
N-th write point (``ATTNLM_TEST_KILL_AT=*:N``, read by :func:`attnlm.base.fileio.kill_point`: a
complete temporary file before its rename, or an appended log line half written) while it
replaces the outputs of an earlier run; every output file must then be the old file byte for
byte or a complete new one (never 0 bytes, never torn), and the command must run again to
the end. :func:`_rows` holds one row per writing command (two for ``export``: ``--gguf`` and
``--out``); a command with an option whose type names an output
(:data:`attnlm.cli.arguments.OUTPUT_TYPES`) that has no row and no reason in :data:`EXEMPT`
fails :func:`test_every_writing_command_has_a_row`."""

from __future__ import annotations

import json
import shutil
import signal
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from attnlm.base.fileio import KILL_ENV, LOCK_NAME, TEMP_MARK
from gguf_export_support import tiny_run
from support import CITIZENS, ROMEO, attnlm_process, run_cli

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

EXEMPT: dict[str, str] = {}  # command -> why it has no row (none today)

# files removed on purpose before the files they describe are rewritten, and written last
MARKERS = {"data.json": "a prepared data folder's record: present only when its files are complete"}

# rows whose command refuses an output that exists (no --overwrite): each try starts afresh
NEW_FOLDER_ONLY = {"hmm fit", "export-checkpoint"}

Argv = Callable[[int], list]  # variant (0: the old run, 1: the new one) -> argv


def _rows(files: dict[str, str], t: Path) -> dict[str, tuple[Argv, list[Path]]]:
    texts = [t / "a.txt", t / "b.txt"]
    texts[0].write_text(CITIZENS, encoding="utf-8")
    texts[1].write_text(ROMEO, encoding="utf-8")
    ck, out, f = files["ckpt"], t / "out", t / "out.file"
    sentences = ["the cat sat", "the dog sat on"]  # within the checkpoint's 16 characters
    task = t / "task.jsonl"  # eval --task: two examples in those characters
    task.write_text(
        '{"context": "the cat", "choices": [" sat", " dog"], "gold": 0}\n'
        '{"context": "the dog", "choices": [" sat", " cat"], "gold": 0}\n'
    )
    bpe = _once(lambda: [tiny_run(t / f"{family}-run", family) for family in ("llama", "gpt")])
    sharded = _once(lambda: [sharded_run(t / f"fsdp{v}", steps=v + 1) for v in (0, 1)])
    demo = ["--preset", "tiny-test", "--time-budget", "1s", "--translate-budget", 0,
            "--compare-budget", 0, "--no-llm", "--threads", 1]  # fmt: skip
    return {
        "train": (lambda v: ["train", "--preset", "tiny-test", "--text", texts[v], "--out", out,
                             "--max-iters", 4, "--set", "train.eval_interval=2", "--overwrite",
                             "--no-progress", "--threads", 1], [out]),
        "compare": (lambda v: ["compare", "--text", texts[v], "--budget", "1s", "--models",
                               "ngram", "--out", out, "--no-progress", "--val-chars", 200],
                    [out]),
        "data prepare": (lambda v: ["data", "prepare", "--text", texts[v], "--tokenizer", "char",
                                    "--out", out, "--no-progress"], [out]),
        "ngram train": (lambda v: ["ngram", "train", "--order", 2 + v, "--text", texts[v],
                                   "--arpa", f.with_suffix(".arpa"), "--out",
                                   f.with_suffix(".npz")],
                        [f.with_suffix(".arpa"), f.with_suffix(".npz")]),
        "word2vec train": (lambda v: ["word2vec", "train", "--text", texts[v], "--out",
                                      f.with_suffix(".txt"), "--epochs", 1, "--dim", 4 + v,
                                      "--min-count", 1, "--workers", 1, "--no-progress"],
                           [f.with_suffix(".txt")]),
        "tokenize train": (lambda v: ["tokenize", "train", "--kind", "wordpiece", "--vocab-size",
                                      60 + v, "--text", texts[v], "--out", f.with_suffix(".json"),
                                      "--vocab-out", f.with_suffix(".vocab")],
                           [f.with_suffix(".json"), f.with_suffix(".vocab")]),
        "attention": (lambda v: ["attention", "--checkpoint", ck, sentences[v],
                                 "--out", f.with_suffix(".png"), "--html",
                                 f.with_suffix(".html")],
                      [f.with_suffix(".png"), f.with_suffix(".html")]),
        "lens": (lambda v: ["lens", "--model", ck, sentences[v], "--out", f.with_suffix(".png"),
                            "--threads", 1], [f.with_suffix(".png")]),
        "contextual": (lambda v: ["contextual", "--checkpoint", ck, "--word", "sat",
                                  *sentences, "sat on the log"[: 10 + v], "--out",
                                  f.with_suffix(".png")], [f.with_suffix(".png")]),
        "hmm fit": (lambda v: ["hmm", "fit", "--text", texts[v], "--out", t / f"hmm{v}",
                               "--states", 2, "--iters", 1, "--threads", 1, "--no-progress"],
                    [t / "hmm1"]),
        "trace": (lambda v: ["trace", "--model", ck, sentences[v], "--hook", "hook_embed",
                             "--save", f.with_suffix(".npz"), "--threads", 1],
                  [f.with_suffix(".npz")]),
        "patch": (lambda v: ["patch", "--model", ck, "--clean", "the cat sat", "--corrupt",
                             "the dog sat", "--answer", "so"[v], "--wrong", "d", "--out",
                             f.with_suffix(".png"), "--threads", 1],
                  [f.with_suffix(".png"), t / "out.file-heads.png"]),
        "attribute": (lambda v: ["attribute", "--model", ck, sentences[v], "--answer", "s",
                                 "--out", f.with_suffix(".png"), "--threads", 1],
                      [f.with_suffix(".png")]),
        "heads": (lambda v: ["heads", "--model", ck, "--induction", "--length", 3 + v, "--out",
                             f.with_suffix(".png"), "--threads", 1], [f.with_suffix(".png")]),
        "ablate": (lambda v: ["ablate", "--model", ck, sentences[v], "--head", "0.0",
                              "--out", f.with_suffix(".png"), "--threads", 1],
                   [f.with_suffix(".png")]),
        "eval --out": (lambda v: ["eval", "--model", ck, "--task", task, "--num-fewshot", v,
                                  "--out", f.with_suffix(".png"), "--no-progress",
                                  "--threads", 1], [f.with_suffix(".png")]),
        "export --gguf": (lambda v: ["export", "--model", bpe()[0], "--gguf", f.with_suffix(
                                     ".gguf"), "--type", ("f32", "q8_0")[v], "--overwrite"],
                          [f.with_suffix(".gguf")]),
        "export --out": (lambda v: ["export", "--model", bpe()[v], "--out", t / "hf",
                                    "--overwrite"], [t / "hf"]),
        "export-checkpoint": (lambda v: ["export-checkpoint", "--checkpoint", sharded()[v],
                                         "--out", out], [out]),
        "data task": (lambda v: ["data", "task", "--out", f.with_suffix(".tsv"), "--num-pairs",
                                 40 + 10 * v, "--seed", v], [f.with_suffix(".tsv")]),
        "demo": (lambda v: ["demo", "--text", texts[v], "--out", t / "demo", *demo],
                 [t / "demo"]),
    }  # fmt: skip


def _once(make: Callable[[], list]) -> Callable[[], list]:
    """``make()``, called when a row first needs it (the others do not pay for it)."""
    made: list = []
    return lambda: made or made.extend(make()) or made


def sharded_run(path: Path, steps: int) -> Path:
    """A run folder holding a sharded (FSDP) checkpoint of a tiny GPT after ``steps`` AdamW
    steps, saved by a gloo group of this one process (as tests/train/test_fsdp.py does)."""
    import dataclasses

    import torch
    import torch.distributed as dist

    from attnlm.models import registry
    from attnlm.tokenizers.char import CharTokenizer
    from attnlm.train.config import TrainConfig
    from attnlm.train.fsdp import save_sharded, shard
    from attnlm.train.optim import make_optimizer

    cfg = TrainConfig(parallel="fsdp")
    table = {"type": "gpt", "vocab_size": 20, "block_size": 8, "n_layer": 2, "n_head": 2,
             "n_embd": 8}  # fmt: skip
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model, model_cfg, family = registry.build(table)
        config = {"preset": "", "train": dataclasses.asdict(cfg), "step": steps,
                  "model": registry.config_table(family, model_cfg)}  # fmt: skip
        shard(model, torch.device("cpu"))
        opt = make_optimizer(model, cfg, "cpu")
        for seed in range(steps):
            ids = torch.randint(0, 20, (2, 8), generator=torch.Generator().manual_seed(seed))
            model(ids=ids, targets=ids.roll(-1, 1)).loss.backward()
            opt.step()
            opt.zero_grad()
        tok = CharTokenizer.train("abcdefghijklmnopqrs")
        save_sharded(path / "checkpoint", model, opt, config, tok, {"trainer": {}})
    finally:
        dist.destroy_process_group()
    return path


ROW_NAMES = [
    "train", "compare", "data prepare", "ngram train", "word2vec train", "tokenize train",
    "attention", "lens", "contextual", "hmm fit", "eval --out", "trace", "patch", "attribute",
    "heads", "ablate", "export --gguf", "export --out",
    "export-checkpoint", "data task", "demo",
]  # fmt: skip


def _is_scratch(p: Path) -> bool:
    """Temporary files and folders of killed writers, and lock files: not outputs."""
    return any(TEMP_MARK in part or part.endswith((LOCK_NAME, ".ngram-tmp")) for part in p.parts)


def snapshot(outputs: list[Path]) -> dict[Path, bytes]:
    found = {}
    for o in outputs:
        for p in [o] if o.is_file() else sorted(o.rglob("*")) if o.is_dir() else []:
            if p.is_file() and not _is_scratch(p.relative_to(o.parent)):
                found[p] = p.read_bytes()
    return found


def complete(p: Path, data: bytes) -> str | None:
    """Why ``data`` is not a complete file of its kind (None when it is)."""
    name = p.name
    if name.endswith(".jsonl"):  # a log: every line but a cut last one parses
        lines = data.decode().split("\n")
        for line in lines[:-1]:
            json.loads(line)
        return None
    if not data:
        return "0 bytes"
    if name.endswith(".json"):
        json.loads(data)
    elif name.endswith(".png"):
        return None if data.endswith(b"IEND\xaeB`\x82") else "PNG without its end"
    elif name.endswith(".html"):
        return None if data.rstrip().endswith(b"</html>") else "HTML without its end"
    elif name.endswith(".arpa"):
        return None if data.rstrip().endswith(b"\\end\\") else "ARPA without \\end\\"
    elif name.endswith(".npz"):
        import io

        with np.load(io.BytesIO(data)) as z:
            [z[k] for k in z.files]
    elif name.endswith(".gguf"):
        import tempfile

        from attnlm.base.ggufio import GGUFFile

        with tempfile.NamedTemporaryFile(suffix=".gguf") as tmp:
            tmp.write(data)
            tmp.flush()
            gguf = GGUFFile(tmp.name)
            for t in gguf.tensors:  # every tensor's bytes are in the file
                gguf.raw(t)
    elif name.endswith(".safetensors"):
        from safetensors.numpy import load

        load(data)
    elif name.endswith((".txt", ".vocab", ".tsv")):
        return None if data.endswith(b"\n") else "text without its last line end"
    return None


def check(outputs: list[Path], old: dict[Path, bytes], when: str) -> None:
    now = snapshot(outputs)
    for p, data in now.items():
        if old.get(p) != data:
            assert complete(p, data) is None, f"{when}: {p}: {complete(p, data)}"
    for p in old:  # nothing lost: the old file, or the checkpoint kept as checkpoint.old
        kept = Path(str(p).replace("/checkpoint/", "/checkpoint.old/"))
        new = Path(str(p).replace("/checkpoint.old/", "/checkpoint/"))  # replaced it
        assert p in now or kept in now or new in now or p.name in MARKERS, f"{when}: {p} is gone"


def kill_run(name: str, files, tmp_path, capsys, points) -> None:
    argv, outputs = _rows(files, tmp_path)[name]
    first = run_cli(capsys, *argv(0))  # in this process: no second start-up
    assert first.code == 0, first.err
    old = snapshot(outputs)
    for k in points:
        if name in NEW_FOLDER_ONLY:
            for o in outputs:
                shutil.rmtree(o, ignore_errors=True)
            old = {}
        r = attnlm_process(*argv(1), timeout=300, env={KILL_ENV: f"*:{k}"})
        check(outputs, old, f"{name} killed at write {k}")
        if r.returncode != -signal.SIGKILL:  # fewer write points than k: it finished
            assert r.returncode == 0, r.stderr
            break
        old = {**old, **snapshot(outputs)}  # what survived is the state the next kill sees
    if name in NEW_FOLDER_ONLY:
        for o in outputs:
            shutil.rmtree(o, ignore_errors=True)
    again = run_cli(capsys, *argv(1))  # no lock and no leftover stops the next run
    assert again.code == 0, again.err
    for o in outputs:  # the next run, under the output lock, removed what the killed ones left
        left = o.rglob(f".*{TEMP_MARK}*") if o.is_dir() else o.parent.glob(f".{o.name}.tmp-*")
        assert not [p for p in left if p.is_file()], f"{name}: temporary files left"
    check(outputs, {}, f"{name} after the kills")


@pytest.mark.parametrize("name", ROW_NAMES)
def test_kill_at_the_first_write(name, files, tmp_path, capsys):
    kill_run(name, files, tmp_path, capsys, points=(1,))


@pytest.mark.slow
@pytest.mark.parametrize("name", ROW_NAMES)
def test_kill_at_every_write(name, files, tmp_path, capsys):
    kill_run(name, files, tmp_path, capsys, points=range(2, 40))


def test_every_writing_command_has_a_row(files, tmp_path):
    """A command with an option whose type names an output (a folder or a file, see
    :data:`attnlm.cli.arguments.OUTPUT_TYPES`) has a row (``export --gguf`` is a row of
    ``export``) or a reason in :data:`EXEMPT`."""
    from test_argument_layer import commands

    from attnlm.cli.arguments import OUTPUT_TYPES

    writers = {
        name
        for name, p in commands()
        if any(getattr(a.type, "checks", None) in OUTPUT_TYPES for a in p._actions)
    }
    assert {"train", "compare", "export"} <= writers  # the discovery works
    covered = {row.split(" --")[0] for row in ROW_NAMES}
    missing = writers - covered - set(EXEMPT)
    assert not missing, f"writing commands without a kill-test row: {sorted(missing)}"
    assert not (covered | set(EXEMPT)) - writers, "rows for commands that do not write"
    assert sorted(_rows(files, tmp_path)) == sorted(ROW_NAMES)
