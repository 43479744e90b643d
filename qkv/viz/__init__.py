"""Pictures of attention (matplotlib, from the ``viz`` extra). Functions take plain tensors or arrays."""

from .heatmap import heatmap

__all__ = ["heatmap"]
