"""qkv: attention mechanisms for PyTorch.

The three stages (similarity -> normalisation -> weighted sum) are plain functions in
:mod:`qkv.functional`; scores live in :mod:`qkv.scores`, normalisers in :mod:`qkv.normalize`, masks in
:mod:`qkv.masks`; the layers (:class:`Attention`, :class:`SelfAttention`, :class:`MultiHeadAttention`)
hold parameters and call them. The core reports to :mod:`qkv.hooks`, which :func:`capture_attention` subscribes to.
"""

__version__ = "0.2.0"

from . import hooks, masks, mods, normalize, scores
from .capture import AttentionRecord, attention_rollout, capture_attention
from .compiled import set_compile
from .functional import attention, compute_scores, normalize_scores, plan, weighted_sum
from .layers import Attention, AttentionPooling, KVCache, MultiHeadAttention, SelfAttention
from .location import Coverage, LocationAware, StatefulScore
from .path_table import trace_paths
from .paths.common import set_zero_unseen_keys

__all__ = [
    "__version__",
    "attention",
    "plan",
    "trace_paths",
    "compute_scores",
    "normalize_scores",
    "weighted_sum",
    "Attention",
    "SelfAttention",
    "MultiHeadAttention",
    "KVCache",
    "AttentionPooling",
    "LocationAware",
    "Coverage",
    "StatefulScore",
    "capture_attention",
    "AttentionRecord",
    "attention_rollout",
    "set_compile",
    "set_zero_unseen_keys",
    "hooks",
    "masks",
    "mods",
    "normalize",
    "scores",
]
