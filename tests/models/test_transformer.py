"""Transformer encoder-decoder: KV-cache decoding equals the parallel forward, masking, learning, config."""

import pytest
import torch

from qkv.layers import sinusoidal_positions
from qkv.models import TransformerConfig, TransformerSeq2Seq
from qkv.models.seq2seq import reorder_state
from qkv.train.checkpoint import load_weights, save_weights

PAD, BOS, EOS = 0, 1, 2


def small(**kw) -> TransformerConfig:
    args = dict(src_vocab=23, tgt_vocab=29, dim=32, num_heads=4, ffn_dim=48, num_layers=2, dropout=0.0, max_len=32)
    return TransformerConfig(**{**args, **kw})


def batch(gen, cfg: TransformerConfig, b=4, s=9, t=7):
    """Right-padded sources of lengths s, ..., 1 (one full row, one of length 1) and random targets."""
    lengths = torch.tensor([s, 1, *torch.randint(1, s + 1, (b - 2,), generator=gen).tolist()])
    src_mask = torch.arange(s)[None] < lengths[:, None]
    src = torch.randint(4, cfg.src_vocab, (b, s), generator=gen).masked_fill(~src_mask, PAD)
    tgt = torch.randint(4, cfg.tgt_vocab, (b, t), generator=gen)
    tgt[:, 0] = BOS
    return src, src_mask, tgt


def step_all(model, src, src_mask, tgt):
    state = model.encode(src, src_mask)
    logits, attn = [], []
    for i in range(tgt.shape[1]):
        step_logits, step_attn, state = model.decode_step(tgt[:, i], state)
        logits.append(step_logits)
        attn.append(step_attn)
    return torch.stack(logits, 1), torch.stack(attn, 1)


@pytest.mark.parametrize("opts", [
    {},
    {"positions": "learned", "kv_heads": 2},
    {"score": "cosine", "kv_heads": 1, "share_embeddings": True, "src_vocab": 29, "tie_output": False},
    {"score": "general", "num_layers": 1, "num_decoder_layers": 3, "activation": "gelu"},
])
def test_kv_cache_decoding_equals_parallel_forward(gen, opts):
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
    cfg = small(**opts)
    model = TransformerSeq2Seq(cfg).double().eval()
    assert len(model.encoder) == cfg.num_layers and len(model.decoder) == (cfg.num_decoder_layers or cfg.num_layers)
    src, src_mask, tgt = batch(gen, cfg)
    with torch.no_grad():
        logits, attn = model(src, src_mask, tgt, return_attention=True)
        step_logits, step_attn = step_all(model, src, src_mask, tgt)
    assert logits.shape == (4, 7, cfg.tgt_vocab) and attn.shape == (4, 7, 9)
    torch.testing.assert_close(step_logits, logits, rtol=0, atol=1e-10)
    torch.testing.assert_close(step_attn, attn, rtol=0, atol=1e-12)
    # the alignment is a distribution over the real source tokens only
    torch.testing.assert_close(attn.sum(-1), torch.ones(4, 7, dtype=attn.dtype))
    assert (attn.masked_select(~src_mask[:, None, :].expand_as(attn)) == 0).all()
    assert torch.isfinite(logits).all()


def test_forward_without_attention_returns_logits_only(gen):
    cfg = small()
    model = TransformerSeq2Seq(cfg).eval()
    src, src_mask, tgt = batch(gen, cfg)
    out = model(src, src_mask, tgt)
    assert isinstance(out, torch.Tensor) and out.shape == (4, 7, cfg.tgt_vocab)


def test_source_padding_does_not_change_outputs(gen):
    cfg = small(positions="learned")
    model = TransformerSeq2Seq(cfg).double().eval()
    src, src_mask, tgt = batch(gen, cfg)
    with torch.no_grad():
        logits, attn = model(src, src_mask, tgt, return_attention=True)
        # other tokens under the padding, and three more padding columns
        extra = 3
        src2 = torch.randint(4, cfg.src_vocab, (4, 9 + extra), generator=gen)
        mask2 = torch.cat([src_mask, torch.zeros(4, extra, dtype=torch.bool)], 1)
        src2 = torch.where(mask2, torch.cat([src, src.new_zeros(4, extra)], 1), src2)
        logits2, attn2 = model(src2, mask2, tgt, return_attention=True)
        # each row alone, without padding
        for i in range(4):
            n = int(src_mask[i].sum())
            alone, attn_alone = model(src[i:i + 1, :n], src_mask[i:i + 1, :n], tgt[i:i + 1], return_attention=True)
            torch.testing.assert_close(alone[0], logits[i], rtol=0, atol=1e-10)
            torch.testing.assert_close(attn_alone[0], attn[i, :, :n], rtol=0, atol=1e-12)
    torch.testing.assert_close(logits2, logits, rtol=0, atol=1e-10)
    torch.testing.assert_close(attn2[..., :9], attn, rtol=0, atol=1e-12)
    assert (attn2[..., 9:] == 0).all()


def test_causal_future_targets_do_not_change_earlier_logits(gen):
    cfg = small()
    model = TransformerSeq2Seq(cfg).double().eval()
    src, src_mask, tgt = batch(gen, cfg)
    with torch.no_grad():
        logits = model(src, src_mask, tgt)
        for k in range(1, tgt.shape[1]):
            changed = tgt.clone()
            changed[:, k:] = torch.randint(4, cfg.tgt_vocab, changed[:, k:].shape, generator=gen)
            changed[:, k] = (tgt[:, k] - 4 + 1) % (cfg.tgt_vocab - 4) + 4  # surely different at k
            out = model(src, src_mask, changed)
            torch.testing.assert_close(out[:, :k], logits[:, :k], rtol=0, atol=1e-10)
            assert (out[:, k] - logits[:, k]).abs().amax(-1).gt(1e-6).all()


def test_reorder_state_selects_batch_rows(gen):
    """Beam search reorders the state: continuing on the reordered state equals decoding those rows."""
    cfg = small(kv_heads=2)
    model = TransformerSeq2Seq(cfg).double().eval()
    src, src_mask, tgt = batch(gen, cfg)
    index = torch.tensor([2, 0, 0, 3])
    with torch.no_grad():
        state = model.encode(src, src_mask)
        for i in range(3):
            _, _, state = model.decode_step(tgt[:, i], state)
        state = reorder_state(state, index)
        rest = []
        for i in range(3, 7):
            step_logits, _, state = model.decode_step(tgt[index, i], state)
            rest.append(step_logits)
        expected = model(src[index], src_mask[index], tgt[index])
    torch.testing.assert_close(torch.stack(rest, 1), expected[:, 3:], rtol=0, atol=1e-10)


def test_all_padding_source_row_is_finite(gen):
    cfg = small()
    model = TransformerSeq2Seq(cfg)
    src, src_mask, tgt = batch(gen, cfg)
    src_mask[1] = False
    logits, attn = model(src, src_mask, tgt, return_attention=True)
    logits.sum().backward()
    assert torch.isfinite(logits).all() and (attn[1] == 0).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def copy_task(n=200, vocab=14, seed=0):
    """``n`` random sequences of length 5-8 over 10 symbols (ids 4..13); the target is the source + EOS."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(5, 9, (n,), generator=g)
    src_mask = torch.arange(8)[None] < lengths[:, None]
    src = torch.randint(4, vocab, (n, 8), generator=g).masked_fill(~src_mask, PAD)
    tgt_out = torch.cat([src, src.new_zeros(n, 1)], 1)
    tgt_out[torch.arange(n), lengths] = EOS
    tgt_in = torch.cat([src.new_full((n, 1), BOS), tgt_out[:, :-1]], 1).masked_fill(tgt_out == PAD, PAD)
    return src, src_mask, tgt_in, tgt_out


def greedy(model, src, src_mask, max_len):
    state = model.encode(src, src_mask)
    y = torch.full((src.shape[0],), BOS, dtype=torch.long)
    done = torch.zeros(src.shape[0], dtype=torch.bool)
    out = []
    for _ in range(max_len):
        logits, _, state = model.decode_step(y, state)
        y = logits.argmax(-1).masked_fill(done, PAD)
        out.append(y)
        done |= y == EOS
        if done.all():
            break
    return torch.stack(out, 1)


@pytest.mark.parametrize("positions", ["sinusoidal", "learned"])
@pytest.mark.slow
def test_overfits_copy_task(positions):
    torch.manual_seed(0)
    src, src_mask, tgt_in, tgt_out = copy_task()
    cfg = TransformerConfig(14, 14, dim=64, num_heads=4, ffn_dim=128, num_layers=1, dropout=0.0, positions=positions,
                            max_len=16)
    model = TransformerSeq2Seq(cfg)
    steps = 300
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    schedule = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=steps, pct_start=0.2)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        idx = torch.randperm(len(src), generator=g)[:64]
        logits = model(src[idx], src_mask[idx], tgt_in[idx])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt_out[idx].flatten(), ignore_index=PAD)
        opt.zero_grad()
        loss.backward()
        opt.step()
        schedule.step()
    model.eval()
    with torch.no_grad():
        pred = greedy(model, src, src_mask, max_len=tgt_out.shape[1])
    pred = torch.cat([pred, pred.new_zeros(len(src), tgt_out.shape[1] - pred.shape[1])], 1)
    exact = (pred == tgt_out).all(1).float().mean().item()
    assert exact >= 0.95, f"exact match {exact:.3f} after training (last loss {loss.item():.4f})"


def test_shared_and_tied_embeddings_are_one_parameter():
    both = TransformerSeq2Seq(small(src_vocab=29, share_embeddings=True, tie_output=True))
    assert both.src_embed.weight is both.tgt_embed.weight is both.out.weight
    untied = TransformerSeq2Seq(small(tie_output=False))
    assert untied.src_embed.weight is not untied.tgt_embed.weight
    assert untied.out.weight is not untied.tgt_embed.weight
    tied = TransformerSeq2Seq(small())
    assert tied.out.weight is tied.tgt_embed.weight
    n = sum(p.numel() for p in tied.parameters())
    assert sum(p.numel() for p in untied.parameters()) == n + 29 * 32
    assert sum(p.numel() for p in both.parameters()) == n - 23 * 32


def test_tied_weights_survive_a_safetensors_round_trip(tmp_path, gen):
    cfg = small(src_vocab=29, share_embeddings=True)
    model = TransformerSeq2Seq(cfg).eval()
    src, src_mask, tgt = batch(gen, cfg)
    save_weights(tmp_path / "model.safetensors", model.state_dict())
    loaded = TransformerSeq2Seq(cfg).eval()
    loaded.load_state_dict(load_weights(tmp_path / "model.safetensors"))
    assert loaded.src_embed.weight is loaded.out.weight
    with torch.no_grad():
        torch.testing.assert_close(loaded(src, src_mask, tgt), model(src, src_mask, tgt), rtol=0, atol=0)


def test_positions_and_embedding_scale():
    pe = sinusoidal_positions(50, 16)
    assert pe.shape == (50, 16)
    torch.testing.assert_close(pe[:, 0], torch.sin(torch.arange(50.0)))
    torch.testing.assert_close(pe[7, 15], torch.cos(torch.tensor(7 / 10000 ** (14 / 16))))
    model = TransformerSeq2Seq(small(dim=64, num_heads=4)).eval()
    tokens = torch.tensor([[5, 6, PAD]])
    x = model._embed(tokens, 0, "source")
    pe = model.src_pos.sinusoids
    assert model.tgt_pos is model.src_pos  # one buffer for both sides
    torch.testing.assert_close(x[0, 2], pe[2])  # padding embeds to zero, only its position is left
    torch.testing.assert_close(x[0, 0], model.src_embed.weight[5] * 8.0 + pe[0])
    learned = TransformerSeq2Seq(small(positions="learned")).eval()
    y = learned._embed(tokens, 3, "target")
    torch.testing.assert_close(y[0, 1], learned.tgt_embed.weight[6] * 32 ** 0.5 + learned.tgt_pos.table.weight[4])


def test_too_long_sequences_raise(gen):
    cfg = small(max_len=8)
    model = TransformerSeq2Seq(cfg).eval()
    src, src_mask, tgt = batch(gen, cfg, s=9, t=5)
    with pytest.raises(ValueError, match="max_len"):
        model(src, src_mask, tgt)
    state = model.encode(src[:, :8], src_mask[:, :8])
    for _ in range(8):
        _, _, state = model.decode_step(tgt[:, 0], state)
    with pytest.raises(ValueError, match="max_len"):
        model.decode_step(tgt[:, 0], state)


def test_bad_inputs_raise(gen):
    cfg = small()
    model = TransformerSeq2Seq(cfg)
    src, src_mask, tgt = batch(gen, cfg)
    with pytest.raises(ValueError, match="src_mask"):
        model(src, src_mask.long(), tgt)
    with pytest.raises(ValueError, match="src_mask"):
        model(src, src_mask[:, :-1], tgt)
    with pytest.raises(ValueError, match="tgt_in"):
        model(src, src_mask, tgt[:2])


@pytest.mark.parametrize("bad, match", [
    ({"dim": 30, "num_heads": 4}, "divide dim"),
    ({"kv_heads": 3}, "kv_heads"),
    ({"kv_heads": 0}, "kv_heads"),
    ({"dim": 33, "num_heads": 3}, "even dim"),
    ({"dropout": 1.0}, "dropout"),
    ({"positions": "rotary"}, "positions"),
    ({"share_embeddings": True}, "src_vocab == tgt_vocab"),
    ({"score": "nope"}, "unknown score"),
    ({"num_layers": 0}, "num_layers"),
    ({"num_decoder_layers": 0}, "num_decoder_layers"),
    ({"activation": "tanh"}, "activation"),
    ({"tgt_vocab": 0}, "tgt_vocab"),
    ({"max_len": 0}, "max_len"),
    ({"pad_id": 23}, "pad_id"),
])
def test_bad_config_raises(bad, match):
    with pytest.raises(ValueError, match=match):
        small(**bad)
