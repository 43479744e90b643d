"""The alignment measures against hand-made weights, and the "not aligned" warning of a real training of a tiny
attention decoder whose attention is forced to stay uniform (and of one that learns the diagonal)."""

import logging

import pytest
import torch
from torch import nn

from qkv import attention
from qkv.train import Task, TrainConfig, train
from qkv.train.alignment import AlignmentCheck, alignment_stats


def diagonal(b, t, s):
    w = torch.zeros(b, t, s)
    w[:, torch.arange(t), (torch.arange(t) * s) // t] = 1.0
    return w


def test_uniform_weights_have_no_focus_and_no_progress():
    w = torch.full((2, 5, 10), 0.1)
    stats = alignment_stats(w, torch.ones(2, 5, dtype=torch.bool))
    assert float(stats["attn_focus"]) / 10 == pytest.approx(0.1)
    assert float(stats["attn_progress"]) == 0.0


def test_a_diagonal_is_focused_and_progresses_and_masked_steps_do_not_count():
    w = diagonal(3, 6, 12)
    mask = torch.ones(3, 6, dtype=torch.bool)
    mask[1, 4:] = False
    w[1, 4:] = torch.full((12,), 1 / 12)  # padding steps: ignored
    stats = alignment_stats(w, mask)
    assert float(stats["attn_focus"]) / mask.sum() == pytest.approx(1.0)
    assert float(stats["attn_progress"]) / mask.sum() == pytest.approx(1.0)
    back = w.flip(-1)  # a focused alignment that walks backwards
    assert float(alignment_stats(back, mask)["attn_progress"]) / mask.sum() == pytest.approx(-1.0)


def test_heads_are_averaged():
    w = diagonal(2, 4, 8)
    mask = torch.ones(2, 4, dtype=torch.bool)
    both = torch.stack([w, w], 1)
    assert float(alignment_stats(both, mask)["attn_focus"]) == pytest.approx(8.0)


def test_the_shapes_must_agree():
    with pytest.raises(ValueError, match="query_mask"):
        alignment_stats(torch.ones(2, 3, 4), torch.ones(2, 4, dtype=torch.bool))


class Decoder(nn.Module):
    """Output step t of a sequence of length T reads the S = 2T inputs through attention, its target the input at
    2t; the queries and keys are fixed one-hot embeddings of the positions that point step t at input 2t, and a
    learned linear map reads the context. ``uniform``: the scores are multiplied by 0, so the weights stay uniform
    whatever is learned; otherwise the attention is the diagonal from the first step."""

    def __init__(self, s: int, uniform: bool):
        super().__init__()
        self.uniform = uniform
        self.register_buffer("q", 10.0 * torch.eye(s)[::2])
        self.register_buffer("k", torch.eye(s))
        self.out = nn.Linear(1, 1)

    def forward(self, x):
        b, s = x.shape
        q, k = self.q.expand(b, -1, -1), self.k.expand(b, -1, -1)
        ctx, w = attention(q, k, x[..., None], scale=0.0 if self.uniform else 1.0, return_weights=True)
        return self.out(ctx).squeeze(-1), w


class CopyTask(Task):
    name, unit = "copy", "steps"

    def __init__(self, uniform: bool, n: int = 64, s: int = 8):
        self.uniform, self.n, self.s = uniform, n, s
        self.x = torch.randn(n, s, generator=torch.Generator().manual_seed(0))

    def build_model(self):
        return Decoder(self.s, self.uniform)

    def config(self):
        return {"uniform": self.uniform}

    def train_examples(self):
        return list(range(self.n))

    def collate(self, examples):
        return self.x[torch.tensor(examples)]

    def loss(self, model, x):
        pred, w = model(x)
        err = ((pred - x[:, ::2]) ** 2).sum()
        mask = torch.ones(pred.shape, dtype=torch.bool)
        return err, mask.sum(), alignment_stats(w, mask)

    def evaluate(self, model, split):
        return {}

    def callbacks(self, config):
        self.check = AlignmentCheck(config, -(-self.n // config.batch_size), advice="try another --seed")
        return [self.check]


@pytest.mark.parametrize("uniform", [True, False])
def test_a_run_whose_attention_stays_uniform_says_so_once_at_a_third(uniform, caplog):
    task = CopyTask(uniform)
    config = TrainConfig(epochs=30, batch_size=16, lr=0.05, eval_split=None, final_splits=(), progress=False,
                         warmup_steps=0)
    with caplog.at_level(logging.INFO, logger="qkv.train.trainer"):
        train(task, config)
    lines = [r.getMessage() for r in caplog.records if "has not aligned" in r.getMessage()]
    if uniform:
        assert len(lines) == 1 and "step 40" in lines[0] and "try another --seed" in lines[0]
        assert task.check.aligned is False
    else:
        assert lines == [] and task.check.aligned is True


def test_the_third_is_of_the_time_budget_when_there_is_one():
    check = AlignmentCheck(TrainConfig(max_minutes=3, epochs=100), 10)
    state = type("S", (), {"elapsed": 59.0, "global_step": 5})()
    logs = {"stats": alignment_stats(torch.full((1, 2, 4), 0.25), torch.ones(1, 2, dtype=torch.bool)), "count": 2}
    check(state, logs)
    assert check.aligned is None
    state.elapsed = 60.0
    check(state, logs)
    assert check.aligned is False


def test_guided_attention_is_zero_on_the_diagonal_and_counts_what_lies_off_it():
    from qkv.train.alignment import guided_attention_loss

    mask = torch.ones(2, 4, dtype=torch.bool)
    lengths = torch.tensor([8, 8])
    assert float(guided_attention_loss(diagonal(2, 4, 8), mask, lengths)) == pytest.approx(0.0, abs=1e-6)
    uniform = torch.full((2, 4, 8), 1 / 8)
    far = torch.zeros(2, 4, 8)
    far[:, :, -1] = 1.0  # every step on the last key
    u, f = (float(guided_attention_loss(w, mask, lengths)) for w in (uniform, far))
    assert 0 < u < f < 8  # at most 1 a step
    half = mask.clone()
    half[:, 2:] = False  # padding steps count nothing; the diagonal is each sequence's own
    assert float(guided_attention_loss(diagonal(2, 2, 8)[:, :, :].repeat(1, 2, 1), half, lengths)) == \
        pytest.approx(float(guided_attention_loss(diagonal(2, 2, 8), torch.ones(2, 2, dtype=torch.bool), lengths)))
    heads = torch.stack([uniform, far], 1)
    assert float(guided_attention_loss(heads, mask, lengths)) == pytest.approx((u + f) / 2)
