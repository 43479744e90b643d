"""Groups of options that several applications share, as dataclasses their ``NAMEOptions`` inherit: one
definition of each flag (its name, bounds and help) for all of them."""

from __future__ import annotations

from dataclasses import dataclass

from ..options import option

__all__ = ["TRANSFORMER", "TransformerOptions"]

#: ``applies=`` of the options that only a Transformer model has
TRANSFORMER = {"model": ("transformer",)}


@dataclass
class TransformerOptions:
    """The width of an application's Transformer model (``model="transformer"``): ``dim``, ``num_heads`` and
    ``ffn_dim``; :meth:`check_heads` checks that the heads divide the width."""

    dim: int = option(128, low=2, applies=TRANSFORMER, help="transformer: model width")
    num_heads: int = option(4, low=1, applies=TRANSFORMER, help="transformer: attention heads")
    ffn_dim: int | None = option(None, low=1, applies=TRANSFORMER, help="transformer: feed-forward width "
                                 "(default: 4 x dim)")

    def check_heads(self) -> None:
        """``ValueError`` when a Transformer's ``num_heads`` does not divide its ``dim``."""
        if getattr(self, "model", None) == "transformer" and self.dim % self.num_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must divide dim ({self.dim})")
