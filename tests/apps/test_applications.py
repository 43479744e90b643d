"""Every application follows the contract of `qkv.apps.base` (CONTRIBUTING.md, "Adding an application"): the same
modules, the same parts under the same names, a predictor with the four methods, `--device auto` everywhere."""

import dataclasses
import importlib
import inspect
from pathlib import Path

import pytest

import qkv.apps
from qkv.apps import application, catalogue
from qkv.apps.base import Application, ApplicationTask, Predictor
from qkv.cli import build_parser

TASKS = Path(qkv.apps.__file__).parent


@pytest.mark.parametrize("name", list(catalogue()))
def test_every_application_has_the_same_parts(name):
    app = application(name)
    assert isinstance(app, Application) and app.name == name
    package = TASKS / name
    assert {"__init__.py", "options.py", "task.py", "predictor.py"} <= {p.name for p in package.glob("*.py")}
    options_mod = importlib.import_module(f"qkv.apps.{name}.options")
    task_mod = importlib.import_module(f"qkv.apps.{name}.task")
    predictor_mod = importlib.import_module(f"qkv.apps.{name}.predictor")
    # where each part lives
    assert app.options.__module__ == options_mod.__name__ and app.train_defaults.__module__ == options_mod.__name__
    assert app.load_data.__module__ == task_mod.__name__ and app.model_spec.__module__ == task_mod.__name__
    assert app.task.__module__ == task_mod.__name__ and app.predictor.__module__ == predictor_mod.__name__
    # names: <Name>Options and <Name>Task with the same <Name>
    assert app.options.__name__.endswith("Options") and app.task.__name__.endswith("Task")
    assert app.options.__name__[:-len("Options")] == app.task.__name__[:-len("Task")]
    assert dataclasses.is_dataclass(app.options)
    # NAMETask(options, data=None), with sizes() giving model_spec's keyword arguments
    assert list(inspect.signature(app.task.__init__).parameters)[:3] == ["self", "options", "data"]
    assert inspect.signature(app.task.__init__).parameters["data"].default is None
    assert callable(getattr(app.task, "sizes", None)), f"{name}: the task has no sizes()"
    # the task's name is the application's (it is what a checkpoint stores) and the predictor's
    assert app.task.name == name and app.predictor.task == name
    # a predictor of the application's task, with its own methods, none left abstract; loading (written once, in
    # the base) on device "auto" by default
    assert issubclass(app.predictor, Predictor) and not inspect.isabstract(app.predictor)
    assert issubclass(app.task, ApplicationTask) and app.predictor.task_class is app.task
    for method in ("predict", "evaluate", "result_row"):
        assert method in vars(app.predictor), f"{name}: {method} not defined"
    # its page: the base's view (input, recorded prediction) ending in the application's view_page, or a view of its own
    assert any(m in vars(c) for c in app.predictor.__mro__[:-1] if c is not Predictor for m in ("view_page", "view")), \
        f"{name}: no view_page"
    assert "load" not in vars(app.predictor), f"{name}: its own load"
    for method in ("config", "save_assets", "load_assets"):  # the base's, once for all
        assert method not in vars(app.task), f"{name}: its own {method}"
    assert inspect.signature(app.predictor.load).parameters["device"].default == "auto"
    ev = inspect.signature(app.predictor.evaluate).parameters
    assert list(ev)[:2] == ["self", "data"] and ev["split"].default == "test" and "limit" in ev
    # the defaults make a valid trainer configuration, and the public names are re-exported
    app.train_defaults(app.options()) if name != "sentiment" else app.train_defaults(app.options(data="x"))
    package_mod = importlib.import_module(f"qkv.apps.{name}")
    for obj in (app.options, app.task, app.predictor, app.load_data, app.model_spec, app.train_defaults):
        assert getattr(package_mod, obj.__name__) is obj


def _commands(parser, prefix=()):
    for action in parser._actions:
        if action.__class__.__name__ == "_SubParsersAction":
            for name, sub in action.choices.items():
                yield from _commands(sub, (*prefix, name))
    yield prefix, parser


def test_every_command_defaults_to_device_auto():
    from qkv.options import default_of

    seen = 0
    for path, parser in _commands(build_parser()):
        for cls in getattr(parser, "_qkv_options", []):  # the options dataclasses a parser's flags come from
            for f in dataclasses.fields(cls):
                if f.name == "device":
                    seen += 1
                    assert default_of(f) == "auto", f"qkv {' '.join(path)}: --device defaults to {default_of(f)!r}"
    assert seen >= 8


def test_train_evaluate_and_view_know_every_application():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    train = next(a for a in sub.choices["train"]._actions if a.__class__.__name__ == "_SubParsersAction")
    assert set(catalogue()) <= set(train.choices)
    assert {"evaluate", "view"} <= set(sub.choices)


def test_unknown_application_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no application 'telepathy'.*translate"):
        application("telepathy")
    from qkv.cli import main

    assert main(["evaluate", str(tmp_path / "nothing")]) == 2
