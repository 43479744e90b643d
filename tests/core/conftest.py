"""Fixtures of the core's tests."""

import pytest

from qkv import compiled


@pytest.fixture
def compile_now():
    """Compile qkv's kernels on first use (``QKV_COMPILE=1``), whatever the environment says."""
    compiled.set_compile(True)
    yield
    compiled.set_compile(None)
