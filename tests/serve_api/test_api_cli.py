"""``attnlm serve --api`` as a user runs it: a whole server process on a free port that the
``openai`` client talks to (with its API key); a GGUF file served on the C engine (or on
PyTorch with ``ATTNLM_ENGINE=0``), the banner saying which, with the default slots (8 for a
model under 1B parameters on this many cores); and the refusals in one line with exit 2: a
non-loopback --host without --api-key, several models, a port in use."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("openai")
from api_server_support import client, tiny_tools_model  # noqa: E402

from attnlm.api.steppers import engine_rows  # noqa: E402
from attnlm.runtime.engine import Engine  # noqa: E402
from support import _with_src, attnlm_process  # noqa: E402

GGUF = Path(__file__).resolve().parents[1] / "fixtures" / "gguf_arch" / "llama-Q8_0.gguf"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_tools_model(tmp_path_factory.mktemp("cli") / "tiny")


def stop(proc: subprocess.Popen) -> None:
    """Ctrl-C the server, killed if it has not ended within 20 s."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def test_a_server_process_answers_the_client(model_dir):
    env = _with_src({**os.environ, "OMP_NUM_THREADS": "1"})
    cmd = [
        sys.executable,
        "-m",
        "attnlm",
        "serve",
        "--api",
        "--model",
        str(model_dir),
        "--port",
        "0",
        "--api-key",
        "k1",
        "--parallel",
        "2",
        "--served-name",
        "tiny-chat",
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("OpenAI-compatible API at http://127.0.0.1:"), line
        assert "model: tiny-chat, 2 slots" in line
        base = line.split(" at ")[1].split(" ")[0]
        c = client(base.removesuffix("/v1"), key="k1")
        assert [m.id for m in c.models.list().data] == ["tiny-chat"]
        r = c.chat.completions.create(
            model="tiny-chat",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=3,
            temperature=0,
        )
        assert r.usage.completion_tokens == 3
    finally:
        stop(proc)


@pytest.mark.parametrize(
    "extra,words",
    [
        (["--host", "0.0.0.0"], "--api-key"),
        (["--model", "other"], "one model"),
    ],
)
def test_refusals_are_one_line(model_dir, extra, words):
    env = {k: v for k, v in os.environ.items() if k != "ATTNLM_API_KEY"}
    r = attnlm_process("serve", "--api", "--model", model_dir, *extra, env=env, timeout=120)
    assert r.returncode == 2 and words in r.stderr and r.stderr.count("\n") == 1, r.stderr


@pytest.mark.parametrize("engine", ["1", "0"])
def test_a_gguf_file_is_served_on_the_c_engine(engine):
    if engine == "1" and not engine_rows(Engine):
        pytest.skip("the engine has no rows API")
    env = _with_src({**os.environ, "OMP_NUM_THREADS": "1", "ATTNLM_ENGINE": engine})
    cmd = [sys.executable, "-m", "attnlm", "serve", "--api", "--model", str(GGUF), "--port", "0",
           "--threads", "1", "--slot-context", "128"]  # fmt: skip
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        slots = min(8, 4 * (os.cpu_count() or 1))
        backend = "c-engine" if engine == "1" else "pytorch"
        assert f"model: llama-Q8_0, {slots} slots on {backend})" in line, line
        c = client(line.split(" at ")[1].split(" ")[0].removesuffix("/v1"))
        r = c.completions.create(model="llama-Q8_0", prompt="the cat", max_tokens=4,
                                 temperature=0)  # fmt: skip
        assert r.usage.completion_tokens + (r.choices[0].finish_reason == "stop") >= 1
    finally:
        stop(proc)
