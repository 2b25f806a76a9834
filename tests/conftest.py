"""Fixtures shared by several test files."""

import pytest
import torch


@pytest.fixture()
def one_thread():
    """Run the test with one torch thread (restored afterwards): training tests stay
    deterministic and do not fight over the 2 cores. Use with
    ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
