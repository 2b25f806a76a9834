"""What many test files share: where the fixtures and the sources are, the small corpora, and
the one way to run the command line (in this process with :func:`run_cli`, in a subprocess
with :func:`attnlm_process`, under torchrun, or SIGKILLed after step 25), a run's losses, and a
tiny random translation run (:func:`tiny_translation_run`).

Fixtures built on these (a corpus file, one torch thread, the ``cli`` runner) are in
``conftest.py``.
"""

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

TESTS = Path(__file__).resolve().parent
FIXTURES = TESTS / "fixtures"  # copied here with attribution (fixtures/README.md)
SRC = TESTS.parent / "src"

# Small corpora: the opening of Coriolanus (public domain), and a Romeo and Juliet line.
CITIZENS = (
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\n"
    "All:\nSpeak, speak.\n\nFirst Citizen:\nYou are all resolved rather to die than to famish?\n\n"
) * 12
ROMEO = "ROMEO:\nBut soft, what light through yonder window breaks?\n\nJULIET:\nO Romeo.\n\n" * 20


@dataclass
class CliResult:
    code: int
    out: str
    err: str


def run_cli(capsys, *argv) -> CliResult:
    """``attnlm ARGV`` in this process: the exit code and what it printed (``capsys``)."""
    from attnlm.cli import main

    capsys.readouterr()  # drop what came before
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return CliResult(code, out, err)


def attnlm_process(*argv, timeout=120, threads=1, **kw) -> subprocess.CompletedProcess:
    """``python -m attnlm ARGV`` in a fresh process (real exit codes, stdin, signals), with
    this checkout's sources first on the path and ``threads`` OpenMP threads."""
    env = _with_src({**os.environ, "OMP_NUM_THREADS": str(threads)})
    env.update(kw.pop("env", {}))
    cmd = [sys.executable, "-m", "attnlm", *map(str, argv)]
    kw.setdefault("text", True)
    return subprocess.run(cmd, env=env, capture_output=True, timeout=timeout, **kw)


def losses(run):
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r.get("loss"), r.get("val_loss")) for r in records]


def loss_curve(run):
    """``{step: training loss}`` of a run's logged steps."""
    return {step: loss for step, loss, _ in losses(run) if loss is not None}


def train(args, timeout=120):
    """``attnlm train ARGS`` in a subprocess, one thread, no progress bar."""
    return attnlm_process("train", *args, "--no-progress", "--threads", "1", timeout=timeout)


# The same command line, run through the library with an on_step hook that SIGKILLs the
# process right after step 25 (the public hook; nothing test-only in the trainer).
KILLER = """
import os, signal, sys
from attnlm.cli import main
import attnlm.train.run as run
real = run.train_run
def killing(spec, run_dir, resume=False, log=print, on_step=None, **kw):
    def hook(step):
        if step == 25:
            os.kill(os.getpid(), signal.SIGKILL)
    return real(spec, run_dir, resume=resume, log=log, on_step=hook, **kw)
run.train_run = killing
sys.exit(main(["train", *sys.argv[1:], "--no-progress", "--threads", "1"]))
"""


def _with_src(env: dict) -> dict:
    """``env`` with this checkout's sources first on PYTHONPATH (an editable install of
    another checkout would otherwise win in a subprocess)."""
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH")]))
    return env


def train_killed(args):
    env = _with_src({**os.environ, "OMP_NUM_THREADS": "1"})
    cmd = [sys.executable, "-c", KILLER, *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)


def torchrun(args, killed=False, timeout=120):
    """``attnlm train ARGS`` in 2 CPU processes under torchrun (gloo over loopback, one thread
    each); ``killed``: through :data:`KILLER`, so every process dies right after step 25."""
    env = _with_src({**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"})
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1"]
    cmd += ["--nproc_per_node", "2", "--no-python", sys.executable]
    if killed:
        cmd += ["-c", KILLER, *args]
    else:
        cmd += ["-m", "attnlm", "train", *args, "--no-progress", "--threads", "1"]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def tiny_translation_run(path: Path, pairs_text, rnn: bool = False) -> Path:
    """A tiny random encoder-decoder (``transformer``, 1 + 1 layers, width 16; with ``rnn``, a
    GRU ``rnn-seq2seq`` with Bahdanau attention) with character pair tokenizers trained on
    ``pairs_text`` (``(source, target)`` strings), saved as the run folder ``path``; returns
    ``path``."""
    import torch

    from attnlm.data.pairs import Pair, PairTokenizerConfig, train_pair_tokenizers
    from attnlm.loading.checkpoint import save_checkpoint
    from attnlm.models import registry

    pairs = train_pair_tokenizers(
        [Pair(a, b) for a, b in pairs_text], PairTokenizerConfig(kind="char")
    )
    ids = pairs.target_ids
    table = dict(type="transformer", d_model=16, n_head=2, n_encoder_layers=1,
                 n_decoder_layers=1, d_ff=32, dropout=0.0, vocab_size=ids.vocab_size,
                 pad_id=ids.pad, bos_id=ids.bos, eos_id=ids.eos)  # fmt: skip
    if rnn:
        table = dict(type="rnn-seq2seq", cell="gru", d_emb=16, d_hidden=16, n_layer=1,
                     dropout=0.0, vocab_size=ids.vocab_size, pad_id=ids.pad, bos_id=ids.bos,
                     eos_id=ids.eos)  # fmt: skip
    torch.manual_seed(0)
    model, cfg, family = registry.build(table)
    config = {"step": 0, "model": registry.config_table(family, cfg), "train": {}}
    save_checkpoint(path / "checkpoint", model, config, pairs, {"step": 0})
    return path


def randomize_marian(model) -> None:
    """Spread a tiny ``MarianMTModel``'s weights (its initialisation is near zero, which hides
    wrong layouts): N(0, 0.5) weights, layer-norm gains around 1."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * (0.5 if "norm" not in name else 0.3))
            if "layer_norm" in name and name.endswith("weight"):
                p.add_(1.0)


def greedy_with_and_without_cache(model, prompts, n: int) -> tuple[list, list]:
    """``n`` greedy tokens per prompt decoded with the decoding state and by recomputing the
    context every step (the two must agree)."""
    from attnlm.generate import SamplingConfig, decode
    from attnlm.generate.options import DecodeOptions

    greedy = SamplingConfig(temperature=0, max_new_tokens=n)
    return tuple(decode(model, prompts, greedy, DecodeOptions(use_cache=c)) for c in (True, False))
