"""Mask helpers and normalisers."""

import pytest
import torch
import torch.nn.functional as F

from qkv import masks
from qkv.normalize import get_normalizer, sparsemax
from tests.reference import sparsemax_ref


def test_lengths_to_mask_and_key_padding():
    m = masks.lengths_to_mask(torch.tensor([2, 0, 3]), 4)
    assert m.tolist() == [[True, True, False, False], [False] * 4, [True, True, True, False]]
    assert masks.key_padding_mask(torch.tensor([1, 2])).shape == (2, 1, 2)
    with pytest.raises(ValueError, match="lengths must lie in"):
        masks.lengths_to_mask(torch.tensor([5]), 4)
    with pytest.raises(ValueError, match="1-D integer"):
        masks.lengths_to_mask(torch.tensor([1.0]))


def test_broadcast_batch_is_torchs_broadcast(gen):
    """Batch axes of random shapes (equal, broadcastable or not, as tuples or torch.Size) broadcast as
    torch.broadcast_shapes does, or give None where it refuses."""
    for _ in range(300):
        n = int(torch.randint(1, 4, (1,), generator=gen))
        base = torch.randint(1, 4, (int(torch.randint(0, 4, (1,), generator=gen)),), generator=gen).tolist()
        shapes = []
        for _ in range(n):
            sh = [d if torch.rand(1, generator=gen) < 0.6 else int(torch.randint(1, 4, (1,), generator=gen))
                  for d in base]
            if torch.rand(1, generator=gen) < 0.3:  # fewer axes: broadcast from the left
                sh = sh[int(torch.randint(0, len(sh) + 1, (1,), generator=gen)):]
            shapes.append(torch.Size(sh) if torch.rand(1, generator=gen) < 0.5 else tuple(sh))
        try:
            want = tuple(torch.broadcast_shapes(*shapes))
        except RuntimeError:
            want = None
        assert masks.broadcast_batch(*shapes) == want, shapes


@pytest.mark.parametrize("tq,tk", [(4, 4), (2, 5), (5, 2)])
def test_causal_mask_alignments(tq, tk):
    # top left is what SDPA's is_causal does; check against SDPA's own weights through one-hot values
    q, k = torch.zeros(tq, 3), torch.zeros(tk, 3)
    w = F.scaled_dot_product_attention(q, k, torch.eye(tk), is_causal=True)
    assert torch.equal(masks.causal_mask(tq, tk), w > 0)
    lr = masks.causal_mask(tq, tk, lower_right=True)
    for i in range(tq):
        assert lr[i].sum() == max(0, min(tk, tk - tq + i + 1))
    assert lr[-1].all()


def test_combine_and_from_torch():
    a = torch.tensor([[True, False], [True, True]])
    b = torch.tensor([[True, True], [False, True]])
    assert torch.equal(masks.combine_masks(a, None, b), a & b)
    f = masks.combine_masks(a, torch.tensor([[0.5, 0.0], [1.0, 2.0]]))
    assert f.dtype == torch.float32 and f[0, 1] == float("-inf") and f[1, 1] == 2.0
    assert masks.combine_masks(None) is None
    kpm = torch.tensor([[False, True]])  # torch: True = padding
    out = masks.from_torch_mask(attn_mask=torch.tensor([[False, True], [False, False]]), key_padding_mask=kpm)
    assert out.shape == (1, 1, 2, 2) and out[0, 0].tolist() == [[True, False], [True, False]]
    with pytest.raises(ValueError, match="key_padding_mask must be"):
        masks.from_torch_mask(key_padding_mask=torch.zeros(3, dtype=torch.bool))


def test_sparsemax_matches_projection(gen):
    z = torch.randn(50, 7, generator=gen, dtype=torch.float64) * 2
    p = sparsemax(z)
    torch.testing.assert_close(p, sparsemax_ref(z, torch.ones_like(z, dtype=torch.bool)))
    torch.testing.assert_close(p.sum(-1), torch.ones(50, dtype=torch.float64))
    assert (p == 0).any()  # sparse
    # known case: a clear winner takes all
    assert sparsemax(torch.tensor([[3.0, 0.0, 0.0]])).tolist() == [[1.0, 0.0, 0.0]]
    assert torch.allclose(sparsemax(torch.tensor([[0.5, 0.0]])), torch.tensor([[0.75, 0.25]]))


def test_sparsemax_gradcheck(gen):
    z = torch.randn(6, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(sparsemax, (z,))


def test_get_normalizer():
    assert get_normalizer("sparsemax") is sparsemax
    fn = get_normalizer(lambda s: s)
    assert fn(torch.ones(1)).item() == 1
    with pytest.raises(ValueError, match="unknown normalize 'entmax'"):
        get_normalizer("entmax")
