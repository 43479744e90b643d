"""qkv.mods and qkv.attention(score_mod=, mask_mod=): explicit float64 formulas, the fused FlexAttention path
against the reference path, fully masked rows, gradients, layers and KV-cache decoding."""

import logging
import math

import pytest
import torch

import qkv
from qkv import compiled, flex, mods
from qkv.models import TransformerConfig, TransformerSeq2Seq

B, H, T, D = 2, 4, 8, 8
DOUBLE = {"dtype": torch.float64}


def qkv_(gen, b=B, h=H, tq=T, tk=T, d=D, dtype=torch.float64):
    return (torch.randn(b, h, tq, d, generator=gen, dtype=dtype), torch.randn(b, h, tk, d, generator=gen, dtype=dtype),
            torch.randn(b, h, tk, d, generator=gen, dtype=dtype))


def explicit(q, k, v, bias=None, allowed=None):
    """softmax(q k^T / sqrt(d) + bias) v over the allowed keys; rows with none: zero."""
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if bias is not None:
        s = s + bias
    if allowed is not None:
        s = s.masked_fill(~allowed, float("-inf"))
    w = torch.softmax(s, -1).nan_to_num(0.0)
    return w @ v, w


def rel(tq=T, tk=T):
    return torch.arange(tq)[:, None] - torch.arange(tk)[None]  # q - k


def test_alibi_slopes_match_the_paper():
    torch.testing.assert_close(mods.alibi_slopes(8), torch.tensor([2.0 ** -i for i in range(1, 9)]))
    torch.testing.assert_close(mods.alibi_slopes(6), torch.tensor([2.0 ** -e for e in (2, 4, 6, 8, 1, 3)]))
    with pytest.raises(ValueError, match="num_heads"):
        mods.alibi_slopes(0)


def t5_bucket(r: int, bidirectional: bool, num_buckets: int, max_distance: int) -> int:
    """T5's bucket of relative position r = key - query, one scalar at a time."""
    out = 0
    if bidirectional:
        num_buckets //= 2
        out += num_buckets if r > 0 else 0
        n = abs(r)
    else:
        n = max(-r, 0)
    exact = num_buckets // 2
    if n < exact:
        return out + n
    large = exact + int(math.log(n / exact) / math.log(max_distance / exact) * (num_buckets - exact))
    return out + min(large, num_buckets - 1)


@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_buckets(bidirectional):
    bias = mods.RelativePositionBias(2, 32, 128, bidirectional=bidirectional)
    r = torch.arange(-300, 300)
    expected = torch.tensor([t5_bucket(int(x), bidirectional, 32, 128) for x in r])
    assert torch.equal(bias.bucket(r), expected)


def test_every_modifier_against_its_formula(gen):
    q, k, v = qkv_(gen)
    d = rel()
    slopes = mods.alibi_slopes(H).double()[None, :, None, None]
    t5 = mods.relative_position_bias(num_buckets=8, max_distance=16, num_heads=H)
    with torch.no_grad():
        t5.bias.copy_(torch.randn(8, H, generator=gen))
    t5_bias = t5.bias.double()[t5.bucket(-d)].permute(2, 0, 1)[None]
    ids = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2], [0, 1, 1, 1, 1, 1, 2, 2]])
    scores = q @ k.transpose(-1, -2) / math.sqrt(D)
    cases = {
        "alibi": ({"score_mod": mods.alibi(H)}, -slopes * d, None),
        "alibi symmetric": ({"score_mod": mods.alibi(H, symmetric=True)}, -slopes * d.abs(), None),
        "t5": ({"score_mod": t5}, t5_bias, None),
        "softcap": ({"score_mod": mods.softcap(0.5)}, 0.5 * torch.tanh(scores / 0.5) - scores, None),
        "causal": ({"mask_mod": mods.causal}, None, d >= 0),
        "sliding": ({"mask_mod": mods.sliding_window(3)}, None, (d >= 0) & (d < 3)),
        "sliding both sides": ({"mask_mod": mods.sliding_window(2, causal=False)}, None, d.abs() < 2),
        "document": ({"mask_mod": mods.document(ids)}, None, (ids[:, :, None] == ids[:, None, :])[:, None]),
        "prefix": ({"mask_mod": mods.prefix_lm(3)}, None, (torch.arange(T)[None] < 3) | (d >= 0)),
        "prefix per row": ({"mask_mod": mods.prefix_lm(torch.tensor([2, 5]))}, None,
                           ((torch.arange(T)[None, None] < torch.tensor([2, 5])[:, None, None])
                            | (d >= 0))[:, None]),
        "chained": ({"score_mod": mods.chain(mods.alibi(H), mods.softcap(2.0))},
                    2.0 * torch.tanh((scores - slopes * d) / 2.0) - scores, None),
        "and/or": ({"mask_mod": mods.or_masks(mods.and_masks(mods.causal, mods.sliding_window(2)),
                                              lambda b, h, q_idx, kv_idx: kv_idx < 1)}, None,  # a sink
                   ((d >= 0) & (d < 2)) | (torch.arange(T)[None] < 1)),
    }
    for name, (kw, bias, allowed) in cases.items():
        allowed4 = None if allowed is None else allowed.expand(B, H, T, T) if allowed.dim() == 4 else allowed
        want_out, want_w = explicit(q, k, v, bias, allowed4)
        out, w = qkv.attention(q, k, v, return_weights=True, **kw)
        torch.testing.assert_close(w, want_w, msg=name)
        torch.testing.assert_close(out, want_out, msg=name)


def test_combined_with_mask_causal_and_offset(gen):
    q, k, v = qkv_(gen, tq=3, tk=8)
    key_mask = torch.tensor([[True] * 8, [True] * 6 + [False] * 2])[:, None, None]
    k = k.masked_fill(~key_mask.transpose(-1, -2), float("nan"))  # padding garbage must not leak
    d = (torch.arange(3)[:, None] + 5) - torch.arange(8)[None]  # the 3 queries come after 5 cached keys
    slopes = mods.alibi_slopes(H).double()[None, :, None, None]
    want, _ = explicit(q, k.nan_to_num(0.0), v, -slopes * d, (d >= 0) & key_mask)
    out = qkv.attention(q, k, v, mask=key_mask, score_mod=mods.alibi(H), mask_mod=mods.causal, q_offset=5)
    torch.testing.assert_close(out, want)
    # is_causal folds into the modifiers with the same offset
    torch.testing.assert_close(qkv.attention(q, k, v, mask=key_mask, score_mod=mods.alibi(H), is_causal=True,
                                             q_offset=5), want)


def test_fully_masked_rows_are_zero_never_nan(gen):
    q, k, v = qkv_(gen)
    nobody = lambda b, h, q_idx, kv_idx: (q_idx != 2) & (kv_idx >= 0)  # noqa: E731 - row 2 sees no key
    out, w = qkv.attention(q, k, v, mask_mod=nobody, score_mod=mods.alibi(H), return_weights=True)
    assert torch.equal(out[:, :, 2], torch.zeros_like(out[:, :, 2])) and torch.equal(w[:, :, 2], torch.zeros(B, H, T))
    assert torch.isfinite(out).all()


def test_gradients_of_the_reference_path(gen):
    q, k, v = (t.requires_grad_() for t in qkv_(gen, b=1, h=2, tq=4, tk=5, d=3))
    t5 = mods.RelativePositionBias(2, 8, 16, bidirectional=False).double()
    with torch.no_grad():
        t5.bias.normal_()

    def f(q, k, v, bias):  # T5's bucketing with the table as an input, then soft-capping
        def learned(score, b, h, q_idx, kv_idx):
            return score + bias[t5.bucket(kv_idx - q_idx), h]

        return qkv.attention(q, k, v, score_mod=mods.chain(learned, mods.softcap(3.0)), mask_mod=mods.causal)

    assert torch.autograd.gradcheck(f, (q, k, v, t5.bias.detach().clone().requires_grad_()))
    out = qkv.attention(q, k, v, score_mod=t5)
    out.sum().backward()
    big = torch.randn(1, 2, 128, 8, dtype=torch.float32)  # a size the fused path takes in inference, but learned
    t5 = t5.float()  # modifiers need the reference path's backward on the CPU
    t5.bias.grad = None
    qkv.attention(big, big, big, score_mod=t5).sum().backward()
    assert t5.bias.grad is not None and t5.bias.grad.abs().sum() > 0
    assert t5.bias.grad is not None and t5.bias.grad.abs().sum() > 0  # the learned bias trains


def test_bad_modifiers():
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match="boolean"):
        qkv.attention(q, q, q, mask_mod=lambda b, h, i, j: (i - j).float())
    with pytest.raises(ValueError, match="keep the scores' shape"):
        qkv.attention(q, q, q, score_mod=lambda s, b, h, i, j: s.sum(-1, keepdim=True))
    with pytest.raises(ValueError, match="must be a function"):
        qkv.attention(q, q, q, score_mod=3)
    with pytest.raises(ValueError, match=r"\(B, H, T, D\)"):
        qkv.attention(q[None], q[None], q[None], mask_mod=mods.causal)
    for bad in (lambda: mods.softcap(0), lambda: mods.sliding_window(0), lambda: mods.document(torch.ones(2, 2, 2)),
                lambda: mods.prefix_lm(-1), lambda: mods.and_masks(), lambda: mods.chain()):
        with pytest.raises(ValueError):
            bad()


@pytest.mark.parametrize("positions", ["alibi", "relative"])
def test_kv_cache_decoding_equals_the_parallel_pass(gen, positions):
    torch.manual_seed(0)
    model = TransformerSeq2Seq(TransformerConfig(src_vocab=20, tgt_vocab=20, dim=16, num_heads=4, num_layers=2,
                                                 ffn_dim=32, positions=positions, dropout=0.0)).eval()
    if positions == "relative":
        with torch.no_grad():
            model.src_bias.bias.normal_()
            model.tgt_bias.bias.normal_()
    src = torch.randint(4, 20, (2, 9), generator=gen)
    src_mask = torch.ones(2, 9, dtype=torch.bool)
    src_mask[1, 6:] = False
    tgt = torch.randint(4, 20, (2, 6), generator=gen)
    with torch.no_grad():
        parallel = model(src, src_mask, tgt)
        state = model.encode(src, src_mask)
        steps = [model.decode_step(tgt[:, t], state)[0] for t in range(6)]
    torch.testing.assert_close(torch.stack(steps, 1), parallel, atol=1e-5, rtol=1e-4)
    assert model.src_pos is None and (positions != "relative" or "tgt_bias.bias" in model.state_dict())


def test_prefix_lm_with_a_prefilled_cache(gen):
    """The prefix in one chunk (it sees itself whole), then one token at a time: the same as the parallel pass."""
    torch.manual_seed(0)
    mha = qkv.MultiHeadAttention(16, 4, mask_mod=mods.prefix_lm(3)).eval()
    x = torch.randn(2, 7, 16, generator=gen)
    with torch.no_grad():
        parallel = mha(x)
        cache = qkv.KVCache()
        steps = [mha(x[:, :3], cache=cache)] + [mha(x[:, t:t + 1], cache=cache) for t in range(3, 7)]
    torch.testing.assert_close(torch.cat(steps, 1), parallel, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", ["sliding", "softcap", "document"])
def test_multihead_cache_with_layer_modifiers(gen, name):
    torch.manual_seed(0)
    kw = {"sliding": {"mask_mod": mods.sliding_window(3)}, "softcap": {"score_mod": mods.softcap(1.0)},
          "document": {}}[name]
    mha = qkv.MultiHeadAttention(16, 4, **kw).eval()
    x = torch.randn(2, 7, 16, generator=gen)
    call = {"mask_mod": mods.document(torch.tensor([0, 0, 0, 1, 1, 1, 1]))} if name == "document" else {}
    with torch.no_grad():
        parallel = mha(x, is_causal=True, **call)
        cache = qkv.KVCache()
        steps = [mha(x[:, t:t + 1], is_causal=True, cache=cache, **call) for t in range(7)]
    torch.testing.assert_close(torch.cat(steps, 1), parallel, atol=1e-5, rtol=1e-4)
    assert name == "document" or "mod=" in repr(mha)


# ------------------------------------------------------------------------------------------ the fused path



@pytest.mark.skipif(not flex.fused_available(), reason="FlexAttention is not available here")
@pytest.mark.usefixtures("compile_now")
@pytest.mark.parametrize("case", ["alibi+causal", "softcap+window+padding", "t5+document", "prefix", "empty rows"])
@pytest.mark.slow
def test_fused_equals_reference(gen, case, monkeypatch):
    q, k, v = qkv_(gen, b=2, h=2, tq=128, tk=128, d=16, dtype=torch.float32)
    ids = torch.arange(128).div(40, rounding_mode="floor").expand(2, 128)
    t5 = mods.RelativePositionBias(2, 16, 64)
    with torch.no_grad():
        t5.bias.normal_()
    kw, mask = {
        "alibi+causal": ({"score_mod": mods.alibi(2), "is_causal": True}, None),
        "softcap+window+padding": ({"score_mod": mods.softcap(2.0), "mask_mod": mods.sliding_window(32)},
                                   (torch.arange(128) < torch.tensor([128, 100])[:, None])[:, None, None]),
        "t5+document": ({"score_mod": t5, "mask_mod": mods.document(ids)}, None),
        "prefix": ({"mask_mod": mods.prefix_lm(20)}, None),
        "empty rows": ({"mask_mod": lambda b, h, q_idx, kv_idx: (q_idx % 7 != 3) & (kv_idx <= q_idx)}, None),
    }[case]
    calls = []
    real = flex._fused
    monkeypatch.setattr(flex, "_fused", lambda *a: calls.append(1) or real(*a))
    with torch.no_grad():
        out = qkv.attention(q, k, v, mask=mask, **kw)
        ref = qkv.attention(q, k, v, mask=mask, impl="reference", **kw)
    assert calls == [1] and compiled.reason() is None  # the fused path ran, once (not for impl="reference")
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-4)
    if case == "empty rows":
        assert torch.equal(out[:, :, 3::7], torch.zeros_like(out[:, :, 3::7]))  # rows with no key: zeros
    if case == "alibi+causal":  # a second call of the same signature compiles nothing
        from torch._dynamo.utils import counters

        before = counters["stats"]["unique_graphs"]
        with torch.no_grad():
            qkv.attention(q * 2, k, v, mask=mask, **kw)
        assert counters["stats"]["unique_graphs"] == before


@pytest.mark.skipif(not flex.fused_available(), reason="FlexAttention is not available here")
@pytest.mark.usefixtures("compile_now")
def test_fused_path_falls_back_when_it_cannot_compile(gen, monkeypatch, caplog):
    q, k, v = qkv_(gen, b=1, h=2, tq=128, tk=128, d=16, dtype=torch.float32)
    def broken(*a, **kw):
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(flex.FLEX, "_compiled", broken)
    monkeypatch.setattr(flex.FLEX, "counts", {})
    monkeypatch.setattr(compiled, "_broken", None)
    with caplog.at_level(logging.WARNING, logger="qkv.compiled"), torch.no_grad():
        out = qkv.attention(q, k, v, score_mod=mods.alibi(2), mask_mod=mods.causal)
        again = qkv.attention(q, k, v, score_mod=mods.alibi(2), mask_mod=mods.causal)
    said = [r.getMessage() for r in caplog.records if "compiled kernels are off" in r.getMessage()]
    assert len(said) == 1 and "no C++ compiler" in said[0] and "score_mod" in said[0]  # said once
    torch.testing.assert_close(out, qkv.attention(q, k, v, score_mod=mods.alibi(2), mask_mod=mods.causal,
                                                  impl="reference"))
    assert torch.equal(out, again) and not flex.fused_available()


@pytest.mark.parametrize("positions", ["alibi", "relative"])
def test_translate_with_a_position_bias(tmp_path, positions, capsys, one_thread):
    """`qkv train translate --model transformer --positions alibi|relative`: trains, saves, reloads, translates."""
    from qkv.apps.translate import Translator
    from qkv.cli import main

    out = tmp_path / positions
    assert main(["train", "translate", "--data", "dates", "--model", "transformer", "--positions", positions,
                 "--dim", "16", "--num-heads", "2", "--n-train", "200", "--n-eval", "20", "--eval-max", "10",
                 "--batch-size", "32", "--max-steps", "2", "--no-progress", "--out", str(out)]) == 0
    translator = Translator.load(out)
    assert translator.model.cfg.positions == positions and translator.model.src_pos is None
    assert main(["translate", str(out), "7 mars 2019", "--beam", "2", "--max-len", "12"]) == 0
    assert capsys.readouterr().out.strip()


def test_which_axes_a_mask_uses():
    assert mods.uses(mods.causal) == frozenset() and mods.uses(mods.sliding_window(4)) == frozenset()
    assert mods.uses(mods.document(torch.zeros(8, dtype=torch.long))) == frozenset()
    assert mods.uses(mods.document(torch.zeros(2, 8, dtype=torch.long))) == {"b"}
    assert mods.uses(mods.prefix_lm(torch.tensor([1, 2]))) == {"b"}
    assert mods.uses(lambda b, h, q_idx, kv_idx: h > 0) == {"b", "h"}  # a function of the user's: both, to be safe
    assert mods.uses(mods.and_masks(mods.causal, mods.prefix_lm(torch.tensor([1, 2])))) == {"b"}
    assert mods.uses(mods.offset(mods.causal, 3, score=False)) == frozenset()


# ------------------------------------------------------------------------- a user's modifier is the user's error


@pytest.mark.skipif(not flex.fused_available(), reason="FlexAttention is not available here")
@pytest.mark.usefixtures("compile_now")
@pytest.mark.parametrize("bad,match", [
    ({"mask_mod": lambda b, h, q_idx, kv_idx: q_idx - kv_idx}, r"mask_mod .*<lambda> returned torch.int64"),
    ({"mask_mod": lambda b, h, q_idx, kv_idx: torch.ones(3, dtype=torch.bool)}, r"mask_mod .*broadcasts to"),
    ({"score_mod": lambda s, b, h, q_idx, kv_idx: s[..., :1]}, r"score_mod .*<lambda> returned .*keep the scores"),
    ({"score_mod": lambda s, b, h, q_idx, kv_idx: s + torch.zeros(100)[kv_idx]}, r"score_mod .*<lambda> failed"),
])
def test_a_bad_user_modifier_is_named_and_never_turns_compilation_off(gen, monkeypatch, bad, match):
    """On inputs the fused path takes, a modifier with the wrong dtype or shape, or one that fails
    (here: an index past the end of its table, at the last key), is a ValueError naming it, before anything is
    compiled; compiled kernels stay on for the rest of the process."""
    monkeypatch.setattr(compiled, "_broken", None)
    q, k, v = qkv_(gen, b=1, h=2, tq=128, tk=128, d=8, dtype=torch.float32)
    with torch.no_grad(), pytest.raises(ValueError, match=match):
        qkv.attention(q, k, v, **bad)
    with pytest.raises(ValueError, match=match):
        qkv.attention(q, k, v, impl="reference", **bad)  # the same words on the reference path
    assert compiled.reason() is None and flex.fused_available()


@pytest.mark.skipif(not flex.fused_available(), reason="FlexAttention is not available here")
@pytest.mark.usefixtures("compile_now")
def test_a_user_modifier_that_cannot_compile_runs_on_the_reference_path_alone(gen, monkeypatch, caplog):
    """A modifier that is right but that FlexAttention cannot compile (simulated) runs on the reference path from
    then on, said once and named; a failure with qkv's own modifiers still means the compiler is broken."""
    monkeypatch.setattr(compiled, "_broken", None)
    q, k, v = qkv_(gen, b=1, h=2, tq=128, tk=128, d=8, dtype=torch.float32)

    def odd_window(b, h, q_idx, kv_idx):
        return (q_idx - kv_idx).abs() < 9

    tries = []

    def cannot(*a, **kw):
        tries.append(1)
        raise RuntimeError("Unsupported: data-dependent operator")

    monkeypatch.setattr(flex.FLEX, "_compiled", cannot)
    monkeypatch.setattr(flex.FLEX, "counts", {})
    with caplog.at_level(logging.WARNING), torch.no_grad():
        out = qkv.attention(q, k, v, mask_mod=odd_window)
        again = qkv.attention(q, k, v, mask_mod=odd_window)
    said = [r.getMessage() for r in caplog.records if "could not compile" in r.getMessage()]
    assert len(said) == 1 and "odd_window" in said[0] and tries == [1]  # tried once, said once
    assert compiled.reason() is None and flex.fused_available()
    torch.testing.assert_close(out, qkv.attention(q, k, v, mask_mod=odd_window, impl="reference"))
    assert torch.equal(out, again)
    with torch.no_grad():
        qkv.attention(q, k, v, mask_mod=mods.sliding_window(9))  # qkv's own: the compiler's fault
    assert not flex.fused_available() and "Unsupported" in compiled.reason()


@pytest.mark.parametrize("rows", [1, 3])
def test_blocks_of_query_rows_against_the_formula(gen, monkeypatch, rows):
    """The CPU path that runs the stages a block of query rows at a time (here 1 or 3 rows per block, checkpointed
    in training): outputs, weights and gradients (inputs and a learned T5 bias) against the explicit float64 formula,
    with a document mask, key padding that empties a whole sequence, and a query offset."""
    from qkv.paths import chunked

    monkeypatch.setattr(chunked, "BLOCK_ELEMENTS", rows * 11)  # blocks of one head and `rows` query rows
    monkeypatch.setattr(chunked, "MIN_ROWS", 1)
    q, k, v = (t.requires_grad_() for t in qkv_(gen, tq=7, tk=11))
    t5 = mods.RelativePositionBias(H, 8, 16).double()
    with torch.no_grad():
        t5.bias.normal_(generator=gen)
    ids = torch.tensor([[0] * 5 + [1] * 6, [0] * 11])
    pad = (torch.arange(11)[None] < torch.tensor([11, 0])[:, None])[:, None, None]  # the second sequence: no key
    offset = 4
    calls = []
    real = chunked.chunked
    monkeypatch.setattr(flex, "chunked", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    out, w = qkv.attention(q, k, v, mask=pad, score_mod=t5, mask_mod=mods.document(ids), q_offset=offset,
                           return_weights=True)
    assert calls == [1]
    d = (torch.arange(7)[:, None] + offset) - torch.arange(11)[None]
    bias = t5.bias[t5.bucket(-d)].permute(2, 0, 1)[None]
    qpos = torch.arange(7) + offset
    allowed = (ids[:, qpos][:, :, None] == ids[:, None, :])[:, None] & pad
    want_out, want_w = explicit(q, k, v, bias, allowed.expand(B, H, 7, 11))
    torch.testing.assert_close(out, want_out)
    torch.testing.assert_close(w, want_w)
    assert torch.equal(out[1], torch.zeros_like(out[1]))  # no key at all: zero output
    params = [q, k, v, t5.bias]
    got = torch.autograd.grad(out.square().sum() + (w * w.detach()).sum(), params)
    want = torch.autograd.grad(want_out.square().sum() + (want_w * want_w.detach()).sum(), params, retain_graph=True)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)
    out2 = qkv.attention(q, k, v, mask=pad, score_mod=t5, mask_mod=mods.document(ids), q_offset=offset)
    torch.testing.assert_close(out2, want_out)  # without weights, the same
    grads2 = torch.autograd.grad(out2.square().sum(), params)
    want2 = torch.autograd.grad(want_out.square().sum(), params)
    for a, b in zip(grads2, want2, strict=True):
        torch.testing.assert_close(a, b)
