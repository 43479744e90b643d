"""Random-number-generator states as plain tensors (no pickle), to store in safetensors and gather across ranks.

Covered: torch's CPU generator, the current CUDA device's generator (when CUDA is in use), Python's
``random`` and NumPy's legacy global generator (when NumPy is installed).
"""

from __future__ import annotations

import contextlib
import random

import torch
from torch import Tensor

try:
    import numpy as np
except ImportError:  # pragma: no cover - numpy is optional
    np = None

__all__ = ["capture", "restore", "seed_all", "forked", "MAX_SEED"]

#: the largest seed torch's generators take (an option ``seed`` is checked against it where it enters)
MAX_SEED = 2**64 - 1


def capture() -> dict[str, Tensor]:
    """The current RNG states, each a CPU tensor of a fixed shape."""
    out = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state()
    version, words, gauss = random.getstate()
    out["python"] = torch.tensor([version, *words], dtype=torch.int64)
    out["python_gauss"] = torch.tensor([gauss is not None, gauss or 0.0], dtype=torch.float64)
    if np is not None:
        _, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
        out["numpy"] = torch.from_numpy(keys.astype(np.int64))
        out["numpy_extra"] = torch.tensor([pos, has_gauss, cached], dtype=torch.float64)
    return out


def restore(state: dict[str, Tensor]) -> None:
    """Set the RNGs to ``state`` (from :func:`capture`); generators missing from ``state`` are left alone."""
    torch.set_rng_state(state["torch"].to(torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"].to(torch.uint8))
    words = state["python"].tolist()
    has, gauss = state["python_gauss"].tolist()
    random.setstate((int(words[0]), tuple(int(w) for w in words[1:]), gauss if has else None))
    if np is not None and "numpy" in state:
        pos, has_gauss, cached = state["numpy_extra"].tolist()
        keys = state["numpy"].numpy().astype(np.uint32)
        np.random.set_state(("MT19937", keys, int(pos), int(has_gauss), float(cached)))


def seed_all(seed: int) -> None:
    """Seed torch (CPU and CUDA), Python's ``random`` and NumPy's global generator."""
    torch.manual_seed(seed)
    random.seed(seed)
    if np is not None:
        np.random.seed(seed % 2**32)


@contextlib.contextmanager
def forked():
    """Run a block without changing the RNG states seen after it (e.g. an evaluation during training)."""
    saved = capture()
    try:
        yield
    finally:
        restore(saved)
