"""qkv.memory.keep_freed_memory: large CPU tensors reuse freed memory instead of page-faulting fresh pages."""

import subprocess
import sys
import textwrap

import pytest

import qkv.memory
from tests import ROOT  # noqa: E402

# Page faults of re-allocating and writing a 64 MiB tensor (16,384 pages of 4 KiB) 4 times, after a warm-up.
PROBE = textwrap.dedent("""
    import resource, sys
    sys.path.insert(0, {root!r})
    import torch
    import qkv.memory
    kept = qkv.memory.keep_freed_memory() if sys.argv[1] == "keep" else False
    n = 16 * 2**20
    for _ in range(20):  # glibc's heap takes a few rounds to settle on a layout that fits the block again
        x = torch.empty(n); x.fill_(1.0); del x
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(4):
        x = torch.empty(n); x.fill_(1.0); del x
    print(kept, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
""")


def _probe(mode: str) -> tuple[bool, int]:
    out = subprocess.run([sys.executable, "-c", PROBE.format(root=str(ROOT)), mode], capture_output=True, text=True,
                         check=True, env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    kept, faults = out.stdout.split()
    return kept == "True", int(faults)


@pytest.mark.skipif(not qkv.memory.can_keep_freed_memory(), reason="keep_freed_memory acts on glibc's malloc only")
@pytest.mark.slow
def test_kept_memory_is_reused_without_page_faults():
    kept, faults = _probe("keep")
    assert kept
    assert faults < 16384  # the same pages again: no faults, or one round's at most
    default_kept, default_faults = _probe("default")
    assert not default_kept
    # glibc's default: the 64 MiB block is mmap'ed afresh and every page faults in again
    assert default_faults > 0.9 * 4 * 16384


def test_without_glibc_nothing_changes(monkeypatch):
    monkeypatch.setattr(qkv.memory, "_kept", False)
    monkeypatch.setattr(qkv.memory, "_glibc", lambda: None)
    assert qkv.memory.keep_freed_memory() is False
    assert qkv.memory.memory_is_kept() is False


def test_the_command_keeps_memory_unless_told_not_to(monkeypatch, capsys):
    import qkv.cli

    calls = []
    monkeypatch.setattr(qkv.cli, "keep_freed_memory", lambda: calls.append(1) or True)
    assert qkv.cli.main(["explain"]) == 0
    assert calls == [1]
    assert qkv.cli.main(["--release-memory", "explain"]) == 0
    assert calls == [1]
