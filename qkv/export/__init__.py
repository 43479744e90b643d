"""Export: qkv's models as ``torch.export`` programs and ONNX graphs, and trained runs as ONNX graphs with their
tokenisers and configuration beside them (``qkv export RUN --out DIR``), servable by ONNX Runtime without PyTorch.

- :func:`qkv.apps.export.export_run`: a run to ``DIR`` (``export.json`` lists the graphs, inputs and outputs);
- :func:`to_onnx`, :func:`export_program`: any module (dynamic axes by name);
- :class:`WithWeights`: every attention module's weights as named outputs;
- :mod:`qkv.export.runtime`: decoding loops over ONNX Runtime in numpy (greedy and beam search, CTC prefix scores)
  for exported translators, captioners, summarisers and speech recognisers.

ONNX needs the ``export`` extra: ``pip install 'qkv[export]'``. See ``docs/export.md``.
"""

from .graph import OPSET, ExportError, check_exportable, check_onnx, export_program, to_onnx
from .weights import WithWeights

__all__ = ["export_program", "to_onnx", "check_onnx", "check_exportable", "ExportError", "WithWeights", "OPSET"]
