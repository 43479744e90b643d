"""A tiny task for the trainer's tests, and the script that ``tests/train/test_ddp.py`` launches under torchrun.

Regression of a fixed random linear map with a small MLP. Options make it use every source of randomness the
trainer must keep across a resume: dropout (torch RNG) and noise added in ``collate`` (Python ``random`` and
NumPy), and an assets file (a vocabulary) that must travel with the checkpoint.
"""

from __future__ import annotations

import argparse
import json
import random

import numpy as np
import torch
from torch import nn

from qkv.train import Task, TrainConfig, train


class ToyTask(Task):
    name = "toy"
    unit = "items"

    def __init__(self, n: int = 96, dim: int = 6, hidden: int = 16, *, dropout: float = 0.0, noise: bool = False,
                 dtype: torch.dtype = torch.float32, data_seed: int = 1234, lengths: bool = False,
                 eval_fn=None):
        g = torch.Generator().manual_seed(data_seed)
        self.dim, self.hidden, self.dropout, self.noise, self.dtype = dim, hidden, dropout, noise, dtype
        w = torch.randn(dim, generator=g, dtype=torch.float64)
        x = torch.randn(n + 64, dim, generator=g, dtype=torch.float64)
        y = torch.tanh(x @ w) + 0.05 * torch.randn(n + 64, generator=g, dtype=torch.float64)
        self.x, self.y = x.to(dtype), y.to(dtype)
        self.n = n
        self.use_lengths = lengths
        self.eval_fn = eval_fn  # replaces evaluate() (e.g. a scripted sequence of metrics)
        self.vocab = None
        self.setup_calls = 0

    def setup(self):
        self.setup_calls += 1
        if self.vocab is None:
            self.vocab = ["<pad>", "a", "b", f"fitted-{self.n}"]

    def build_model(self):
        return build_toy_model(self.config())

    def config(self):
        return {"dim": self.dim, "hidden": self.hidden, "dropout": self.dropout,
                "dtype": str(self.dtype).replace("torch.", "")}

    def train_examples(self):
        return list(range(self.n))

    def lengths(self):
        return [i % 7 + 1 for i in range(self.n)] if self.use_lengths else None

    def collate(self, examples):
        idx = torch.tensor(examples)
        x, y = self.x[idx], self.y[idx]
        if self.noise:
            x = x + 0.01 * torch.randn(x.shape, dtype=x.dtype)
            x = x + 0.01 * random.random() + 0.01 * float(np.random.rand())
        return {"x": x, "y": y}

    def loss(self, model, batch):
        pred = model(batch["x"]).squeeze(-1)
        err = (pred - batch["y"]) ** 2
        return err.sum(), batch["y"].numel(), {"abs_err": (pred - batch["y"]).abs().sum()}

    def evaluate(self, model, split):
        if self.eval_fn is not None:
            return self.eval_fn(model, split)
        sl = {"valid": slice(self.n, self.n + 32), "test": slice(self.n + 32, self.n + 64)}
        if split not in sl:
            raise ValueError(f"unknown split {split!r}")
        device = next(model.parameters()).device
        x, y = self.x[sl[split]].to(device), self.y[sl[split]].to(device)
        with torch.no_grad():
            mse = ((model(x).squeeze(-1) - y) ** 2).mean()
        return {"mse": float(mse), "neg_mse": -float(mse)}

    def save_assets(self, directory):
        (directory / "vocab.json").write_text(json.dumps(self.vocab))

    def load_assets(self, directory):
        self.vocab = json.loads((directory / "vocab.json").read_text())


def build_toy_model(config):
    dtype = getattr(torch, config["dtype"])
    return nn.Sequential(nn.Linear(config["dim"], config["hidden"], dtype=dtype), nn.Tanh(),
                         nn.Dropout(config["dropout"]), nn.Linear(config["hidden"], 1, dtype=dtype))


def main(argv=None):
    """Train the toy task (float64, no randomness beyond the data order); run by test_ddp under torchrun and by
    the fault tests as a real process. Errors are one line on stderr (exit code 2), interrupts exit 130 or 143
    after the checkpoint is written, like ``qkv train``."""
    import sys
    import time

    from qkv.train.interrupt import Interrupted

    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=10)
    p.add_argument("--examples", type=int, default=52)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--step-delay", type=float, default=0.0, help="sleep this many seconds after every step")
    p.add_argument("--monitor", action="store_true", help="keep the best weights by the validation mse")
    p.add_argument("--resume", action="store_true")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    task = ToyTask(n=args.examples, dtype=torch.float64)
    cfg = TrainConfig(epochs=args.epochs, batch_size=args.batch_size, lr=0.01, device="cpu", out=args.out,
                      warmup_steps=2, log_every=1, final_splits=("valid",), progress=False, resume=args.resume,
                      seed=args.seed, monitor="mse" if args.monitor else None, mode="min")
    callbacks = [lambda state, logs: time.sleep(args.step_delay)] if args.step_delay else []
    try:
        result = train(task, cfg, callbacks)
    except Interrupted as e:
        print(f"trainer_toy: interrupted ({e}): continue with --resume", file=sys.stderr)
        return e.exit_code
    except (OSError, ValueError) as e:
        print(f"trainer_toy: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"seed": args.seed, "metrics": result.metrics}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
