"""Attention layers: ``nn.Module``s that hold parameters and call :mod:`qkv.functional`."""

from .attention import Attention, SelfAttention
from .multihead import KVCache, MultiHeadAttention
from .pooling import AttentionPooling

__all__ = ["Attention", "SelfAttention", "MultiHeadAttention", "KVCache", "AttentionPooling"]
