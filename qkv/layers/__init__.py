"""Attention layers: ``nn.Module``s that hold parameters and call :mod:`qkv.functional`."""

from .attention import Attention, SelfAttention
from .multihead import KVCache, MultiHeadAttention
from .pooling import AttentionPooling
from .transformer import FeedForward, PositionalEncoding, TransformerLayer, sinusoidal_positions

__all__ = ["Attention", "SelfAttention", "MultiHeadAttention", "KVCache", "AttentionPooling", "TransformerLayer",
           "FeedForward", "PositionalEncoding", "sinusoidal_positions"]
