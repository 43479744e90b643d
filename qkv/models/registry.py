"""One factory for every model: ``create(name, **config)``, the config being JSON-able keyword arguments.

A checkpoint that stores ``name`` and ``config`` rebuilds its model with ``create(name, **config)``, without any
task code.

===========================================================  ============================================
name                                                         keyword arguments
===========================================================  ============================================
``fixed``, ``bahdanau``, ``luong``                           the fields of :class:`~qkv.models.RNNConfig`
``transformer``                                              the fields of :class:`~qkv.models.TransformerConfig`
``lm``                                                       the fields of :class:`~qkv.models.lm.LMConfig`
``lm-classifier``                                            :class:`~qkv.models.lm_classifier.LMClassifier`'s
``bigru-classifier``, ``bilstm-classifier``                  ``vocab_size``, ``num_classes`` and
                                                             :class:`~qkv.models.RNNClassifier`'s options
``transformer-classifier``                                   ``vocab_size``, ``num_classes`` and
                                                             :class:`~qkv.models.TransformerClassifier`'s
``bigram-classifier``                                        ``vocab_size``, ``num_classes`` and
                                                             :class:`~qkv.models.BigramAttentionClassifier`'s
``small-cnn``                                                :class:`~qkv.models.SmallCNN`'s arguments
``resnet18``, ``resnet34``, ``resnet50``, ``resnet101``,     :func:`~qkv.models.create_resnet`'s arguments
``sknet50``                                                  (``num_classes``, ``in_channels``, ``attn``,
                                                             ``attn_kwargs``, ``stem``)
``pointer``, ``transformer-pointer``                         :class:`~qkv.models.pointer.PointerGenerator`'s,
                                                             :class:`~qkv.models.pointer.TransformerPointer`'s
``bisenet``, ``fcn``                                         :class:`~qkv.models.bisenet.BiSeNet`'s,
                                                             :class:`~qkv.models.bisenet.FCN`'s arguments
``speech-las``, ``speech-ctc``, ``speech-transformer``       :class:`~qkv.models.speech.LAS`'s,
                                                             :class:`~qkv.models.speech.CTCModel`'s,
                                                             :class:`~qkv.models.speech_transformer.SpeechTransformer`'s
===========================================================  ============================================
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from functools import partial
from typing import Any

from torch import nn

from .bisenet import SEGMENTATION_MODELS
from .captioning import CAPTION_MODELS
from .classifiers import BigramAttentionClassifier, RNNClassifier, TransformerClassifier
from .lm import CausalLM, LMConfig
from .lm_classifier import LMClassifier
from .pointer import POINTER_MODELS
from .reading import QA_MODELS
from .resnet import RESNETS, create_resnet, sknet50
from .seq2seq import RNN_MODELS, RNNConfig
from .small_cnn import SmallCNN
from .speech import SPEECH_MODELS
from .speech_transformer import SpeechTransformer
from .transformer import TransformerConfig, TransformerSeq2Seq

__all__ = ["create", "list_models", "MODELS"]

#: what the ResNets take (sknet50 all but ``attn``, which is "sk")
_RESNET_ARGS = ("num_classes", "in_channels", "attn", "attn_kwargs", "stem")


class _Builder:
    """A model constructor and the keyword arguments it accepts."""

    def __init__(self, fn: Callable[..., nn.Module], accepts: tuple[str, ...]):
        self.fn, self.accepts = fn, accepts

    def __call__(self, **config) -> nn.Module:
        return self.fn(**config)


def _from_config(model_cls: type[nn.Module], config_cls: type) -> _Builder:
    """``model_cls(config_cls(**config))``, taking the config's fields."""
    return _Builder(lambda **config: model_cls(config_cls(**config)),
                    tuple(f.name for f in dataclasses.fields(config_cls)))


def _from_kwargs(fn: Callable[..., nn.Module], accepts: tuple[str, ...] | None = None, **preset) -> _Builder:
    """``fn(**preset, **config)``, taking ``accepts`` (default: ``fn``'s keyword arguments but the preset ones)."""
    if accepts is None:
        accepts = tuple(n for n in _keywords(fn) if n not in preset)
    return _Builder(partial(fn, **preset), accepts)


def _keywords(fn: Callable[..., nn.Module]) -> list[str]:
    """The keyword arguments ``fn`` takes; a class whose ``__init__`` passes ``**options`` on to its base's takes
    the base's too."""
    names: list[str] = []
    for f in ([c.__init__ for c in fn.__mro__ if "__init__" in vars(c)] if isinstance(fn, type) else [fn]):
        params = inspect.signature(f).parameters.values()
        names += [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                  and p.name != "self" and p.name not in names]
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return names


#: every model name and its builder
MODELS: dict[str, _Builder] = {
    **{name: _from_config(cls, RNNConfig) for name, cls in RNN_MODELS.items()},
    "transformer": _from_config(TransformerSeq2Seq, TransformerConfig),
    "lm": _from_config(CausalLM, LMConfig),
    "lm-classifier": _from_kwargs(LMClassifier),
    "bigru-classifier": _from_kwargs(RNNClassifier, cell="gru"),
    "bilstm-classifier": _from_kwargs(RNNClassifier, cell="lstm"),
    "transformer-classifier": _from_kwargs(TransformerClassifier),
    "bigram-classifier": _from_kwargs(BigramAttentionClassifier),
    "small-cnn": _from_kwargs(SmallCNN),
    **{name: _from_kwargs(partial(create_resnet, name), _RESNET_ARGS) for name in RESNETS},
    "sknet50": _from_kwargs(sknet50, tuple(a for a in _RESNET_ARGS if a != "attn")),
    **{name: _from_kwargs(fn) for name, fn in CAPTION_MODELS.items()},
    **{name: _from_kwargs(fn) for name, fn in QA_MODELS.items()},
    **{name: _from_kwargs(cls) for name, cls in SPEECH_MODELS.items()},
    "speech-transformer": _from_kwargs(SpeechTransformer),
    **{name: _from_kwargs(cls) for name, cls in POINTER_MODELS.items()},
    **{name: _from_kwargs(cls) for name, cls in SEGMENTATION_MODELS.items()},
}


def list_models() -> list[str]:
    """The names :func:`create` builds."""
    return list(MODELS)


def create(name: str, **config: Any) -> nn.Module:
    """Build the model ``name`` from keyword arguments (see the module docstring for what each name takes).

    Raises ``ValueError`` for an unknown name, and for a keyword the model does not take or a value it rejects,
    naming the keyword and the model.
    """
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; expected one of {', '.join(MODELS)}")
    builder = MODELS[name]
    unknown = sorted(set(config) - set(builder.accepts))
    if unknown:
        raise ValueError(f"model {name!r} does not take the keyword argument(s) {', '.join(unknown)}; it takes "
                         f"{', '.join(builder.accepts)}")
    try:
        return builder(**config)
    except TypeError as e:  # a missing required argument
        raise ValueError(f"model {name!r}: {e}") from None
    except ValueError as e:
        raise ValueError(f"model {name!r}: {e}") from None
