"""Old spellings of the layers' size arguments, still accepted with a ``DeprecationWarning``.

One vocabulary for sizes across :mod:`qkv.layers` and :mod:`qkv.scores` (the README's table):

- ``dim``: the features of a layer's input sequence (and output);
- ``query_dim``, ``key_dim``, ``value_dim``: the features of the queries, keys and values a layer is given
  (:class:`~qkv.Attention`, :class:`~qkv.MultiHeadAttention`, the scores) or, for :class:`~qkv.SelfAttention`, which
  is given one sequence only, makes;
- ``hidden_dim``: a hidden layer inside the attention (the additive/MLP score's; attention pooling's keys).

========================  ====================================  ======================================
layer                     old                                   new
========================  ====================================  ======================================
``SelfAttention``         ``in_dim``, ``qk_dim``, ``v_dim``     ``dim``, ``key_dim``, ``value_dim``
``MultiHeadAttention``    ``kdim``, ``vdim``                    ``key_dim``, ``value_dim``
========================  ====================================  ======================================
"""

from __future__ import annotations

import warnings
from typing import Any

__all__ = ["renamed"]


def renamed(owner: str, old: dict[str, Any], mapping: dict[str, str], given: dict[str, Any]) -> dict[str, Any]:
    """``given`` (new name -> value, None when not given) with the values of ``old`` (old name -> value) moved to
    their new names by ``mapping`` (old -> new), each with a ``DeprecationWarning``; ``TypeError`` for a name that is
    neither, or for a size given under both names."""
    out = dict(given)
    for name, value in old.items():
        if name not in mapping:
            raise TypeError(f"{owner}() got an unexpected keyword argument {name!r}")
        new = mapping[name]
        if out.get(new) is not None:
            raise TypeError(f"{owner}() got both {new}= and its old spelling {name}=; give {new}= only")
        warnings.warn(f"{owner}({name}=...) is now {owner}({new}=...); the old name will be removed",
                      DeprecationWarning, stacklevel=3)
        out[new] = value
    return out
