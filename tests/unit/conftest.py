import pytest


@pytest.fixture(scope="module")
def one_intra_op_thread():
    """Small tensors: one intra-op thread is as fast and immune to CPU contention
    (use with ``pytestmark = pytest.mark.usefixtures("one_intra_op_thread")``)."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
