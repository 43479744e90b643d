"""Predictors whose beam can fuse a language model (shallow fusion): translation, summarisation and speech
recognition take ``lm=`` a language-model run or a loaded :class:`~qkv.apps.lm.LanguageModel`."""

from __future__ import annotations

import os
from typing import Any

from . import application_of

__all__ = ["LanguageModelFusion"]


class LanguageModelFusion:
    """A mixin of a :class:`~qkv.apps.predictor.Predictor`: :meth:`language_model` reads the language model its
    beam fuses."""

    def language_model(self, lm: Any) -> Any:
        """``lm`` for shallow fusion in this model's beam: a language-model run directory loaded on this model's
        device, or an already loaded :class:`~qkv.apps.lm.LanguageModel` as it is. A run of another application is
        a ``ValueError``."""
        if lm is None or not isinstance(lm, str | os.PathLike):
            return lm
        app = application_of(lm)
        if app.name != "lm":
            raise ValueError(f"{lm} is a {app.name} run, not a language model (a run of the lm application)")
        return app.predictor.load(lm, self.device)
