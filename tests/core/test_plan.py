"""qkv.plan and qkv.trace_paths agree on every path of the table; compilation in the background never makes a call
wait, and a failed one is said once; a bad QKV_COMPILE is an error at import."""

import logging
import os
import subprocess
import sys
import threading

import pytest
import torch

import qkv
from qkv import background, compiled, mods
from qkv.path_table import PATHS
from qkv.scores import Additive

pytestmark = pytest.mark.usefixtures("one_thread")


def _calls(gen):
    """One call per path of the table: (path name, args, keywords)."""
    q, k, v = (torch.randn(2, 2, 64, 8, generator=gen) for _ in range(3))
    mask = torch.rand(2, 1, 1, 64, generator=gen) > 0.3
    big = [torch.randn(1, 2, 128, 8, generator=gen) for _ in range(3)]
    sc = Additive(8, 8, 6)
    return [
        ("sdpa_causal", (q, k, v), {"is_causal": True}),
        ("sdpa", (q, k, v), {"mask": mask}),
        ("dot_weights", (q, k, v), {"return_weights": True}),
        ("tiled", (q, k, v), {"score": sc, "_no_grad": True}),
        ("flex", tuple(big), {"score_mod": mods.alibi(2), "mask_mod": mods.causal, "_compiled": True,
                              "_no_grad": True}),
        ("mod_blocks", (q, k, v), {"score_mod": mods.alibi(2), "return_weights": True}),
        ("mod_reference", (q, k, v), {"mask_mod": mods.causal, "normalize": "sparsemax"}),
        ("reference", (q, k, v), {"normalize": "sparsemax"}),
    ]


def test_every_path_of_the_table_is_planned_and_traced_alike(gen):
    """One call per path: the planned path is the path named, the traced one is the planned one, and the output is
    the float64 three-stage formula's."""
    cases = _calls(gen)
    assert [c[0] for c in cases] == [p.name for p in PATHS]  # every path of the table, in its order
    for name, args, kw in cases:
        kw = dict(kw)
        on = kw.pop("_compiled", False)
        grad = torch.no_grad() if kw.pop("_no_grad", False) else torch.enable_grad()
        if on:
            if not compiled.available() or not qkv.flex.fused_available():
                continue
            compiled.set_compile(True)
        try:
            with grad:
                planned = qkv.plan(*args, **kw)
                with qkv.trace_paths() as taken:
                    out = qkv.attention(*args, **kw)
        finally:
            compiled.set_compile(None)
        assert planned.path == name, (name, planned)
        assert taken == [name] and planned.reason
        if name == "flex":
            assert planned.kernel == "FLEX" and planned.compiled
        out = out[0] if isinstance(out, tuple) else out
        ref = qkv.attention(*(a.double() for a in args), **{**kw, "impl": "reference", "return_weights": False,
                                                           "score": kw.get("score", "scaled_dot")}) \
            if "score" not in kw else None
        if ref is not None:
            torch.testing.assert_close(out.double(), ref, atol=2e-5, rtol=1e-4)


def test_the_plan_names_the_kernel_and_whether_it_is_compiled(gen):
    """Modifiers on the CPU with weights: the block kernel, eager until compiled; ``QKV_COMPILE=0``: never."""
    q, k, v = (torch.randn(1, 2, 64, 8, generator=gen) for _ in range(3))
    compiled.set_compile(False)
    try:
        p = qkv.plan(q, k, v, score_mod=mods.alibi(2), return_weights=True)
    finally:
        compiled.set_compile(None)
    assert (p.path, p.kernel, p.compiled) == ("mod_blocks", "BLOCK", False)
    assert qkv.plan(q, k, v).kernel is None


def test_traces_nest_and_stay_in_their_thread(gen):
    q, k, v = (torch.randn(4, 8, generator=gen) for _ in range(3))
    other = []
    with qkv.trace_paths() as outer:
        qkv.attention(q, k, v)
        with qkv.trace_paths() as inner:
            qkv.attention(q, k, v, return_weights=True)
        t = threading.Thread(target=lambda: other.append(qkv.attention(q, k, v)))
        t.start()
        t.join()
    assert outer == ["sdpa", "dot_weights"] and inner == ["dot_weights"] and len(other) == 1


# ------------------------------------------------------------------------------- compiling in the background


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    monkeypatch.setenv("QKV_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setattr(compiled, "_broken", None)
    compiled.set_compile("auto")
    yield
    compiled.set_compile(None)


def test_a_slow_compilation_never_makes_a_call_wait(fresh, monkeypatch, caplog):
    """A compiler that takes until it is released: every call meanwhile runs the eager code at once; once released,
    the next call runs the compiled kernel. One line says it is compiling, one that it is in use."""
    release, started = threading.Event(), threading.Event()

    def slow_compile(fn, **options):
        def run(*a, **kw):
            started.set()
            assert release.wait(30)
            return fn(*a, **kw) + 100  # tells the compiled kernel's results apart
        return run

    monkeypatch.setattr(compiled, "_compile", slow_compile)
    kernel = compiled.Kernel("the slow kernel", lambda x: 2 * x, cold_seconds=1e-6)
    x = torch.ones(3)
    with caplog.at_level(logging.INFO, logger="qkv.compiled"):
        for _ in range(compiled.MIN_CALLS + 1):
            assert torch.equal(kernel.run("s", None, x), 2 * x)
        assert started.wait(30)  # compiling on the background thread now
        for _ in range(20):  # the calls go on, eager, without waiting
            assert torch.equal(kernel.run("s", None, x), 2 * x)
        release.set()
        assert compiled.wait_background(30)
        assert torch.equal(kernel.run("s", None, x), 2 * x + 100)
    said = [r.getMessage() for r in caplog.records]
    assert sum("compiling the slow kernel in the background" in m for m in said) == 1
    assert sum("the slow kernel is compiled" in m and "in use" in m for m in said) == 1


def test_a_failed_background_compilation_leaves_eager_and_is_said_once(fresh, monkeypatch, caplog):
    def broken(fn, **options):
        def run(*a, **kw):
            raise RuntimeError("InductorError: no working C++ compiler")
        return run

    monkeypatch.setattr(compiled, "_compile", broken)
    kernel = compiled.Kernel("the broken kernel", lambda x: 2 * x, cold_seconds=1e-6)
    x = torch.ones(3)
    with caplog.at_level(logging.WARNING, logger="qkv.compiled"):
        for _ in range(compiled.MIN_CALLS + 1):
            kernel.run("s", None, x)
        assert compiled.wait_background(30)
        outs = [kernel.run("s", None, x) for _ in range(5)]
    assert all(torch.equal(o, 2 * x) for o in outs)
    said = [r.getMessage() for r in caplog.records if "compiled kernels are off" in r.getMessage()]
    assert len(said) == 1 and "C++ compiler" in said[0]


def test_calls_made_while_the_background_compiles_take_their_own_paths(gen, monkeypatch):
    """Torch's is-compiling flag is one for the process: while the background thread compiles, a call of another
    thread is still an eager call (the additive score in tiles, the modifiers a block at a time), not a trace."""
    assert compiled.wait_background(300)  # (a compilation an earlier test started ends first: it clears the state)
    monkeypatch.setattr(torch.compiler, "_is_compiling_flag", True)  # as the background thread's compilation sets it
    monkeypatch.setattr(background, "_busy", [True])
    q, k, v = (torch.randn(2, 2, 64, 8, generator=gen) for _ in range(3))
    compiled.set_compile("0")  # (no compilation of these calls' own: the state above stays the test's)
    try:
        with torch.no_grad(), qkv.trace_paths() as taken:
            qkv.attention(q, k, v, score=Additive(8, 8, 6))
            qkv.attention(q, k, v, score_mod=mods.alibi(2), return_weights=True)
    finally:
        compiled.set_compile(None)
    assert taken == ["tiled", "mod_blocks"]
    assert not background.compiling()
    monkeypatch.setattr(background, "_busy", [False])
    assert background.compiling()  # (no compilation of qkv's under way: the flag is this thread's)
    assert torch.compile(lambda x: x + background.compiling(), fullgraph=True)(torch.zeros(1)).item() == 1


def test_the_copies_a_compilation_runs_on_share_as_the_arguments_do():
    """The same tensor twice is one copy; views of one storage are views of one copy (as a compiler sees them)."""
    buf = torch.arange(24.0)
    s = buf[:12].view(1, 3, 4)
    other = buf[4:].view(4, 5)
    (a, b, c, d), kw = background.copies((s, s, other, 3), {"w": buf})
    assert a is b and d == 3
    assert torch.equal(a, s) and torch.equal(c, other) and torch.equal(kw["w"], buf)
    assert a.stride() == s.stride() and c.storage_offset() == other.storage_offset()
    assert a.untyped_storage().data_ptr() == c.untyped_storage().data_ptr() == kw["w"].untyped_storage().data_ptr()
    assert a.untyped_storage().data_ptr() != buf.untyped_storage().data_ptr()
    a.zero_()
    assert kw["w"][:12].eq(0).all() and buf[:12].ne(0).any()


def test_the_block_kernel_compiles_on_the_copies(gen, monkeypatch):
    """The modifier block kernel's scores and destination are one tensor: its copies compile with dynamic shapes."""
    seen = []
    real = compiled._compile

    def counting(fn, **options):
        seen.append(options)
        return real(fn, **options)

    monkeypatch.setattr(compiled, "_compile", counting)
    from qkv.paths.chunked import BLOCK

    s = torch.randn(1, 2, 8, 16, generator=gen)
    args = (s, torch.tensor([0, 0, 0, 0]), None, None, None, None, s)
    (cs, *rest), _ = background.copies(args, {})
    lse = compiled._compile(BLOCK.fn, **BLOCK.options)(cs, *rest)
    assert seen == [{"dynamic": True}] and rest[-1] is cs
    assert torch.allclose(cs, torch.softmax(s, -1)) and torch.allclose(lse, torch.logsumexp(s, -1, keepdim=True))


def test_a_bogus_qkv_compile_is_an_error_at_import():
    env = {**os.environ, "QKV_COMPILE": "sometimes"}
    res = subprocess.run([sys.executable, "-c", "import qkv"], env=env, capture_output=True, text=True)
    assert res.returncode != 0
    assert res.stderr.strip().splitlines()[-1] == "ValueError: QKV_COMPILE must be 0, 1 or auto, got 'sometimes'"
