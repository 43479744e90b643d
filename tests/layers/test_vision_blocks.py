"""Vision blocks: each against a hand-written reference of its paper's formula, plus shapes, gradients,
attention maps, state_dict round trips and argument errors for every factory name."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from qkv import vision
from qkv.vision.non_local import MODES

B, C, H, W = 2, 16, 6, 5
DT = torch.float64


def randomize(module: nn.Module, seed: int = 0) -> nn.Module:
    """Random weights and norm statistics, so that no reference passes by a zero or an identity init."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.5)
        for m in module.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g, dtype=DT) * 0.3)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g, dtype=DT) + 0.5)
    return module.eval()


def make(name, channels=C, **kw):
    return randomize(vision.create(name, channels, dtype=DT, **kw))


def bn(x, m: nn.BatchNorm2d):
    """Batch norm in eval mode, by its formula."""
    shape = (1, -1, 1, 1)
    return (x - m.running_mean.view(shape)) / torch.sqrt(m.running_var.view(shape) + m.eps) * m.weight.view(shape) \
        + m.bias.view(shape)


def fc(z, conv: nn.Conv2d):
    """A 1x1 convolution on ``(B, C_in)`` as the fully connected layer ``W z + b``."""
    out = z @ conv.weight.flatten(1).T
    return out if conv.bias is None else out + conv.bias


@pytest.fixture
def x():
    return torch.randn(B, C, H, W, dtype=DT)


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


# ------------------------------------------------------------------------------------- references


def test_se_matches_paper(x):
    se = make("se", reduction=4)
    z = x.mean(dim=(2, 3))
    s = torch.sigmoid(fc(torch.relu(fc(z, se.fc1)), se.fc2))
    out, attn = se(x, return_attention=True)
    close(out, x * s[:, :, None, None])
    close(attn, s[:, :, None, None])
    assert se.fc1.out_channels == C // 4


def test_eca_matches_paper(x):
    channels = 64
    eca = make("eca", channels)
    assert eca.kernel_size == 3  # |log2(64)/2 + 1/2| = 3.5 -> 3, odd
    x = torch.randn(B, channels, 3, 4, dtype=DT)
    y = x.mean(dim=(2, 3))
    k = eca.kernel_size
    w = eca.conv.weight.view(k)
    padded = F.pad(y, (k // 2, k // 2))
    conv = torch.stack([sum(w[j] * padded[:, c + j] for j in range(k)) for c in range(channels)], dim=1)
    s = torch.sigmoid(conv)
    out, attn = eca(x, return_attention=True)
    close(out, x * s[:, :, None, None])
    close(attn.view(B, channels), s)


@pytest.mark.parametrize("channels, k", [(64, 3), (256, 5), (512, 5), (2048, 7), (1, 1)])
def test_eca_adaptive_kernel(channels, k):
    assert vision.eca_kernel_size(channels) == k


def test_cbam_matches_paper(x):
    cbam = make("cbam", reduction=4)
    gate = cbam.channel

    def shared(z):  # the one MLP of both pools: SE's fc1, ReLU, fc2
        return fc(torch.relu(fc(z, gate.fc1)), gate.fc2)

    mc = torch.sigmoid(shared(x.mean(dim=(2, 3))) + shared(x.amax(dim=(2, 3))))[:, :, None, None]
    x1 = x * mc
    pooled = torch.cat([x1.mean(1, keepdim=True), x1.amax(1, keepdim=True)], 1)
    ms = torch.sigmoid(F.conv2d(pooled, cbam.spatial.conv.weight, padding=3))
    out, maps = cbam(x, return_attention=True)
    close(out, x1 * ms)
    close(maps.channel, mc)
    close(maps.spatial, ms)
    assert isinstance(gate, vision.SqueezeExcite) and gate.fc1.out_channels == C // 4
    # the parts alone
    channel = make("cbam_channel", reduction=2)
    s = torch.sigmoid(fc(torch.relu(fc(x.mean(dim=(2, 3)), channel.fc1)), channel.fc2)
                      + fc(torch.relu(fc(x.amax(dim=(2, 3)), channel.fc1)), channel.fc2))[:, :, None, None]
    close(channel(x), x * s)
    part = make("cbam_spatial", kernel_size=3)
    pooled = torch.cat([x.mean(1, keepdim=True), x.amax(1, keepdim=True)], 1)
    close(part(x), x * torch.sigmoid(F.conv2d(pooled, part.conv.weight, padding=1)))


@pytest.mark.parametrize("dilate", [True, False])
def test_sk_matches_paper(x, dilate):
    sk = make("sk", out_channels=8, kernel_sizes=(3, 5), groups=2, reduction=4, min_hidden_channels=3, dilate=dilate,
              stride=2)
    branches = []
    for k, branch in zip((3, 5), sk.branches, strict=True):
        conv = branch[0]
        dilation = 2 if dilate and k == 5 else 1
        u = F.conv2d(x, conv.weight, stride=2, padding=dilation * (conv.kernel_size[0] // 2), dilation=dilation,
                     groups=2)
        branches.append(torch.relu(bn(u, branch[1])))
    assert sk.branches[1][0].kernel_size == ((3, 3) if dilate else (5, 5))
    s = sum(branches).mean(dim=(2, 3))
    z = torch.relu(bn(fc(s, sk.reduce[0])[..., None, None], sk.reduce[1])).flatten(1)
    assert z.shape[1] == max(8 // 4, 3)
    logits = fc(z, sk.select).view(B, 2, 8)
    a = torch.softmax(logits, dim=1)
    ref = a[:, 0, :, None, None] * branches[0] + a[:, 1, :, None, None] * branches[1]
    out, attn = sk(x, return_attention=True)
    close(out, ref)
    close(attn, a)


def nonlocal_reference(block, x):
    """y_i = 1/C(x) sum_j f(x_i, x_j) g(x_j); z = BN(W_z y) + x, written out position by position."""
    b, c, h, w = x.shape

    def embed(conv, t):
        return torch.einsum("oc,bchw->bohw", conv.weight.flatten(1), t) + conv.bias.view(1, -1, 1, 1)

    def flat(t):
        return t.flatten(2).transpose(1, 2)  # (B, positions, C')

    if block.mode == "gaussian":
        theta, phi = x, x
    else:
        theta, phi = embed(block.theta, x), embed(block.phi, x)
    g = embed(block.g, x)
    if block.subsample:
        phi, g = F.max_pool2d(phi, 2), F.max_pool2d(g, 2)
    theta, phi, g = flat(theta), flat(phi), flat(g)
    n = phi.shape[1]
    if block.mode in ("embedded_gaussian", "gaussian"):
        f = torch.exp(theta @ phi.transpose(1, 2))
        weights = f / f.sum(-1, keepdim=True)
    elif block.mode == "dot":
        weights = theta @ phi.transpose(1, 2) / n
    else:  # concat: relu(w^T [theta_i; phi_j])
        wf = torch.cat([block.score.query_proj.weight, block.score.key_proj.weight], dim=1).view(-1)
        k = theta.shape[-1]
        pairs = torch.cat([theta[:, :, None, :].expand(-1, -1, n, -1), phi[:, None, :, :].expand(-1, h * w, -1, -1)],
                          dim=-1)
        weights = torch.relu(pairs @ wf) / n
        assert wf.shape == (2 * k,)
    y = (weights @ g).transpose(1, 2).reshape(b, -1, h, w)
    z = bn(embed(block.out, y), block.norm) + x
    return z, weights


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("subsample", [False, True])
def test_non_local_matches_paper(mode, subsample):
    x = torch.randn(B, C, 6, 4, dtype=DT) * 0.3
    block = make("non_local", mode=mode, subsample=subsample)
    ref, ref_w = nonlocal_reference(block, x)
    out, weights = block(x, return_attention=True)
    n_keys = (6 // 2) * (4 // 2) if subsample else 24
    assert weights.shape == (B, 24, n_keys)
    close(weights, ref_w)
    close(out, ref)
    close(block(x), out)  # the fast path (no weights) agrees


def test_non_local_starts_as_identity(x):
    block = vision.create("non_local", C, dtype=DT)
    close(block(x), x)
    block = vision.create("non_local", C, norm_layer=None, dtype=DT)
    close(block(x), x)


def test_non_local_goes_through_core_attention(monkeypatch, x):
    import qkv.vision.non_local as nl

    calls = []
    real = nl.attention

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(nl, "attention", spy)
    make("non_local", mode="concat")(x)
    assert calls and isinstance(calls[0]["score"], nl.NonLocalConcatScore)


def test_bisenet_arm_and_ffm_match_paper(x):
    arm = make("arm")
    w = torch.sigmoid(bn(fc(x.mean(dim=(2, 3)), arm.conv)[..., None, None], arm.norm))
    out, attn = arm(x, return_attention=True)
    close(out, x * w)
    close(attn, w)

    ffm = make("ffm", 24, out_channels=C, reduction=2)
    xs, xc = torch.randn(B, 8, H, W, dtype=DT), torch.randn(B, 16, H, W, dtype=DT)
    u = torch.relu(bn(F.conv2d(torch.cat([xs, xc], 1), ffm.fuse[0].weight), ffm.fuse[1]))
    a = torch.sigmoid(fc(torch.relu(fc(u.mean(dim=(2, 3)), ffm.attn[0])), ffm.attn[2]))[:, :, None, None]
    out, attn = ffm(xs, xc, return_attention=True)
    close(out, u + u * a)
    close(attn, a)


# ------------------------------------------------------------------------- every factory name


KWARGS = {"se": {"reduction": 4}, "cbam": {"reduction": 4}, "cbam_channel": {"reduction": 4}, "sk": {"reduction": 4},
          "ffm": {"reduction": 4}}


def build(name):
    torch.manual_seed(0)
    return vision.create(name, C, **KWARGS.get(name, {}))


def check_attention(name, attn, h=H, w=W):
    if name == "cbam":
        check_attention("cbam_channel", attn.channel, h, w)
        check_attention("cbam_spatial", attn.spatial, h, w)
    elif name == "cbam_spatial":
        assert attn.shape == (B, 1, h, w)
        assert ((attn >= 0) & (attn <= 1)).all()
    elif name == "sk":
        assert attn.shape == (B, 2, C)
        torch.testing.assert_close(attn.sum(1), torch.ones(B, C))
        assert (attn >= 0).all()
    elif name == "non_local":
        assert attn.shape == (B, h * w, h * w)
        torch.testing.assert_close(attn.sum(-1), torch.ones(B, h * w))
    else:
        assert attn.shape == (B, C, 1, 1)
        assert ((attn >= 0) & (attn <= 1)).all()


@pytest.mark.parametrize("name", vision.list_blocks())
def test_shapes_gradients_and_maps(name):
    block = build(name).train()
    x = torch.randn(B, C, H, W, requires_grad=True)
    out, attn = block(x, return_attention=True)
    assert out.shape == (B, C, H, W)
    check_attention(name, attn)
    out.square().mean().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    for pname, p in block.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname
    # attention is returned, never stashed on the module
    assert not any(isinstance(v, torch.Tensor) and v is attn for v in vars(block).values())


@pytest.mark.parametrize("name", vision.list_blocks())
def test_state_dict_round_trip(name):
    a = randomize(vision.create(name, C, **KWARGS.get(name, {})), seed=1)
    b = randomize(vision.create(name, C, **KWARGS.get(name, {})), seed=2)
    x = torch.randn(B, C, H, W)
    assert not torch.allclose(a(x), b(x))
    b.load_state_dict(a.state_dict())
    torch.testing.assert_close(b(x), a(x))


@pytest.mark.parametrize("name", vision.list_blocks())
def test_device_and_dtype(name):
    block = vision.create(name, C, dtype=torch.float64, device="cpu", **KWARGS.get(name, {}))
    assert {p.dtype for p in block.parameters()} == {torch.float64}
    assert block(torch.randn(B, C, H, W, dtype=torch.float64)).dtype == torch.float64


def test_factory_names_and_aliases():
    assert vision.list_blocks() == list(vision.BLOCKS)
    assert isinstance(vision.create("Non-Local", 8), vision.NonLocal)
    assert isinstance(vision.create("squeeze_excite", 32), vision.SqueezeExcite)
    assert isinstance(vision.create("non_local", 8, mode="dot_product"), vision.NonLocal)


@pytest.mark.parametrize("name, channels, kwargs, match", [
    ("nope", 8, {}, "unknown vision block 'nope'"),
    ("se", 8, {"reduction": 16}, "reduction=16 is larger than channels=8"),
    ("cbam", 8, {"reduction": 32}, "reduction=32 is larger than channels=8"),
    ("sk", 8, {"reduction": 9}, "larger than channels"),
    ("se", 0, {}, "channels must be a positive int"),
    ("eca", 16, {"kernel_size": 4}, "odd"),
    ("cbam_spatial", 16, {"kernel_size": 6}, "odd"),
    ("sk", 16, {"kernel_sizes": (3,)}, "at least two branches"),
    ("sk", 16, {"groups": 3}, "groups=3 must divide"),
    ("non_local", 16, {"mode": "cosine"}, "unknown non-local mode"),
    ("eca", 16, {"reduction": 4}, "does not take these arguments"),
    ("se", 16, {"act_layer": "swishy"}, "unknown layer 'swishy'"),
])
def test_bad_arguments(name, channels, kwargs, match):
    with pytest.raises(ValueError, match=match):
        vision.create(name, channels, **kwargs)


@pytest.mark.parametrize("name", vision.list_blocks())
def test_wrong_input_shape(name):
    block = build(name)
    with pytest.raises(ValueError, match=r"\(2, 3, 5, 5\)"):
        block(torch.randn(2, 3, 5, 5))


def test_layers_by_name():
    se = vision.create("se", 16, act_layer="silu", gate_layer="hard_sigmoid")
    assert isinstance(se.act, nn.SiLU) and isinstance(se.gate, nn.Hardsigmoid)


def test_non_local_weights_are_a_distribution_over_subsampled_keys():
    """Odd sizes: the 2x2 pool of the keys floors (7x9 positions, 3x4 keys), as the reference's does."""
    block = make("non_local", subsample=True)
    x = torch.randn(B, C, 7, 9, dtype=DT) * 0.3
    out, w = block(x, return_attention=True)
    assert w.shape == (B, 63, 3 * 4)
    torch.testing.assert_close(w.sum(-1), torch.ones(B, 63, dtype=DT))
    assert (w >= 0).all()
    ref, ref_w = nonlocal_reference(block, x)
    close(w, ref_w)
    close(out, ref)
