"""Attention masks, in one convention everywhere.

A **boolean** mask is ``True`` where attention is allowed, as in
:func:`torch.nn.functional.scaled_dot_product_attention`. A **floating** mask is an additive bias on the
scores; ``-inf`` in it forbids a position, exactly like ``False`` in a boolean mask.

Every mask broadcasts against the scores, whose shape is ``(..., Tq, Tk)``:

- ``B``: batch, ``H``: heads, ``Tq``: query positions, ``Tk``: key positions.

A query row with no allowed key gets all-zero weights and a zero output (never NaN); the core guarantees it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .background import compiling

__all__ = [
    "lengths_to_mask",
    "key_padding_mask",
    "causal_mask",
    "combine_masks",
    "from_torch_mask",
]


def lengths_to_mask(lengths: Tensor, max_len: int | None = None) -> Tensor:
    """Boolean ``(B, T)`` mask, ``True`` at the first ``lengths[b]`` positions of each row.

    Args:
        lengths: ``(B,)`` integer lengths, each in ``[0, max_len]``.
        max_len: ``T``; defaults to ``lengths.max()``.
    """
    if lengths.dim() != 1 or lengths.dtype.is_floating_point or lengths.dtype == torch.bool:
        raise ValueError(f"lengths must be a 1-D integer tensor, got shape {tuple(lengths.shape)} {lengths.dtype}")
    if compiling():  # traced (torch.compile, torch.export): no branch on the values
        if max_len is None:
            raise ValueError("lengths_to_mask needs max_len under torch.compile and torch.export (the longest "
                             "length is a value of the input, not a shape)")
        return torch.arange(max_len, device=lengths.device) < lengths[:, None]
    if max_len is None:
        max_len = int(lengths.max()) if lengths.numel() else 0
    if lengths.numel() and (int(lengths.min()) < 0 or int(lengths.max()) > max_len):
        raise ValueError(f"lengths must lie in [0, {max_len}], got min {int(lengths.min())} max {int(lengths.max())}")
    return torch.arange(max_len, device=lengths.device) < lengths[:, None]


def key_padding_mask(lengths: Tensor, max_len: int | None = None) -> Tensor:
    """Boolean ``(B, 1, Tk)`` mask that lets every query see the first ``lengths[b]`` keys.

    It broadcasts against scores of shape ``(B, Tq, Tk)``; add a head axis with ``[:, None]`` for
    ``(B, H, Tq, Tk)``.
    """
    return lengths_to_mask(lengths, max_len)[:, None, :]


def causal_mask(
    tq: int,
    tk: int | None = None,
    *,
    lower_right: bool = False,
    device: torch.device | str | None = None,
) -> Tensor:
    """Boolean ``(Tq, Tk)`` causal mask.

    With ``lower_right=False`` (the default) the diagonal starts at the top left: query ``i`` sees keys
    ``0..i``, which is what ``scaled_dot_product_attention(is_causal=True)`` does when ``Tq != Tk``.
    With ``lower_right=True`` the diagonal ends at the bottom right: the last query sees every key. That
    is the mask of incremental decoding, where the ``Tq`` new queries come after ``Tk - Tq`` cached keys.
    """
    tk = tq if tk is None else tk
    if tq < 0 or tk < 0:
        raise ValueError(f"causal_mask needs non-negative sizes, got Tq={tq}, Tk={tk}")
    offset = tk - tq if lower_right else 0
    # positions compared rather than tril(diagonal=offset): under torch.export the offset stays symbolic
    return torch.arange(tq, device=device)[:, None] + offset >= torch.arange(tk, device=device)[None, :]


def combine_masks(*masks: Tensor | None) -> Tensor | None:
    """Combine masks that must all hold: boolean masks are AND-ed, floating masks are added.

    A boolean and a floating mask combine into a floating mask (``-inf`` where the boolean one is
    ``False``). ``None`` entries are skipped; ``None`` is returned when nothing is left.
    """
    present = [m for m in masks if m is not None]
    if not present:
        return None
    for m in present:
        _check_mask_dtype(m)
    if all(m.dtype == torch.bool for m in present):
        out = present[0]
        for m in present[1:]:
            out = out & m
        return out
    dtype = next(m.dtype for m in present if m.dtype != torch.bool)
    out = None
    for m in present:
        if m.dtype == torch.bool:
            bias = torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill(~m, float("-inf"))
        else:
            bias = m.to(dtype)
        out = bias if out is None else out + bias
    return out


def from_torch_mask(attn_mask: Tensor | None = None, key_padding_mask: Tensor | None = None) -> Tensor | None:
    """Convert ``torch.nn.MultiheadAttention``'s masks into qkv's convention.

    PyTorch's boolean ``attn_mask`` and ``key_padding_mask`` are ``True`` where attention is *not*
    allowed; qkv's are ``True`` where it is. Floating masks are additive in both and pass through.

    Args:
        attn_mask: ``(Tq, Tk)`` or ``(B * H, Tq, Tk)`` (the latter is returned as given: reshape it to
            ``(B, H, Tq, Tk)`` yourself).
        key_padding_mask: ``(B, Tk)``; returned as ``(B, 1, 1, Tk)`` for ``(B, H, Tq, Tk)`` scores.
    """
    out_attn = None
    if attn_mask is not None:
        _check_mask_dtype(attn_mask)
        out_attn = ~attn_mask if attn_mask.dtype == torch.bool else attn_mask
    out_pad = None
    if key_padding_mask is not None:
        _check_mask_dtype(key_padding_mask)
        if key_padding_mask.dim() != 2:
            raise ValueError(f"key_padding_mask must be (B, Tk), got shape {tuple(key_padding_mask.shape)}")
        kpm = key_padding_mask[:, None, None, :]
        out_pad = ~kpm if kpm.dtype == torch.bool else kpm
    return combine_masks(out_attn, out_pad)


def _check_mask_dtype(mask: Tensor) -> None:
    if not isinstance(mask, Tensor):
        raise ValueError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool and not mask.dtype.is_floating_point:
        raise ValueError(
            f"mask must be bool (True = may attend) or floating (an additive bias), got dtype {mask.dtype}"
        )


def broadcast_batch(*shapes: tuple[int, ...]) -> tuple[int, ...] | None:
    """The broadcast of ``shapes``, or ``None`` when they do not broadcast.

    Plain Python on a few short tuples: ``torch.broadcast_shapes`` costs ~15 us a call, which shows next to a
    GPU kernel of a few hundred.
    """
    first = shapes[0]
    if not compiling() and all(sh == first for sh in shapes[1:]):
        return tuple(first)  # the common case, a few times faster (traced, sizes are compared one by one below)
    out: list[int] = []
    for dims in zip(*(((1,) * (max(map(len, shapes)) - len(sh)) + tuple(sh)) for sh in shapes), strict=True):
        sizes = [d for d in dims if d != 1]  # a list, not a set: symbolic sizes under torch.export are unhashable
        if any(d != sizes[0] for d in sizes[1:]):
            return None
        out.append(sizes[0] if sizes else 1)
    return tuple(out)


def prepare_mask(mask: Tensor | None, tq: int, tk: int,
                 batch: tuple[int, ...] | torch.Size | None = None) -> tuple[Tensor | None, Tensor | None]:
    """Split a user mask into ``(allowed, bias)`` for scores of shape ``(*batch, Tq, Tk)``.

    ``allowed`` is boolean (or ``None`` when every position is allowed); ``bias`` is a finite additive
    float tensor (or ``None``). Raises ``ValueError`` naming the problem for a wrong dtype or shape; the
    batch axes are checked when ``batch`` is given.
    """
    if mask is None:
        return None, None
    _check_mask_dtype(mask)

    def scores() -> str:  # (made only for an error: torch.compile traces no str() of sizes)
        return f"(..., Tq, Tk) = (..., {tq}, {tk})" if batch is None else str((*batch, tq, tk))

    if mask.dim() < 2:
        raise ValueError(f"mask must have at least 2 dims (..., Tq, Tk), got {tuple(mask.shape)}; scores {scores()}")
    mq, mk = mask.shape[-2:]
    bad = mq not in (1, tq) or mk not in (1, tk)
    if not bad and batch is not None:
        bad = broadcast_batch(tuple(mask.shape[:-2]), tuple(batch)) is None
    if bad:
        raise ValueError(f"mask {tuple(mask.shape)} does not broadcast to the scores {scores()}")
    if mask.dtype == torch.bool:
        return mask, None
    allowed = mask > float("-inf")
    if not compiling():  # (traced: no branch on the values)
        if bool((allowed & (mask < float("inf"))).all()):  # finite everywhere: one check in the common case
            return None, mask
        _check_mask_values(mask)
    return allowed, mask.masked_fill(~allowed, 0.0)


def _check_mask_values(mask: Tensor) -> None:
    """A ``ValueError`` for a floating mask holding NaN or ``+inf``: neither is a bias (NaN would forbid a position
    silently, ``+inf`` makes a row of NaN weights); ``-inf`` is the one non-finite value that means something."""
    nan, inf = int(torch.isnan(mask).sum()), int((mask == float("inf")).sum())
    if nan or inf:
        held = " and ".join(f"{n} {what}" for n, what in ((nan, "NaN"), (inf, "+inf")) if n)
        raise ValueError(f"mask {tuple(mask.shape)} holds {held}: a floating mask is an additive bias, finite or "
                         "-inf (a forbidden position); give a boolean mask (True = may attend) or finite values")
