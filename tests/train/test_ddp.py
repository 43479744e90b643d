"""Two gloo processes under torchrun end where one process does on the same global batches."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from qkv.train import TrainConfig, load_checkpoint, train
from tests import ROOT  # noqa: E402
from tests.trainer_toy import ToyTask

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="this PyTorch has no torch.distributed gloo backend")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(out: Path, *args: str, nproc: int = 2) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--nnodes=1",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}", "-m", "tests.trainer_toy",
           "--out", str(out), *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)


@pytest.mark.slow
def test_two_gloo_processes_equal_one_process(tmp_path):
    # 52 examples in global batches of 9: shares of 4 and 5 (unequal, so that a per-rank mean would differ),
    # and a last batch of 7 split 3 + 4
    args = ["--epochs", "2", "--batch-size", "9", "--examples", "52"]
    proc = torchrun(tmp_path / "ddp", *args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    single = train(ToyTask(n=52, dtype=torch.float64),
                   TrainConfig(epochs=2, batch_size=9, lr=0.01, device="cpu", out=str(tmp_path / "one"),
                               warmup_steps=2, log_every=1, final_splits=("valid",), progress=False))
    ddp = load_checkpoint(tmp_path / "ddp" / "checkpoint")
    one = load_checkpoint(tmp_path / "one" / "checkpoint")
    assert ddp.state["position"]["global_step"] == one.state["position"]["global_step"] == 12
    assert ddp.state["world_size"] == 2
    start = torch.cat([p.flatten() for p in ToyTask(n=52, dtype=torch.float64).build_model().parameters()])
    moved = 0.0
    for name, p in one.state_dict.items():
        assert p.dtype == torch.float64
        torch.testing.assert_close(ddp.state_dict[name], p, rtol=1e-10, atol=1e-12)
        moved += 1
    assert moved == 4
    trained = torch.cat([p.flatten() for p in single.model.parameters()])
    assert not torch.allclose(trained[: start.numel()], start)  # training did move the weights
    # optimizer moments agree too, and the RNG states of both ranks were gathered into rank 0's checkpoint
    ddp_t, one_t = ddp.state_tensors(), one.state_tensors()
    for k in one_t:
        if k.startswith("optimizer."):
            torch.testing.assert_close(ddp_t[k], one_t[k], rtol=1e-9, atol=1e-14)
    assert {"rng.0.torch", "rng.1.torch"} <= ddp_t.keys()
    # only rank 0 logged: one start line, and the logged losses match the single process
    ddp_log = [json.loads(x) for x in (tmp_path / "ddp" / "metrics.jsonl").read_text().splitlines()]
    one_log = [json.loads(x) for x in (tmp_path / "one" / "metrics.jsonl").read_text().splitlines()]
    assert [r["event"] for r in ddp_log].count("start") == 1
    ddp_loss = [r["loss"] for r in ddp_log if r["event"] == "train"]
    one_loss = [r["loss"] for r in one_log if r["event"] == "train"]
    assert len(ddp_loss) == 12 and ddp_loss == pytest.approx(one_loss, rel=1e-10)
