"""Independent float64 references for the tests: explicit formulas, no qkv code paths."""

import torch
import torch.nn.functional as F


def scores_ref(score, q, k):
    """Raw scores by each paper's formula, from the module's own weights."""
    from qkv import scores as S

    if score in ("dot", "scaled_dot") or isinstance(score, (S.Dot,)):
        return torch.einsum("...qd,...kd->...qk", q, k)
    if score == "cosine" or isinstance(score, S.Cosine):
        return torch.einsum("...qd,...kd->...qk", q, k) / (
            q.norm(dim=-1)[..., :, None].clamp_min(1e-8) * k.norm(dim=-1)[..., None, :].clamp_min(1e-8))
    if isinstance(score, S.General):
        w, b = score.key_proj.weight, score.key_proj.bias
        s = torch.einsum("...qd,de,...ke->...qk", q, w, k)
        return s if b is None else s + (q @ b)[..., :, None]
    if isinstance(score, S.Additive):
        hq = q @ score.query_proj.weight.T
        hk = k @ score.key_proj.weight.T
        if score.key_proj.bias is not None:
            hk = hk + score.key_proj.bias
        return torch.tanh(hq[..., :, None, :] + hk[..., None, :, :]) @ score.v.weight[0]
    if isinstance(score, S.MLP):
        lead = (*torch.broadcast_shapes(q.shape[:-2], k.shape[:-2]), q.shape[-2], k.shape[-2])
        pair = torch.cat([q[..., :, None, :].expand(*lead, q.shape[-1]), k[..., None, :, :].expand(*lead, k.shape[-1])],
                         dim=-1)
        w1 = torch.cat([score.query_proj.weight, score.key_proj.weight], dim=1)
        h = F.linear(pair, w1, score.key_proj.bias)
        return score.head(h).squeeze(-1)
    if callable(score):
        return score(q, k)
    raise AssertionError(score)


def default_scale(score, k):
    if score == "scaled_dot":
        return k.shape[-1] ** -0.5
    return 1.0


def allowed_from(mask, shape):
    if mask is None:
        return torch.ones(shape, dtype=torch.bool)
    if mask.dtype == torch.bool:
        return mask.expand(shape)
    return (mask > float("-inf")).expand(shape)


def softmax_ref(s, allowed):
    s = s.masked_fill(~allowed, float("-inf"))
    if s.shape[-1] == 0:
        return s.clone()
    m = s.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m) * allowed
    z = e.sum(dim=-1, keepdim=True)
    return torch.where(z > 0, e / torch.where(z > 0, z, torch.ones_like(z)), torch.zeros_like(e))


def sparsemax_ref(s, allowed, iters=200):
    """Projection onto the simplex over the allowed entries, by bisection on the threshold.

    The bisection finds the support; the threshold is then recomputed from it, ``tau = (sum_S z - 1) / |S|``,
    so that the result is exact and its gradient is the projection's.
    """
    big = torch.finfo(s.dtype).max
    z = s.masked_fill(~allowed, -big)
    if z.shape[-1] == 0:
        return z.clone()
    with torch.no_grad():
        lo = z.amax(dim=-1, keepdim=True) - 1.0
        hi = z.amax(dim=-1, keepdim=True)
        for _ in range(iters):
            mid = (lo + hi) / 2
            total = (z - mid).clamp(min=0).sum(dim=-1, keepdim=True)
            lo = torch.where(total > 1, mid, lo)
            hi = torch.where(total > 1, hi, mid)
        support = (z > (lo + hi) / 2) & allowed
    n = support.sum(dim=-1, keepdim=True)
    tau = (torch.where(support, z, torch.zeros_like(z)).sum(dim=-1, keepdim=True) - 1) / n.clamp(min=1)
    p = torch.where(support, z - tau, torch.zeros_like(z)).clamp(min=0)
    return torch.where(allowed.any(-1, keepdim=True), p, torch.zeros_like(p))


def attention_ref(q, k, v, score="scaled_dot", mask=None, normalize="softmax", scale=None):
    s = scores_ref(score, q, k) * (default_scale(score, k) if scale is None else scale)
    if mask is not None and mask.dtype != torch.bool:
        s = s + mask.masked_fill(mask == float("-inf"), 0.0)
    allowed = allowed_from(mask, s.shape)
    w = softmax_ref(s, allowed) if normalize == "softmax" else sparsemax_ref(s, allowed)
    return w @ v, w
