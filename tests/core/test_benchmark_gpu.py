"""benchmarks/gpu.py runs on the CPU (small sizes, nothing compiled) and writes its table."""

import importlib.util

import pytest

from tests import ROOT


@pytest.mark.slow
def test_the_gpu_benchmark_runs_on_the_cpu(tmp_path, one_thread):
    spec = importlib.util.spec_from_file_location("gpu_benchmark", ROOT / "benchmarks" / "gpu.py")
    gpu = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu)
    out = tmp_path / "gpu.md"
    try:
        assert gpu.main(["--device", "cpu", "--quick", "--reps", "1", "--dtypes", "float32", "--compile", "0",
                         "--sections", "dot,mods,additive", "--out", str(out)]) == 0
    finally:
        from qkv import compiled

        compiled.set_compile(None)
    text = out.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line][1:]
    sections = {row.split(" | ")[0].strip("| ") for row in rows}
    assert sections == {"fast path", "key padding", "weights", "modifiers", "additive"}
    assert "failed" not in text
    for row in rows:  # every ratio is a number
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert float(cells[4]) > 0 and float(cells[6]) > 0 and cells[7].endswith(("speed", "time"))


def _load(name):
    spec = importlib.util.spec_from_file_location(f"{name}_benchmark", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_gpu_benchmark_takes_its_size_and_says_a_bad_one(tmp_path, one_thread, capsys):
    gpu = _load("gpu")
    out = tmp_path / "gpu.md"
    try:
        assert gpu.main(["--device", "cpu", "--quick", "--reps", "1", "--dtypes", "float32", "--compile", "0",
                         "--sections", "dot", "--size", "1,2,48", "--out", str(out)]) == 0
        with pytest.raises(SystemExit):
            gpu.main(["--device", "cpu", "--size", "8,8"])
    finally:
        from qkv import compiled

        compiled.set_compile(None)
    assert "--size: expected three integers B,H,T" in capsys.readouterr().err
    assert "B=1 H=2 T=48" in out.read_text()


def test_the_per_call_profile_runs_on_the_cpu(one_thread, capsys):
    percall = _load("percall")
    try:
        assert percall.main(["--device", "cpu", "--quick", "--calls", "2", "--rows", "3",
                             "--cases", "fast,padding-train"]) == 0
        with pytest.raises(SystemExit):
            percall.main(["--device", "cpu", "--quick", "--cases", "nothing"])
    finally:
        from qkv import compiled

        compiled.set_compile(None)
    text = capsys.readouterr()
    for case in ("fast", "padding-train"):
        assert f"### {case}: host us/call" in text.out and f"#### {case}, qkv" in text.out
    assert "--cases: unknown ['nothing']" in text.err
