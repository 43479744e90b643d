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
