"""``attnlm serve --api`` as a user runs it: a whole server process on a free port that the
``openai`` client talks to (with its API key), and the refusals in one line with exit 2: a
non-loopback --host without --api-key, several models, a port in use."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

pytest.importorskip("openai")
from api_server_support import client, tiny_tools_model  # noqa: E402

from support import _with_src, attnlm_process  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_tools_model(tmp_path_factory.mktemp("cli") / "tiny")


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
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


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
