"""Test-wide settings."""

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def one_thread():
    """The tests' micro models run fastest on one thread; on a shared, loaded 2-core machine a
    second OpenMP thread can make each tiny kernel wait milliseconds. (Subprocess tests set
    OMP_NUM_THREADS themselves.)"""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
