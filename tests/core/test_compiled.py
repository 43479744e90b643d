"""The compiled kernels: when qkv compiles (the ``auto`` rule on a fake clock, the switches), the fused
additive/MLP tiles against the eager ones (values and gradients), the fallback when compiling fails, and qkv inside
a caller's torch.compile."""

import logging

import pytest
import torch
from torch import nn

import qkv
from qkv import compiled, mods, tiling
from qkv.scores import MLP, Additive

needs_compile = pytest.mark.skipif(not compiled.available(), reason="torch.compile is not available here")
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def small_tiles(monkeypatch):
    """Fused tiles from any size, tiles of at most 4096 elements: several tiles per call on small inputs."""
    monkeypatch.setattr(tiling, "FUSED_MIN_ELEMENTS", 1)


@pytest.fixture
def fake(monkeypatch, tmp_path):
    """A fake clock (each eager run "takes" ``fake.step`` seconds), a fake ``torch.compile`` that counts, and a
    fresh cache folder."""

    class Fake:
        now = 0.0
        step = 1.0
        reads = 0
        compiles: list = []

        def clock(self):  # read at the start and at the end of every timed run: the two differ by `step`
            self.reads += 1
            if self.reads % 2 == 0:
                self.now += self.step
            return self.now

    f = Fake()
    f.compiles = []
    monkeypatch.setattr(compiled, "clock", f.clock)

    def fake_compile(fn, **options):
        f.compiles.append(fn.__name__)
        return fn

    monkeypatch.setattr(compiled, "_compile", fake_compile)
    monkeypatch.setattr(compiled, "_start", lambda job: job())  # the background thread's work, done at once
    monkeypatch.setenv("QKV_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("QKV_COMPILE", raising=False)
    monkeypatch.delenv("QKV_NO_COMPILE", raising=False)
    monkeypatch.setattr(compiled, "_broken", None)
    compiled.set_compile(None)
    yield f
    compiled.set_compile(None)


def run_calls(kernel, n: int, signature="s") -> list[bool]:
    """``n`` calls through :meth:`compiled.Kernel.run`, as the paths make them: the compiled kernel when it is ready,
    else the eager code, timed. Returns which calls ran compiled."""
    used = []
    for _ in range(n):
        ran = []
        kernel.run(signature, lambda x, ran=ran: ran.append(1) or 2 * x, torch.ones(1))
        used.append(not ran)
    return used


def new_kernel(cold: float, saving: float = 0.5) -> compiled.Kernel:
    def double(x):
        return 2 * x

    return compiled.Kernel("the test kernel", double, cold_seconds=cold, saving=saving)


# ----------------------------------------------------------------------------------------------- the rule


def test_auto_compiles_once_the_eager_calls_paid_a_share_of_it(fake):
    """Each eager call costs 1 s (fake), compiling 100 s, the compiled kernel saves half: compiled (in the background,
    here at once) after 20 s of eager calls, a tenth of the compile time saved (:data:`compiled.BACKGROUND_SHARE`)."""
    assert compiled.BACKGROUND_SHARE == 0.1
    used = run_calls(new_kernel(cold=100.0), 25)
    assert used == [False] * 20 + [True] * 5
    assert fake.compiles == ["double"]


def test_auto_never_compiles_a_call_that_is_made_a_few_times(fake):
    fake.step = 100.0  # even slow calls: the first MIN_CALLS run eager
    assert run_calls(new_kernel(cold=1.0), compiled.MIN_CALLS) == [False] * compiled.MIN_CALLS
    assert fake.compiles == []


def test_each_signature_pays_for_itself(fake):
    kernel = new_kernel(cold=20.0)
    assert run_calls(kernel, 5, "a") == [False] * 4 + [True]
    assert run_calls(kernel, 1, "b") == [False]  # another shape: its own count


def test_the_machine_remembers_what_compiling_cost(fake):
    """The second process on a machine expects what the first measured (a cache load), not the cold estimate."""
    kernel = new_kernel(cold=50.0)
    kernel.counts.clear()
    fake.step = 1.0
    kernel("s", torch.ones(1))  # a forced first compilation, "taking" 1 s on the fake clock
    assert kernel.expected_seconds("cpu") == pytest.approx(1.0)
    again = new_kernel(cold=50.0)  # a fresh process: nothing counted yet
    assert run_calls(again, 5) == [False] * 4 + [True]


def test_the_record_is_read_once_per_signature(fake, monkeypatch):
    """The compile time expected comes from a file: it is read once for a signature, not on every eager call."""
    reads = []
    real = compiled._read_record
    monkeypatch.setattr(compiled, "_read_record", lambda: reads.append(1) or real())
    fake.step = 0.001
    assert not any(run_calls(new_kernel(cold=30.0), 200))
    assert len(reads) == 1


def test_cuda_runs_are_timed_by_events_without_waiting(fake, monkeypatch):
    """On CUDA an eager run is timed between two events, counted once the GPU has passed the second one (a later
    call reads it): never a synchronisation, and a run still on the GPU does not count yet."""

    class Event:
        done = True

        def __init__(self):
            self.at = None

        def record(self):
            self.at = fake.clock()

        def query(self):
            return Event.done

        def elapsed_time(self, end):
            return (end.at - self.at) * 1000.0  # milliseconds, as CUDA's

    monkeypatch.setattr(compiled, "_event", Event)
    monkeypatch.setattr(compiled, "available", lambda device="cpu": True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: pytest.fail("synchronised"))
    kernel = new_kernel(cold=10.0)
    Event.done = False
    for _ in range(30):
        assert not kernel.use("s", "cuda")
        with kernel.eager("s", "cuda"):
            pass
    assert kernel.counts["s"].calls == 0 and len(kernel.counts["s"].pending) == 30
    Event.done = True
    with kernel.eager("s", "cuda", lambda: ((torch.ones(1),), {})):
        pass  # 31 runs of 1 s (fake) read at once: 15.5 s saved >= a tenth of 10 s to compile: compiled
    assert kernel.use("s", "cuda")
    assert kernel.counts["s"].calls == 31 and kernel.counts["s"].eager_seconds == pytest.approx(31.0)


def test_switches(fake, monkeypatch):
    kernel = new_kernel(cold=1e9)
    compiled.set_compile(True)
    assert run_calls(kernel, 1) == [True]
    compiled.set_compile("0")
    assert run_calls(new_kernel(cold=0.0), 10) == [False] * 10
    compiled.set_compile(None)
    monkeypatch.setenv("QKV_COMPILE", "1")
    assert compiled.mode() == "1"
    monkeypatch.setenv("QKV_COMPILE", "auto")
    assert compiled.mode() == "auto"
    monkeypatch.delenv("QKV_COMPILE")
    monkeypatch.setenv("QKV_NO_COMPILE", "1")
    assert compiled.mode() == "0" and not compiled.available()
    monkeypatch.setenv("QKV_NO_COMPILE", "0")  # compilation allowed
    assert compiled.mode() == "auto" and compiled.available()
    monkeypatch.setenv("QKV_COMPILE", "1")  # the new name wins
    monkeypatch.setenv("QKV_NO_COMPILE", "1")
    assert compiled.mode() == "1"


@pytest.mark.parametrize("env,value,match", [("QKV_COMPILE", "sometimes", "QKV_COMPILE must be 0, 1 or auto"),
                                             ("QKV_NO_COMPILE", "auto", "QKV_NO_COMPILE must be 0 or 1"),
                                             ("QKV_NO_COMPILE", "maybe", "QKV_NO_COMPILE must be 0 or 1")])
def test_a_bad_switch_is_named(fake, monkeypatch, env, value, match):
    monkeypatch.setenv(env, value)
    with pytest.raises(ValueError, match=match):
        compiled.mode()
    with pytest.raises(ValueError, match="set_compile must be 0, 1 or auto"):
        compiled.set_compile("later")


def test_says_it_once_per_machine_and_keeps_the_cache_where_it_says(fake, tmp_path, caplog):
    compiled.set_compile(True)
    with caplog.at_level(logging.INFO, logger="qkv.compiled"):
        run_calls(new_kernel(cold=5.0), 2)
        run_calls(new_kernel(cold=5.0), 1)  # another process on the same machine
    said = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert said[0][0] == logging.WARNING and "compiling the test kernel (once per machine" in said[0][1]
    assert str(tmp_path / "inductor") in said[0][1]
    assert [level for level, _ in said] == [logging.WARNING, logging.INFO]  # compiled once per process, said once
    assert compiled.cache_dir() == tmp_path / "inductor"
    import os

    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "inductor")
    (tmp_path / "inductor").mkdir(exist_ok=True)
    assert compiled.clear_cache() == tmp_path / "inductor"
    assert not (tmp_path / "inductor").exists() and not (tmp_path / "compile-times.json").exists()


def test_an_additive_attention_compiles_in_a_loop_not_on_its_first_call(fake, small_tiles, gen, monkeypatch):
    """Through qkv.attention: the first calls run the eager tiles, a loop of them then compiles the fused kernel,
    and the outputs agree throughout."""
    sc = Additive(4, 4, 8)
    q, k, v = (torch.randn(2, 12, 4, generator=gen) for _ in range(3))
    monkeypatch.setattr(tiling.PAIRED, "_compiled", None)  # compiled by the fake compiler, restored after
    monkeypatch.setattr(tiling.PAIRED, "counts", {})
    fake.step = 40.0  # every eager call "takes" 40 s: compiling (30 s expected) pays after 3 calls
    with torch.no_grad():  # (inference, an even hidden size, small values: two units per division)
        expected = qkv.attention(q, k, v, score=sc, impl="reference")
        outs = [qkv.attention(q, k, v, score=sc) for _ in range(5)]
    assert fake.compiles == ["_paired_kernel"]
    assert [c.calls for c in tiling.PAIRED.counts.values()] == [compiled.MIN_CALLS + 1]
    for out in outs:
        torch.testing.assert_close(out, expected)


# ---------------------------------------------------------------------------------------- the real compiler


@needs_compile
@pytest.mark.usefixtures("compile_now")
@pytest.mark.parametrize("make", [lambda: Additive(6, 5, 16, max_elements=4096),
                                  lambda: MLP(6, 5, 16, act_layer=nn.GELU, max_elements=1 << 20)])
@pytest.mark.slow
def test_fused_tiles_equal_the_eager_ones(gen, small_tiles, monkeypatch, make):
    torch.manual_seed(0)
    sc = make()
    q = torch.randn(3, 20, 6, generator=gen, requires_grad=True)
    k = torch.randn(3, 17, 5, generator=gen, requires_grad=True)
    v = torch.randn(3, 17, 4, generator=gen, requires_grad=True)
    mask = torch.arange(17)[None, None] < torch.tensor([17, 9, 1])[:, None, None]
    params = [q, k, v, *sc.parameters()]

    def run():
        out, w = qkv.attention(q, k, v, score=sc, mask=mask, return_weights=True)
        grads = torch.autograd.grad(out.square().sum() + w.sum(), params)
        with torch.no_grad():  # the online-softmax path over the same tiles
            online = qkv.attention(q, k, v, score=sc, mask=mask)
        return out, w, grads, online

    fused = run()
    compiled.set_compile(False)
    expected = run()
    torch.testing.assert_close(fused[0], expected[0])
    torch.testing.assert_close(fused[1], expected[1])
    for a, b in zip(fused[2], expected[2], strict=True):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(fused[3], expected[3])


@pytest.mark.parametrize("act", ["Tanh", "Sigmoid"])
@pytest.mark.parametrize("hidden", [16, 15])
def test_the_factored_activations_are_exact(gen, act, hidden):
    """sum_h w_h act(a_ih + b_jh) through exp(2a) exp(2b), one hidden unit per division and, for an even hidden size,
    two: float64 and float32 against the plain formula, values and gradients, with pre-activations at the limits;
    large pre-activations left to the plain kernel."""
    limit = tiling.PAIRED_LIMIT if act == "Tanh" else tiling.FACTOR_LIMIT
    for dtype, tol in ((torch.float64, {}), (torch.float32, {"atol": 2e-5, "rtol": 1e-5})):
        a = (torch.rand(2, 7, hidden, generator=gen, dtype=torch.float64) * 2 - 1) * limit
        b = (torch.rand(2, 9, hidden, generator=gen, dtype=torch.float64) * 2 - 1) * limit
        a[0, 0], b[1, 2] = limit, -limit  # the extremes the factors allow
        w = torch.randn(hidden, generator=gen, dtype=torch.float64)
        a32, b32 = (t.to(dtype).requires_grad_() for t in (a, b))
        eq, ek, paired = tiling._factored(act, a32, b32)
        assert paired == (hidden % 2 == 0)
        w32 = w.to(dtype)
        if paired:
            h = hidden // 2
            got = tiling._paired_kernel(eq[..., :h], eq[..., h:], ek[..., :h], ek[..., h:], w32[:h], w32[h:], None, act)
        else:
            got = tiling._exp_kernel(eq, ek, w32, None, act)
        a64, b64 = a.clone().requires_grad_(), b.clone().requires_grad_()
        expected = tiling._pair_kernel(a64, b64, w, None, act)
        torch.testing.assert_close(got.double(), expected, **tol)
        cot = torch.randn(got.shape, generator=gen, dtype=torch.float64)
        for g, e in zip(torch.autograd.grad((got * cot.to(dtype)).sum(), [a32, b32]),
                        torch.autograd.grad((expected * cot).sum(), [a64, b64]), strict=True):
            torch.testing.assert_close(g.double(), e, **tol)
    a, b = torch.randn(2, 7, hidden, dtype=torch.float64), torch.randn(2, 9, hidden, dtype=torch.float64)
    if act == "Tanh":  # beyond the paired limit: one unit per division
        assert tiling._factored(act, a / a.abs().max() * (limit + 1), b)[2] is False
    assert tiling._factored(act, a / a.abs().max() * (tiling.FACTOR_LIMIT + 1), b) is None  # the plain kernel
    assert tiling._factored("ReLU", a, b) is None


@pytest.mark.parametrize("act", ["Tanh", "Sigmoid"])
@pytest.mark.parametrize("eager", [False, True])
def test_the_paired_backward_equals_the_formula(gen, fake, monkeypatch, act, eager):
    """The paired kernel's own backward pass (:class:`qkv.tiling._PairedTraining`): the gradients of the factors, of
    both halves of the output weights and of the bias equal the float64 formula's, with pre-activations at the
    paired limits, keys broadcast over the batch, and a tile of queries against keys of another length; ``eager``:
    compiling the backward fails and its sums run eagerly in chunks of one query row."""
    for kernel in (tiling.PAIRED, tiling.PAIRED_GRADS):  # compiled afresh by the fake compiler, restored after
        monkeypatch.setattr(kernel, "_compiled", None)
        monkeypatch.setattr(kernel, "counts", {})
    compiled.set_compile(True)  # (the fixture switches back)
    if eager:
        def broken(*a, **kw):
            raise RuntimeError("no compiler")

        monkeypatch.setattr(tiling, "_EAGER_TERMS", 64)  # 64 terms: one query row per chunk
        monkeypatch.setattr(tiling.PAIRED_GRADS, "_compiled", broken)
    limit = tiling.PAIRED_LIMIT if act == "Tanh" else tiling.FACTOR_LIMIT
    hidden = 12
    a = (torch.rand(3, 5, hidden, generator=gen, dtype=torch.float64) * 2 - 1) * limit
    b = (torch.rand(1, 7, hidden, generator=gen, dtype=torch.float64) * 2 - 1) * limit
    a[1, 0], b[0, 2] = limit, -limit
    w, bias = torch.randn(hidden, generator=gen, dtype=torch.float64), torch.randn((), dtype=torch.float64)
    for dtype, tol in ((torch.float64, {}), (torch.float32, {"atol": 5e-5, "rtol": 1e-5})):
        leaves = [t.to(dtype).requires_grad_() for t in (a, b, w, bias)]
        eq, ek, paired = tiling._factored(act, *leaves[:2])
        assert paired
        h = hidden // 2
        wq = leaves[2]
        got = tiling._PairedTraining.apply(eq[..., :h], eq[..., h:], ek[..., :h], ek[..., h:], wq[:h], wq[h:],
                                           leaves[3], act, ("test", dtype))
        refs = [t.clone().requires_grad_() for t in (a, b, w, bias)]
        expected = tiling._pair_kernel(*refs[:3], refs[3], act)
        torch.testing.assert_close(got.double(), expected, **tol)
        cot = torch.randn(got.shape, generator=gen, dtype=torch.float64)
        for name, g, e in zip("abwb", torch.autograd.grad((got * cot.to(dtype)).sum(), leaves),
                              torch.autograd.grad((expected * cot).sum(), refs), strict=True):
            torch.testing.assert_close(g.double(), e, **tol, msg=lambda m, name=name: f"d/d{name}: {m}")
    assert fake.compiles == ["_paired_kernel"] + ([] if eager else ["_paired_grads"])


def test_forms():
    assert Additive(4, 4, 8).fused_form()[2] == "Tanh"
    assert MLP(4, 4, [8, 8]).fused_form() is None  # two hidden layers: not one fused reduction
    assert MLP(4, 4, 8, act_layer=lambda: nn.GELU(approximate="tanh")).fused_form() is None
    assert MLP(4, 4, 8).fused_form()[2] == "ReLU"


def test_falls_back_and_says_so_once(gen, small_tiles, monkeypatch, caplog, fake):
    sc = Additive(4, 4, 8, max_elements=512)
    q, k, v = (torch.randn(2, 12, 4, generator=gen) for _ in range(3))
    expected = sc.reference(q, k)

    def broken(*args, **kw):
        raise RuntimeError("InductorError: no working C++ compiler")

    monkeypatch.setattr(compiled, "_compile", lambda fn, **kw: broken)
    for kernel in (tiling.EXP, tiling.PAIRED, tiling.PAIRED_GRADS):
        monkeypatch.setattr(kernel, "_compiled", None)
        monkeypatch.setattr(kernel, "counts", {})
    compiled.set_compile(True)
    with caplog.at_level(logging.WARNING, logger="qkv.compiled"):
        torch.testing.assert_close(sc(q, k), expected)
        torch.testing.assert_close(sc(q, k), expected)
    said = [r.getMessage() for r in caplog.records if "compiled kernels are off" in r.getMessage()]
    assert len(said) == 1 and "C++ compiler" in said[0] and "Additive" in said[0]
    assert not compiled.available()


@needs_compile
@pytest.mark.slow
def test_inside_the_callers_torch_compile(gen):
    """A model with ALiBi self-attention and an additive attention, compiled by its user: same outputs."""

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.mha = qkv.MultiHeadAttention(16, 4, score_mod=mods.alibi(4), mask_mod=mods.causal)
            self.attn = qkv.Attention(Additive(16, 16, 8))

        def forward(self, x):
            y = self.mha(x)
            return self.attn(y, x)

    torch.manual_seed(0)
    model = Model().eval()
    x = torch.randn(2, 128, 16, generator=gen)  # 128 x 128 scores: the fused FlexAttention path
    with torch.no_grad():
        expected = model(x)
        got = torch.compile(model)(x)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


def test_a_background_compilation_leaves_the_callers_random_numbers_alone():
    """Dynamo saves the generator's state when a compilation starts and sets it back when it ends: from the background
    thread, that would rewind the caller's draws made meanwhile (a model seeded and built then gets other weights)."""
    import threading

    from torch._dynamo.utils import preserve_rng_state

    from qkv import background

    entered, drawn = threading.Event(), threading.Event()

    def job():  # a compilation's bracket around its tracing, held open while the caller draws
        with preserve_rng_state():
            entered.set()
            assert drawn.wait(30)

    torch.manual_seed(0)
    expected = [torch.rand(3), torch.rand(3)]
    torch.manual_seed(0)
    background.start(job)
    assert entered.wait(30)
    first = torch.rand(3)
    drawn.set()
    assert background.wait(30)
    second = torch.rand(3)
    assert torch.equal(first, expected[0]) and torch.equal(second, expected[1])
    # the calling thread still sets the state (a compilation there, a user's checkpoint restored)
    state = torch.random.get_rng_state()
    again = torch.rand(3)
    torch.random.set_rng_state(state)
    assert torch.equal(torch.rand(3), again)


def test_a_background_compilation_leaves_the_callers_default_dtype_alone():
    """Dynamo sets the default dtype back to the one it read when it started tracing."""
    import threading

    from qkv import background

    entered, changed = threading.Event(), threading.Event()

    def job():  # what dynamo does around a compilation
        prior = torch.get_default_dtype()
        entered.set()
        assert changed.wait(30)
        torch.set_default_dtype(prior)

    try:
        background.start(job)
        assert entered.wait(30)
        torch.set_default_dtype(torch.float64)
        changed.set()
        assert background.wait(30)
        assert torch.get_default_dtype() == torch.float64 and torch.ones(1).dtype == torch.float64
    finally:
        torch.set_default_dtype(torch.float32)
    assert torch.ones(1).dtype == torch.float32  # set from the calling thread, as before
