"""Does a checkpoint fit a model? The differences between the model a run was started with and the one a resumed
run would build, named by the options that make them (:func:`model_differences`), and between weights and a model
(:func:`weight_differences`): what resuming a run, :func:`qkv.train.checkpoint.load_model` and the applications'
loading say when they refuse."""

from __future__ import annotations

import json
from typing import Any

from torch import Tensor, nn

__all__ = ["model_differences", "model_change", "weight_differences"]

_ABSENT = object()


def _model_part(config: dict[str, Any]) -> dict[str, Any]:
    """What of a task's ``config()`` shapes its model: the ``model`` spec (``{"name", "config"}``) of an application,
    else the whole config but the options (a plain :class:`~qkv.train.Task`'s config rebuilds its model)."""
    if isinstance(config.get("model"), dict):
        return config["model"]
    return {k: v for k, v in config.items() if k != "options"}


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _same(x: Any, y: Any) -> bool:
    """Equal values of a config read back from JSON (``NaN`` equal to itself)."""
    return x is y or x == y or (x is not _ABSENT and y is not _ABSENT and json.dumps(x) == json.dumps(y))


def _show(v: Any) -> str:
    return "(none)" if v is _ABSENT else "(default)" if v is None else json.dumps(v, default=str)


def model_differences(stored: dict[str, Any], given: dict[str, Any]) -> list[str]:
    """How the model that the task config ``given`` builds differs from the one ``stored`` in a checkpoint, named by
    the options that make the difference: ``["hidden_dim 64 (stored) vs 32 (given)", ...]`` (empty: the same
    model). An option is named when the model entry of its name differs (or, for the model's name, when its value is
    part of the name); a difference that no option of the same name explains is named by its model entry, with the
    options that changed besides."""
    templates, options, values = model_change(stored, given)
    return [t.format(**values, **{o: o for o in options}) for t in templates]


def model_change(stored: dict[str, Any], given: dict[str, Any]) -> tuple[list[str], list[str], dict[str, str]]:
    """:func:`model_differences` as templates of a :class:`~qkv.options.OptionError` (each option a ``{field}``, each
    value shown a ``{_N}``), the options they name and the values: ``(templates, options, values)``."""
    values: dict[str, str] = {}
    options: list[str] = []

    def raw(text: str) -> str:
        values[f"_{len(values)}"] = text
        return "{" + f"_{len(values) - 1}" + "}"

    def show(v: Any) -> str:
        return raw(_show(v))

    def opt(k: str) -> str:
        if not k.isidentifier():
            return raw(k)
        options.append(k)
        return "{" + k + "}"

    stored, given = (json.loads(json.dumps(c, default=str)) for c in (stored, given))  # both as written to disk
    a, b = _flat(_model_part(stored)), _flat(_model_part(given))
    keys = sorted(k for k in a.keys() | b.keys() if not _same(a.get(k, _ABSENT), b.get(k, _ABSENT)))
    if not keys:
        return [], options, values
    so, go = stored.get("options") or {}, given.get("options") or {}
    changed = sorted(k for k in so.keys() | go.keys() if not _same(so.get(k, _ABSENT), go.get(k, _ABSENT)))
    leaves = {k.rsplit(".", 1)[-1] for k in keys}
    by_leaf = [k for k in changed if k in leaves]
    names = " ".join(str(v) for v in (a.get("name"), b.get("name")) if isinstance(v, str))
    by_name = [k for k in changed if k not in by_leaf and "name" in leaves and
               any(isinstance(v, str) and v and v in names for v in (so.get(k), go.get(k)))]
    named = by_leaf + by_name
    out = [f"{opt(k)} {show(so.get(k, _ABSENT))} (stored) vs {show(go.get(k, _ABSENT))} (given)" for k in named]
    # another model: its other entries differ as a consequence; else every entry no option of its name explains
    rest = [] if by_name else [k for k in keys if k.rsplit(".", 1)[-1] not in by_leaf]
    if rest:
        out += [f"the model's {raw(k.removeprefix('config.'))} {show(a.get(k, _ABSENT))} (stored) vs "
                f"{show(b.get(k, _ABSENT))} (given)" for k in rest[:4]]
        if len(rest) > 4:
            out.append(f"{len(rest) - 4} more")
        others = [k for k in changed if k not in named]
        if others:
            out.append("options changed besides: " + ", ".join(
                f"{opt(k)} {show(so.get(k, _ABSENT))} -> {show(go.get(k, _ABSENT))}"
                for k in others[:4]) + (f" and {len(others) - 4} more" if len(others) > 4 else ""))
    return out, options, values


def weight_differences(state_dict: dict[str, Tensor], model: nn.Module) -> list[str]:
    """How the weights ``state_dict`` fail to fit ``model``: missing or unexpected names, other shapes (the first
    few, then a count; empty: they fit)."""
    own = model.state_dict()
    found = [f"weight {k} is {tuple(t.shape)} in the checkpoint, {tuple(own[k].shape)} in the model"
             for k, t in state_dict.items() if k in own and tuple(t.shape) != tuple(own[k].shape)]
    found += [f"the model has no weight {k}" for k in state_dict if k not in own]
    found += [f"the checkpoint has no weight {k}" for k in own if k not in state_dict]
    return found[:3] + ([f"{len(found) - 3} more"] if len(found) > 3 else [])
