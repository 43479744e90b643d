"""benchmarks/seq2seq_throughput.py: the plain-PyTorch Bahdanau model is qkv's model, weight for weight."""

import importlib.util
import sys

import pytest
import torch

from qkv.models.seq2seq import BahdanauSeq2Seq, RNNConfig
from tests import ROOT

PATH = ROOT / "benchmarks" / "seq2seq_throughput.py"


def load_script():
    name = "benchmarks_seq2seq_throughput"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, PATH)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


bench = load_script()


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one thread is fastest


def pair(cfg, hoist, seed=0):
    torch.manual_seed(seed)
    ours = BahdanauSeq2Seq(cfg)
    plain = bench.TorchBahdanau(cfg, hoist=hoist)
    assert bench.n_params(plain) == bench.n_params(ours)
    bench.copy_qkv_weights(ours, plain)
    return ours, plain


def padded_batch(cfg, gen, b=5, s=7, t=6):
    """Right-padded sources with garbage (non-pad tokens) under the padding, to check the masking."""
    src = torch.randint(4, cfg.src_vocab, (b, s), generator=gen)
    lengths = torch.randint(1, s + 1, (b,), generator=gen)
    lengths[0] = s
    mask = torch.arange(s) < lengths[:, None]
    tgt = torch.randint(4, cfg.tgt_vocab, (b, t), generator=gen)
    tgt[1, 3:] = cfg.pad_id  # padded targets too
    return src, mask, tgt


CONFIGS = [dict(num_layers=1, cell="gru", bidirectional=True), dict(num_layers=2, cell="gru", bidirectional=True),
           dict(num_layers=1, cell="lstm", bidirectional=True), dict(num_layers=2, cell="gru", bidirectional=False)]


@pytest.mark.parametrize("hoist", [True, False])
@pytest.mark.parametrize("arch", CONFIGS,
                         ids=lambda a: f"{a['cell']}{a['num_layers']}{'bi' if a['bidirectional'] else ''}")
def test_plain_model_matches_qkv_logits_and_gradients(arch, hoist, gen):
    # dropout 0 so that train mode (the benchmark's) is deterministic: logits and gradients must agree
    cfg = RNNConfig(13, 11, embed_dim=8, hidden_dim=12, attn_dim=10, dropout=0.0, **arch)
    ours, plain = pair(cfg, hoist)
    for _ in range(2):
        src, mask, tgt = padded_batch(cfg, gen)
        a, b = ours(src, mask, tgt), plain(src, mask, tgt)
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
    loss_a = torch.nn.functional.cross_entropy(a.flatten(0, 1), tgt.flatten(), ignore_index=0)
    loss_b = torch.nn.functional.cross_entropy(b.flatten(0, 1), tgt.flatten(), ignore_index=0)
    loss_a.backward()
    loss_b.backward()
    theirs, mine = dict(ours.named_parameters()), dict(plain.named_parameters())
    for qkv_name, plain_name in bench.weight_map(cfg).items():
        torch.testing.assert_close(mine[plain_name].grad, theirs[qkv_name].grad, atol=1e-5, rtol=1e-4,
                                   msg=lambda m, n=qkv_name: f"gradient of {n}: {m}")


def test_eval_mode_with_dropout_matches_and_a_changed_weight_is_caught(gen):
    cfg = RNNConfig(13, 11, embed_dim=8, hidden_dim=12, attn_dim=10, dropout=0.3)
    ours, plain = pair(cfg, hoist=True)
    src, mask, tgt = padded_batch(cfg, gen)
    assert bench.max_logit_diff(ours, plain, src, mask, tgt) < 1e-5
    assert ours.training and plain.training  # modes restored
    with torch.no_grad():
        plain.attn_v.weight.mul_(1.5)  # a model that drifts from qkv's must be seen to
    assert bench.max_logit_diff(ours, plain, src, mask, tgt) > 1e-4


def test_weight_map_names_every_parameter():
    for arch in CONFIGS:
        cfg = RNNConfig(13, 11, embed_dim=8, hidden_dim=12, **arch)
        names = bench.weight_map(cfg)
        assert set(names) == {n for n, _ in BahdanauSeq2Seq(cfg).named_parameters()}
        assert set(names.values()) == {n for n, _ in bench.TorchBahdanau(cfg).named_parameters()}


def test_batch_is_right_padded_within_the_lengths():
    cfg = RNNConfig(50, 60, embed_dim=8, hidden_dim=12)
    src, mask, tgt_in, tgt_out = bench.make_batch(cfg, 32, 5, 9, torch.Generator().manual_seed(0))
    lengths = mask.sum(1)
    assert lengths.min() >= 5 and lengths.max() == src.shape[1] <= 9
    assert ((src != 0) == mask).all()
    assert tgt_in.shape == tgt_out.shape and ((tgt_out != 0).sum(1) >= 5).all()
    assert (tgt_in[:, 1:] == tgt_out[:, :-1]).all()


def test_quick_run_prints_the_table(capsys):
    rates = bench.main(["--quick", "--threads", "1", "--rounds", "1", "--steps", "1", "--batch", "8", "--max-len", "8"])
    assert set(rates) == {bench.QKV, bench.PLAIN, bench.PER_STEP} and all(r > 0 for r in rates.values())
    out = capsys.readouterr().out
    rows = {line.split("|")[1].strip(): line.split("|")[-2].strip() for line in out.splitlines()
            if line.startswith("| ") and line.rstrip().endswith("x |")}
    # the printed ratios are the measured rates' ratios to plain PyTorch's, for every row
    for name in (bench.QKV, bench.PER_STEP):
        assert rows[name] == f"{rates[name] / rates[bench.PLAIN]:.2f}x", (name, rows)
