"""The execution paths of :func:`qkv.attention`, below :mod:`qkv.functional` (which checks the inputs and picks one).

==========================  =================================================================================
module                      path
==========================  =================================================================================
:mod:`~qkv.paths.fast`      SDPA on the dot form ``(q', k')`` of the dot family, no weights asked for
:mod:`~qkv.paths.weights`   the dot family with weights (one matmul, an in-place masked softmax, one matmul),
                            and the reference path (the three stages as written: any score, any normaliser)
:mod:`~qkv.paths.tiled`     the pairwise scores in inference: an online softmax over key tiles
:mod:`~qkv.paths.common`    what they share: working dtype, scaled scores, masked normalisation, zeroed keys
==========================  =================================================================================

The paths with score and mask modifiers (FlexAttention's fused kernel, or their reference) are in :mod:`qkv.flex`,
which builds on :mod:`~qkv.paths.common`. Nothing here checks its inputs: :mod:`qkv.functional` does.
"""

from . import common, fast, tiled, weights

__all__ = ["common", "fast", "tiled", "weights"]
