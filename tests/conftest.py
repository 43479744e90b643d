import os

import pytest
import torch

# pytest-xdist runs one worker per core: give each worker its share of the threads.
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, (os.cpu_count() or 1) // _workers))


@pytest.fixture
def gen():
    """A fresh, seeded generator per test: inputs are random but reproducible on failure."""
    return torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little") if os.environ.get("QKV_RANDOM")
                                         else 1234)


@pytest.fixture
def one_thread():
    """Tiny models run fastest on one thread, and do not then fight other processes for the cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """``tiny_run(name)``: the directory of a tiny trained run of application ``name`` (see ``tests.helpers``),
    trained once per session (per test worker) and shared by the tests that only read it."""
    from tests.helpers import train_tiny

    root = tmp_path_factory.mktemp("tiny-runs")
    cache: dict[str, object] = {}

    def get(name: str):
        if name not in cache:
            cache[name] = train_tiny(name, root)
        return cache[name]

    get.root = root
    return get
