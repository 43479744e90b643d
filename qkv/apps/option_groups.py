"""Groups of options that several applications share, as dataclasses their ``NAMEOptions`` inherit: one
definition of each flag (its name, bounds and help) for all of them."""

from __future__ import annotations

from dataclasses import dataclass

from ..options import OptionError, option, ref

__all__ = ["TRANSFORMER", "TransformerOptions", "LMFusionSettings", "on_error_setting", "check_even_hidden"]

#: ``applies=`` of the options that only a Transformer model has
TRANSFORMER = {"model": ("transformer",)}


@dataclass
class TransformerOptions:
    """The width of an application's Transformer model (``model="transformer"``): ``dim``, ``num_heads`` and
    ``ffn_dim``; :meth:`check_heads` checks that the heads divide the width."""

    dim: int = option(128, low=2, applies=TRANSFORMER, help="transformer: model width")
    num_heads: int = option(4, low=1, applies=TRANSFORMER, help="transformer: attention heads")
    ffn_dim: int | None = option(None, low=1, applies=TRANSFORMER, help="transformer: feed-forward width "
                                 "(default: 4 x dim)")

    def check_heads(self) -> None:
        """``OptionError`` when a Transformer's ``num_heads`` does not divide its ``dim``."""
        if getattr(self, "model", None) == "transformer" and self.dim % self.num_heads:
            raise OptionError(ref("num_heads") + " ({heads}) must divide " + ref("dim") + " ({d})", "num_heads",
                              "dim", heads=self.num_heads, d=self.dim)


@dataclass
class LMFusionSettings:
    """A language model fused into a beam (shallow fusion), settings of the generators' ``predict`` and ``evaluate``
    (translate, summarize, speech): ``lm`` a run directory of ``qkv train lm`` (or a loaded
    :class:`~qkv.apps.lm.LanguageModel`), ``lm_weight`` and ``length_reward``."""

    lm: str | None = option(None, metavar="LM_RUN", help="a language-model run (qkv train lm) of the output's tokens, "
                            "fused into the beam (shallow fusion)")
    lm_weight: float | None = option(None, low=0, requires=("lm",), help="weight of the language model's "
                                     "log-probabilities (default 0.3; 0: decoding without it; choose it on valid "
                                     "data)")
    length_reward: float = option(0.0, low=0, requires=("lm",), help="added per output token with --lm, against the "
                                  "early ends a language model favours")


def on_error_setting(bad: str):
    """The ``on_error`` setting of an ``evaluate`` on another data file: ``bad`` (what is refused, e.g. "bad audio
    files or manifest rows") stops with file:line, or is skipped and counted."""
    return option(None, choices=("raise", "skip"), help=f"evaluate on another data file: {bad} stop with file:line, "
                  "or are skipped and counted (default: raise)")


def check_even_hidden(options) -> None:
    """An :class:`~qkv.options.OptionError` when a bidirectional recurrent model's ``hidden_dim`` is odd (it is split
    between the two directions); a Transformer has no such split."""
    if options.model != "transformer" and options.hidden_dim % 2:
        raise OptionError(ref("hidden_dim") + " ({n}) must be even: it is split between two directions",
                          "hidden_dim", n=options.hidden_dim)
