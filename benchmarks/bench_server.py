"""OpenAI-compatible servers under concurrent load: ``attnlm serve --api`` against llama.cpp's
``llama-server`` and ``llama_cpp.server`` (llama-cpp-python's), whole server processes, the
same GGUF file (SmolLM2-135M-Instruct from attnlm's pretrained cache), the same thread count.

Each server is started as a user starts it, on a free loopback port, and waited for; then for
each client count N (1, 4, 8) N clients at once stream one greedy chat completion each through
``/v1/chat/completions`` with ``stream_options.include_usage``: the same question with a
number of its own, the same on every server (a server may have the shared start cached, never
a whole prompt). llama_cpp.server sends no usage; its content chunks, one per token, are
counted. Every reply is exactly ``--new-tokens`` long on every server: the end-of-turn and
end-of-text ids get a logit bias of -100 (the one switch all three servers take; llama-server
also gets ``ignore_eos``), and a reply of another length is an error. One warm-up request per
server start is not counted. Per round and N: aggregate tokens/s (the completion tokens of
every reply over the wall time from the first request to the last reply) and the median time
to the first content chunk. Servers take turns round by round (attnlm, llama-server,
llama_cpp.server, attnlm, ...); the figures are medians over ``--rounds``, with the ratios
attnlm / peer (tokens/s: higher is better; TTFT: lower is better).

Targets (issue 45): aggregate tokens/s at 8 clients >= 1.3x llama-server and >= 3x
llama_cpp.server; one client >= 1.2x llama-server; median time to first token <= llama-server's.

Peers: ``--llama-server PATH`` (built from the llama.cpp sources in the llama-cpp-python sdist,
outside the repository; run with ``--parallel 8 --cont-batching -t THREADS -c`` room for every
slot), skipped when not given or not found; ``llama_cpp.server`` (``n_threads`` and
``n_threads_batch`` THREADS; ``interrupt_requests`` off, else a new request cuts the stream
being served) needs ``pip install -e '.[llamacpp]'`` (fastapi, sse-starlette,
starlette-context, pydantic-settings, uvicorn), skipped when missing.

    .venv/bin/python benchmarks/bench_server.py --llama-server /tmp/llama-build/bin/llama-server
        [--threads 2] [--clients 1,4,8] [--new-tokens 128] [--rounds 3] [--model FILE.gguf]
    (smoke: --quick, or --new-tokens 16 --clients 1,2 --rounds 1)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import harness  # benchmarks/harness.py: JSON lines, machine header, skips

BENCH = "server"
NAME = "smollm2-135m-instruct"
QUESTION = "Explain, step by step, how a transformer language model reads a sentence. ({})"
SLOTS = 8  # --parallel of attnlm and llama-server


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gguf_file(spec: str | None) -> str | None:
    """The GGUF file served: ``--model``, else SmolLM2's in attnlm's cache (None: not there)."""
    if spec:
        return spec
    from attnlm.data.pretrained import PRETRAINED, pretrained_path

    p = PRETRAINED[NAME]
    path = pretrained_path(p.name) / p.files[0]
    return str(path) if path.is_file() else None


def end_ids(model: str) -> list[int]:
    """The ids that would end a reply early: the file's EOS and the chat template's ends."""
    from attnlm.base.ggufio import GGUFFile
    from attnlm.tokenizers.gguf import GGUFTokenizer, gguf_chat_setup

    header = GGUFFile(Path(model))
    tok = GGUFTokenizer.from_gguf(header)
    _, stops = gguf_chat_setup(tok, f"{model}: tokenizer.chat_template")
    eos = header.get("tokenizer.ggml.eos_token_id")
    ids = set(stops) | ({int(eos)} if eos is not None else set())
    return sorted(int(i) for i in ids)


def commands(args, model: str, port: int) -> dict[str, list[str]]:
    t = str(args.threads)
    slot = args.new_tokens + 256  # a prompt of ~50 tokens, the reply, room to spare
    out = {
        "attnlm": harness.attnlm_command(
            "serve", "--api", "--model", model, "--port", str(port), "--threads", t,
            "--parallel", str(SLOTS), "--slot-context", str(slot), "--served-name", NAME,
        ),
    }  # fmt: skip
    if args.llama_server:
        out["llama-server"] = [
            args.llama_server, "-m", model, "--host", "127.0.0.1", "--port", str(port),
            "-t", t, "-tb", t, "--parallel", str(SLOTS), "--cont-batching",
            "-c", str(SLOTS * slot),
        ]  # fmt: skip
    if have_llama_cpp_server():
        out["llama_cpp.server"] = [
            sys.executable, "-m", "llama_cpp.server", "--model", model, "--host", "127.0.0.1",
            "--port", str(port), "--n_threads", t, "--n_threads_batch", t,
            "--n_ctx", str(slot), "--model_alias", NAME, "--interrupt_requests", "False",
        ]  # fmt: skip
    return out


SERVER_MODULES = ("llama_cpp", "sse_starlette", "fastapi", "starlette_context", "pydantic_settings")


def have_llama_cpp_server() -> bool:
    return all(harness.have_module(m) for m in SERVER_MODULES)


def start(cmd: list[str], port: int, threads: int) -> subprocess.Popen:
    import httpx

    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    log = tempfile.TemporaryFile()  # the server's output (a pipe left unread would block it)
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            err = log.read().decode(errors="replace").strip().splitlines()[-5:]
            raise RuntimeError(f"{cmd[:4]} exited with {proc.returncode}: {' | '.join(err)}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"{cmd[:4]} did not answer within 300 s")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def one_client(url: str, i: int, args, extra: dict, out: list, number: str) -> None:
    import httpx

    body = {
        "model": NAME,
        "messages": [{"role": "user", "content": QUESTION.format(number)}],
        "max_tokens": args.new_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **extra,
    }
    t0, first, tokens, pieces = time.perf_counter(), None, None, 0
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=900) as r:
        if r.status_code != 200:
            r.read()
            raise RuntimeError(f"client {i}: HTTP {r.status_code}: {r.text[:300]}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            choices = chunk.get("choices") or []
            content = [c for c in choices if (c.get("delta") or {}).get("content") is not None]
            pieces += len(content)
            if first is None and any(c["delta"]["content"] for c in content):
                first = time.perf_counter() - t0
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    # llama_cpp.server sends no usage chunk: its content chunks are one token each
    out[i] = (first, pieces if tokens is None else tokens, time.perf_counter())


def load(url: str, n: int, args, extra: dict, tag: str) -> dict[str, float]:
    """``n`` clients at once; client i asks about ``tag.i`` (the same on every server)."""
    out: list = [None] * n
    errors: list[BaseException] = []
    numbers = [f"{tag}.{i}" for i in range(n)]

    def run(i: int) -> None:
        try:
            one_client(url, i, args, extra, out, numbers[i])
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"{len(errors)} of {n} clients failed: {errors[0]}")
    lengths = sorted({o[1] for o in out})
    if lengths != [args.new_tokens]:
        raise RuntimeError(f"replies of {lengths} tokens, not {args.new_tokens} each")
    wall = max(o[2] for o in out) - t0
    return {
        "tokens_per_s": sum(o[1] for o in out) / wall,
        "ttft_s": statistics.median(o[0] if o[0] is not None else wall for o in out),
        "wall_s": wall,
    }


def client_counts(text: str) -> list[int]:
    try:
        counts = [int(x) for x in text.replace(" ", ",").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--clients {text!r}: give counts like 1,4,8") from None
    if not counts or min(counts) < 1 or max(counts) > SLOTS:
        raise argparse.ArgumentTypeError(f"--clients {text!r}: counts from 1 to {SLOTS}")
    return counts


def summary(results: dict[str, dict[int, list[dict]]], clients: list[int]) -> None:
    print(f"{BENCH}: medians over the rounds (under load unless the machine was quiet)")
    for n in clients:
        row = {name: {k: statistics.median(r[k] for r in by_n[n]) for k in by_n[n][0]}
               for name, by_n in results.items() if n in by_n}  # fmt: skip
        for name, r in row.items():
            print(f"  {n} clients  {name:<17} {r['tokens_per_s']:8.1f} tokens/s  "
                  f"median TTFT {r['ttft_s']:.3f} s")  # fmt: skip
        ours = row.get("attnlm")
        ratios = {}
        for peer in (p for p in row if p != "attnlm"):
            if ours is None:
                continue
            tps = ours["tokens_per_s"] / row[peer]["tokens_per_s"]
            ttft = ours["ttft_s"] / row[peer]["ttft_s"]
            ratios[peer] = {"tokens_per_s_ratio": round(tps, 3), "ttft_ratio": round(ttft, 3)}
            print(f"  {n} clients  attnlm / {peer:<17} {tps:5.2f}x tokens/s, "
                  f"{ttft:5.2f}x TTFT (lower is better)")  # fmt: skip
        harness.emit({"bench": BENCH, "clients": n, **row, "ratios": ratios})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="a GGUF file (default: SmolLM2's, cached)")
    ap.add_argument("--llama-server", default=None, metavar="PATH",
                    help="the llama-server binary (skipped when absent)")  # fmt: skip
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--clients", type=client_counts, default=[1, 4, 8],
                    help="concurrent clients, comma-separated (default 1,4,8)")  # fmt: skip
    ap.add_argument("--new-tokens", "--max-tokens", dest="new_tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default=None, help="comma-separated servers to run (default all)")
    args = harness.parse(ap, quick={"clients": [1, 2], "new_tokens": 16, "rounds": 1})
    harness.set_threads(args.threads)
    harness.header(BENCH, threads=args.threads, clients=args.clients, new_tokens=args.new_tokens)
    if args.llama_server and not Path(args.llama_server).is_file():
        harness.skip(BENCH, "llama-server", f"{args.llama_server} does not exist")
        args.llama_server = None
    elif not args.llama_server:
        harness.skip(BENCH, "llama-server", "no --llama-server PATH given")
    if not have_llama_cpp_server():
        harness.skip(BENCH, "llama_cpp.server", "pip install -e '.[llamacpp]'")
    model = gguf_file(args.model)
    if model is None:
        harness.skip(BENCH, "every server", f"{NAME} is not in attnlm's cache (any command with "
                     f"--model {NAME} fetches it)")  # fmt: skip
        return
    bias = {str(i): -100 for i in end_ids(model)}
    results: dict[str, dict[int, list[dict]]] = {}
    for k in range(args.rounds):
        port = free_port()
        for name, cmd in commands(args, model, port).items():
            if args.only and name not in args.only.split(","):
                continue
            extra = {"logit_bias": bias}
            if name == "llama-server":
                extra["ignore_eos"] = True
            proc = start(cmd, port, args.threads)
            try:
                load(f"http://127.0.0.1:{port}", 1, args, extra, f"w{k}")  # warm-up, not counted
                for n in args.clients:
                    r = load(f"http://127.0.0.1:{port}", n, args, extra, f"{k}.{n}")
                    results.setdefault(name, {}).setdefault(n, []).append(r)
                    print(f"  round {k + 1}: {name:<17} {n} clients {r['tokens_per_s']:8.1f} "
                          f"tokens/s, median TTFT {r['ttft_s']:.3f} s", flush=True)  # fmt: skip
            finally:
                stop(proc)
    summary(results, args.clients)


if __name__ == "__main__":
    main()
