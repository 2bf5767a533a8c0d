import pytest
import torch

import ckparity


@pytest.fixture(autouse=True)
def _fixed_threads():
    """Every test starts from the same thread counts and seed."""
    threads = ckparity.get_num_threads()
    torch.manual_seed(0)
    yield
    ckparity.set_num_threads(threads)
