"""The core's observer point: attention computations report here, and an observer (:mod:`qkv.capture`) subscribes.

The core (:func:`qkv.attention`, :func:`qkv.weighted_sum`) and the vision blocks import this module and nothing
above them; whatever wants to watch them subscribes an observer. With nobody subscribed, a report costs one test
of a global variable (:func:`active`)::

    if hooks.active():
        return hooks.report_call(attention, query, key, value, kwargs)

An observer has three methods, each called only while it is subscribed and not already handling a report (so the
attention it runs itself to compute weights is not reported again):

- ``on_call(fn, query, key, value, kwargs)``: a call of ``fn`` (:func:`qkv.attention`); the observer must return
  ``fn(query, key, value, **kwargs)``, unchanged, and may compute anything else beside it;
- ``on_weights(weights)``: weights ``(..., Tq, Tk)`` given to :func:`qkv.weighted_sum` by a model that runs the
  three stages itself;
- ``on_map(kind, weights)``: a vision block's map, ``kind`` ``"channel"`` (``(B, C, 1, 1)`` or ``(B, M, C)``) or
  ``"spatial"`` (``(B, 1, H, W)``).

Modules say what they compute with a class attribute ``attention_kind`` (``"self"``, ``"cross"``, ``"pooling"``,
``"channel"``, ``"spatial"``, or None when it depends on the call); an observer reads it, the core does not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from torch import Tensor

__all__ = ["Observer", "KINDS", "active", "subscribe", "unsubscribe", "observer", "report_call", "report_weights",
           "report_map"]

#: what a module may declare as its ``attention_kind``: token-to-token attention (self, cross), a learned query over
#: a sequence (pooling), a gate over channels (channel) or over the positions of a feature map (spatial)
KINDS = ("self", "cross", "pooling", "channel", "spatial")


class Observer(Protocol):
    def on_call(self, fn: Callable[..., Any], query: Tensor, key: Tensor, value: Tensor,
                kwargs: dict[str, Any]) -> Any: ...

    def on_weights(self, weights: Tensor) -> None: ...

    def on_map(self, kind: str, weights: Tensor) -> None: ...


_subscribed: Observer | None = None  # the observer, busy or not
_live: Observer | None = None  # the observer to report to now: None when nobody listens or it is busy


def active() -> bool:
    """Whether a report would reach an observer (the one check the core makes when nobody watches)."""
    return _live is not None


def observer() -> Observer | None:
    """The subscribed observer, or None."""
    return _subscribed


def subscribe(obs: Observer) -> None:
    """Make ``obs`` the observer. One at a time: ``RuntimeError`` when another is subscribed."""
    global _subscribed, _live
    if _subscribed is not None:
        raise RuntimeError(f"an observer is already subscribed ({type(_subscribed).__name__}); observers do not nest")
    _subscribed = _live = obs


def unsubscribe(obs: Observer) -> None:
    """Remove ``obs`` (nothing happens if it is not the subscribed observer)."""
    global _subscribed, _live
    if _subscribed is obs:
        _subscribed = _live = None


class _Busy:
    """While the observer handles a report, reports go nowhere (its own calls of the core are not reported)."""

    def __enter__(self) -> Observer:
        global _live
        obs, _live = _live, None
        self.obs = obs
        return obs

    def __exit__(self, *exc) -> bool:
        global _live
        if _subscribed is self.obs:  # still subscribed (it may have left while busy)
            _live = self.obs
        return False


def report_call(fn: Callable[..., Any], query: Tensor, key: Tensor, value: Tensor, kwargs: dict[str, Any]) -> Any:
    """Hand a call of ``fn(query, key, value, **kwargs)`` to the observer, which runs it; runs it alone otherwise."""
    if _live is None:
        return fn(query, key, value, **kwargs)
    with _Busy() as obs:
        return obs.on_call(fn, query, key, value, kwargs)


def report_weights(weights: Tensor) -> None:
    """Report the weights a model gave :func:`qkv.weighted_sum`."""
    if _live is not None:
        with _Busy() as obs:
            obs.on_weights(weights)


def report_map(kind: str, weights: Tensor) -> None:
    """Report a vision block's ``channel`` or ``spatial`` map."""
    if _live is not None:
        with _Busy() as obs:
            obs.on_map(kind, weights)
