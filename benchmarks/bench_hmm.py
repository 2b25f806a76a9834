"""HMM benchmark: one Baum-Welch EM iteration, attnlm against hmmlearn, in one process.

The first ``--chars`` characters of the default corpus (Shakespeare), one id per character,
cut into sequences of ``--length`` characters (hmmlearn's ``lengths``; ours: a batch of rows).
For each number of states K, both start from the same random parameters and run one EM
iteration (E-step and M-step) on the same sequences, alternating ours and theirs ``--reps``
times; the medians and their ratio are printed, with the log-likelihoods both computed.

* ours: ``HMMLM.em_step`` (float32, ``--threads`` torch threads): batched scaled
  forward-backward, one ``(B, K) @ (K, K)`` product per position;
* hmmlearn ``CategoricalHMM.fit(n_iter=1)``: its C++ forward-backward, a loop over
  positions and states per sequence, single-threaded; ``implementation="scaling"`` (its
  faster one) and, where ``--log-max-states`` allows, ``"log"`` (its default, log-sum-exp per
  state pair: at K = 256 an iteration on 1M characters takes about half an hour).

Run: ``.venv/bin/python benchmarks/bench_hmm.py`` (``--chars 100000`` for a quick look).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import platform  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

import harness  # noqa: E402  (benchmarks/harness.py: runs, medians, ratios, --quick)
from attnlm.data.corpus import load_text  # noqa: E402
from attnlm.models.hmm import HMMLM, HMMConfig, split_sequences  # noqa: E402


def start_params(k: int, v: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.dirichlet(np.ones(k)), rng.dirichlet(np.ones(k), k), rng.dirichlet(np.ones(v), k)


def ours(params, ids: torch.Tensor, length: int) -> tuple[harness.Sample, float]:
    """Time and log-likelihood of one EM iteration of ours."""
    pi, A, E = params
    model = HMMLM(HMMConfig(vocab_size=E.shape[1], n_states=len(pi)))
    model.set_probs(*(torch.from_numpy(p) for p in params))
    sequences = split_sequences(ids, length)
    sample, stats = harness.timed(lambda: model.em_step(sequences))
    return sample, stats.log_likelihood


def theirs(params, ids: np.ndarray, length: int, implementation: str):
    """Time and log-likelihood of one EM iteration of hmmlearn."""
    from hmmlearn.hmm import CategoricalHMM

    pi, A, E = params
    h = CategoricalHMM(n_components=len(pi), n_features=E.shape[1], n_iter=1, init_params="",
                       params="ste", implementation=implementation)  # fmt: skip
    h.startprob_, h.transmat_, h.emissionprob_ = pi, A, E
    lengths = [length] * (len(ids) // length) + ([len(ids) % length] if len(ids) % length else [])
    sample = harness.time_call(lambda: h.fit(ids.reshape(-1, 1), lengths))
    return sample, float(h.monitor_.history[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--chars", type=int, default=1_000_000)
    ap.add_argument("--length", type=int, default=256, help="characters per sequence")
    ap.add_argument("--states", default="64,256")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads for ours")
    ap.add_argument("--log-max-states", type=int, default=64,
                    help="also time hmmlearn's log implementation up to this K")  # fmt: skip
    args = harness.parse(ap, quick={"chars": 20_000, "states": "8", "reps": 1, "log_max_states": 8})
    if not harness.require("hmm", "hmmlearn"):
        return
    harness.set_threads(args.threads)
    import logging

    import hmmlearn

    logging.getLogger("hmmlearn").setLevel(logging.ERROR)  # "degenerate solution" notes

    text = load_text(None)[: args.chars]
    symbols, inverse = np.unique(np.array(list(text)), return_inverse=True)
    ids = inverse.astype(np.int64)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, python "
          f"{platform.python_version()}, torch {torch.__version__} ({args.threads} thread(s)), "
          f"hmmlearn {hmmlearn.__version__}")  # fmt: skip
    print(f"data: {len(ids):,} characters, {len(symbols)} symbols, sequences of {args.length}")
    for k in (int(s) for s in args.states.split(",")):
        params = start_params(k, len(symbols), seed=k)
        impls = ["scaling"] + (["log"] if k <= args.log_max_states else [])
        lls: dict[str, float] = {}

        def run(name, fn, out=lls):
            def one():
                sample, out[name] = fn()
                return sample

            return one

        contenders = {
            "attnlm": run("attnlm", lambda p=params: ours(p, torch.from_numpy(ids), args.length))
        }
        for impl in impls:
            contenders[impl] = run(impl, lambda i=impl, p=params: theirs(p, ids, args.length, i))
        runs = harness.alternate(contenders, args.reps)
        for impl in impls:
            rel = abs(lls["attnlm"] - lls[impl]) / abs(lls[impl])
            harness.report(
                f"hmm-em K={k} vs hmmlearn {impl}",
                {"attnlm": runs["attnlm"], impl: runs[impl]},
                "attnlm",
                impl,
                ">= 5x speed-up",
                loglik_attnlm=lls["attnlm"],
                loglik_peer=lls[impl],
                loglik_rel_diff=rel,
            )


if __name__ == "__main__":
    main()
