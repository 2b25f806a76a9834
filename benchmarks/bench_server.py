"""OpenAI-compatible servers under concurrent load: ``attnlm serve --api`` against llama.cpp's
``llama-server`` and ``llama_cpp.server`` (llama-cpp-python's), whole server processes, the
same GGUF file (SmolLM2-135M-Instruct), the same thread count.

Each server is started as a user starts it, on a free loopback port, and waited for; then for
each client count N (1, 4, 8) N clients at once stream one greedy chat completion each
(``max_tokens`` 128, the same question with a different number in each) through
``/v1/chat/completions`` with ``stream_options.include_usage``. Per round: aggregate tokens/s
(the completion tokens of every reply, from the usage chunks, over the wall time from the first
request to the last reply) and the median time to the first content chunk. Servers take turns
round by round (attnlm, llama-server, llama_cpp.server, attnlm, ...); medians over ``--rounds``.

Targets (issue 45): aggregate tokens/s at 8 clients >= 1.3x llama-server and >= 3x
llama_cpp.server; one client >= 1.2x llama-server; median time to first token <= llama-server's.

Peers: ``--llama-server PATH`` (built from the llama.cpp sources in the llama-cpp-python sdist,
outside the repository; run with ``--parallel 8 --cont-batching``), skipped when not given or
not found; ``llama_cpp.server`` needs ``pip install 'llama-cpp-python[server]'`` (fastapi,
sse-starlette, starlette-context, pydantic-settings), skipped when missing. A reply may end
before 128 tokens at the end-of-turn token on any side; the usage counts what was made.

    .venv/bin/python benchmarks/bench_server.py [--llama-server PATH] [--threads 2]
        [--clients 1 4 8] [--max-tokens 128] [--rounds 3] [--model FILE.gguf] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import harness  # benchmarks/harness.py: JSON lines, machine header, skips

BENCH = "server"
NAME = "smollm2-135m-instruct"
QUESTION = "Explain, step by step, how a transformer language model reads a sentence. ({})"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gguf_file(spec: str | None) -> str:
    if spec:
        return spec
    from attnlm.data.pretrained import PRETRAINED, pretrained_path

    p = PRETRAINED[NAME]
    return str(pretrained_path(p.name) / p.files[0])


def commands(args, model: str, port: int) -> dict[str, list[str]]:
    t = str(args.threads)
    out = {
        "attnlm": harness.attnlm_command(
            "serve",
            "--api",
            "--model",
            model,
            "--port",
            str(port),
            "--threads",
            t,
            "--parallel",
            str(max(args.clients)),
            "--served-name",
            NAME,
        ),
    }
    if args.llama_server:
        ctx = max(args.clients) * (args.max_tokens + 256)
        out["llama-server"] = [
            args.llama_server,
            "-m",
            model,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "-t",
            t,
            "--parallel",
            str(max(args.clients)),
            "--cont-batching",
            "-c",
            str(ctx),
        ]
    if harness.have_module("llama_cpp") and harness.have_module("sse_starlette"):
        out["llama_cpp.server"] = [
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            model,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--n_threads",
            t,
            "--n_ctx",
            str(args.max_tokens + 256),
        ]
    return out


def start(cmd: list[str], port: int) -> subprocess.Popen:
    import httpx

    env = {
        **os.environ,
        "OMP_NUM_THREADS": cmd[cmd.index("--threads") + 1]
        if "--threads" in cmd
        else os.environ.get("OMP_NUM_THREADS", "2"),
    }
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{cmd[0]} exited with {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"{cmd[0]} did not answer within 300 s")


def one_client(url: str, i: int, max_tokens: int, out: list) -> None:
    import httpx

    body = {
        "model": NAME,
        "messages": [{"role": "user", "content": QUESTION.format(i)}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0, first, tokens = time.perf_counter(), None, 0
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if first is None and any(c["delta"].get("content") for c in chunk["choices"]):
                first = time.perf_counter() - t0
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    out[i] = (first, tokens, time.perf_counter())


def load(url: str, n: int, max_tokens: int) -> dict[str, float]:
    out: list = [None] * n
    threads = [
        threading.Thread(target=one_client, args=(url, i, max_tokens, out)) for i in range(n)
    ]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = max(o[2] for o in out) - t0
    tokens = sum(o[1] for o in out)
    return {
        "tokens_per_s": tokens / wall,
        "ttft_s": statistics.median(o[0] or wall for o in out),
        "tokens": tokens,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="a GGUF file (default: SmolLM2's, cached)")
    ap.add_argument(
        "--llama-server",
        default=None,
        metavar="PATH",
        help="the llama-server binary (skipped when absent)",
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    args = harness.parse(ap, quick={"clients": [1, 2], "max_tokens": 8, "rounds": 1})
    harness.set_threads(args.threads)
    harness.header(BENCH, threads=args.threads, clients=args.clients, max_tokens=args.max_tokens)
    if args.llama_server and not Path(args.llama_server).is_file():
        harness.skip(BENCH, "llama-server", f"{args.llama_server} does not exist")
        args.llama_server = None
    elif not args.llama_server:
        harness.skip(BENCH, "llama-server", "no --llama-server PATH given")
    if not (harness.have_module("llama_cpp") and harness.have_module("sse_starlette")):
        harness.skip(BENCH, "llama_cpp.server", "pip install 'llama-cpp-python[server]'")
    model = gguf_file(args.model)
    results: dict[str, dict[int, list[dict]]] = {}
    for _ in range(args.rounds):
        port = free_port()
        for name, cmd in commands(args, model, port).items():
            proc = start(cmd, port)
            try:
                for n in args.clients:
                    r = load(f"http://127.0.0.1:{port}", n, args.max_tokens)
                    results.setdefault(name, {}).setdefault(n, []).append(r)
            finally:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
    for n in args.clients:
        row = {}
        for name, by_n in results.items():
            rs = by_n[n]
            row[name] = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
            print(
                f"  {BENCH}: {n} clients {name:<17} {row[name]['tokens_per_s']:8.1f} tokens/s, "
                f"median TTFT {row[name]['ttft_s']:.3f} s"
            )
        harness.emit({"bench": BENCH, "clients": n, **row})


if __name__ == "__main__":
    main()
