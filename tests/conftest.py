"""Fixtures shared by the test folders (which mirror ``src/attnlm``). Constants and the
command-line runners they use are in ``support.py``."""

import pytest
import torch

from support import CITIZENS, ROMEO, run_cli


@pytest.fixture()
def one_thread():
    """Run the test with one torch thread (restored afterwards): training tests stay
    deterministic and do not fight over the 2 cores. Use with
    ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture()
def cli(capsys):
    """``cli("train", "--preset", ...)`` runs ``attnlm`` in this process and returns its
    ``CliResult`` (exit code, stdout, stderr)."""
    return lambda *argv: run_cli(capsys, *argv)


@pytest.fixture()
def corpus(tmp_path):
    """A small Shakespeare corpus (:data:`support.CITIZENS`) as a UTF-8 file."""
    path = tmp_path / "corpus.txt"
    path.write_text(CITIZENS, encoding="utf-8")
    return path


@pytest.fixture()
def romeo_file(tmp_path):
    """:data:`support.ROMEO` as a UTF-8 file."""
    path = tmp_path / "romeo.txt"
    path.write_text(ROMEO, encoding="utf-8")
    return path
