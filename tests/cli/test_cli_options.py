"""Every flag of every subcommand comes from an options field, and an option given to a model it does not apply to
is a one-line error (exit 2), from the command line and from Python alike."""

import argparse
import dataclasses

import pytest

from qkv.apps.images import ImageOptions
from qkv.apps.sentiment import SentimentOptions
from qkv.apps.translate import TranslateOptions
from qkv.cli import build_parser, main
from qkv.options import check_options, option, option_fields
from qkv.train import TrainConfig


def _parsers(parser, path=()):
    """``(path, parser)`` for the parser and every subcommand's, depth first."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, (*path, name))


PARSERS = list(_parsers(build_parser()))


def test_every_subcommand_is_walked():
    names = {" ".join(p) for p, _ in PARSERS}
    assert {"explain", "train translate", "train sentiment", "train images", "translate", "evaluate", "classify",
            "show-attention"} <= names


@pytest.mark.parametrize("path,parser", PARSERS, ids=[" ".join(p) or "qkv" for p, _ in PARSERS])
def test_every_flag_maps_to_an_options_field(path, parser):
    classes = getattr(parser, "_qkv_options", [])
    fields = {f.name: cls for cls in classes for f, spec in option_fields(cls) if spec.cli}
    dests = set()
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._VersionAction | argparse._SubParsersAction):
            continue
        assert action.dest in fields, f"qkv {' '.join(path)}: {action.option_strings or action.dest} has no field"
        dests.add(action.dest)
    assert dests == set(fields), f"fields without a flag: {set(fields) - dests}"


def _cases():
    """``(command, options class, field, args)``: the field's flag with a value of a setting it does not apply to."""
    commands = {TranslateOptions: ["train", "translate"], SentimentOptions: ["train", "sentiment", "--data", "x.tsv"],
                ImageOptions: ["train", "images"]}
    for cls, command in commands.items():
        fields = {f.name: (f, s) for f, s in option_fields(cls)}
        for f, spec in option_fields(cls):
            if not spec.cli:
                continue
            for other, values in {**(spec.applies or {}), **(spec.excludes or {})}.items():
                of, ospec = fields[other]
                if spec.excludes and other in spec.excludes:
                    bad = values[0]
                elif ospec.choices:
                    bad = next(c for c in ospec.choices if c not in values)
                else:
                    bad = {"data": "corpus.tsv", "folds": 3}[other]
                yield pytest.param(command, cls, f, spec, other, bad, id=f"{command[1]}-{f.name}-{other}={bad}")


def _flag_args(cls, f, spec):
    flag = spec.flag or "--" + f.name.replace("_", "-")
    default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    if isinstance(default, bool):
        return [flag] if default is False else [f"--no-{f.name.replace('_', '-')}"]
    if f.name == "attn_kwargs":
        return [flag, "reduction=4"]
    if default is None:
        numeric = "dim" in f.name or f.name in ("max_pairs", "kv_heads", "buckets", "bigram_hidden")
        return [flag, "7" if numeric else "en"]
    if isinstance(default, tuple):
        return [flag, ",".join(map(str, default))]
    return [flag, str(default)]


@pytest.mark.parametrize("command,cls,f,spec,other,bad", list(_cases()))
def test_an_option_that_does_not_apply_exits_2_with_one_line(command, cls, f, spec, other, bad, capsys, tmp_path):
    other_flag = "--" + other.replace("_", "-")
    setting = ([other_flag] if bad else ["--no-" + other.replace("_", "-")]) if isinstance(bad, bool) else \
        [other_flag, str(bad)]  # a yes/no option is a bare flag
    args = [*command, *setting, *_flag_args(cls, f, spec), "--out", str(tmp_path / "run")]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("qkv: error: ") and "does not apply" in err
    assert ("--" + f.name.replace("_", "-")) in err or (spec.flag or "") in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("args,flag", [
    (["train", "translate", "--lr", "0"], "--lr"),
    (["train", "translate", "--lr", "nan"], "--lr"),
    (["train", "translate", "--lr", "1e30"], "--lr"),
    (["train", "images", "--epochs", "0"], "--epochs"),
    (["train", "images", "--widths", "8,x"], "--widths"),
    (["train", "sentiment", "--data", "x", "--dropout", "1.5"], "--dropout"),
    (["translate", "run", "x", "--beam", "0"], "--beam"),
    (["--threads", "100000", "explain"], "--threads"),
    (["train", "translate", "--model", "transformer", "--dim", "30", "--num-heads", "4"], "--num-heads"),
])
def test_bad_values_are_one_line_errors_naming_the_flag(args, flag, capsys):
    code = None
    try:
        code = main(args)
    except SystemExit as e:  # errors argparse finds itself (types) exit from the parser
        code = e.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("qkv: error: ") and flag in err


def test_library_options_refuse_what_does_not_apply():
    with pytest.raises(ValueError, match="num_heads does not apply to model bahdanau"):
        TranslateOptions(model="bahdanau", num_heads=8)
    with pytest.raises(ValueError, match="n_train does not apply to data"):
        TranslateOptions(data="corpus.tsv", n_train=10)
    with pytest.raises(ValueError, match="widths does not apply to arch resnet18"):
        ImageOptions(arch="resnet18", widths=(8, 16, 32))
    with pytest.raises(ValueError, match="pooling does not apply"):
        SentimentOptions(model="bigru", pooling="attention")
    with pytest.raises(ValueError, match="penalty.*needs hops > 1"):
        SentimentOptions(penalty=0.1)
    # defaults of options that do not apply are fine: they are not "given"
    assert TranslateOptions(model="bahdanau").num_heads == 4


def test_options_validate_types_choices_and_ranges():
    @dataclasses.dataclass
    class Opts:
        kind: str = option("a", choices=("a", "b"), help="kind")
        n: int = option(1, low=1, high=5, help="n")
        x: float = option(0.5, low=0, low_open=True, help="x")
        sizes: tuple[int, ...] = option((1, 2), low=1, help="sizes")

        def __post_init__(self):
            check_options(self)

    for bad, pattern in [({"kind": "c"}, "kind must be one of a, b"), ({"n": 0}, "n must be >= 1"),
                         ({"n": 6}, "n must be <= 5"), ({"n": 1.5}, "n must be an integer"), ({"n": True}, "integer"),
                         ({"x": 0.0}, "x must be > 0"), ({"x": float("inf")}, "finite"),
                         ({"sizes": (1, 0)}, "sizes must be >= 1"), ({"sizes": [1]}, "sizes must be a tuple"),
                         ({"x": "1"}, "x must be a number")]:
        with pytest.raises(ValueError, match=pattern):
            Opts(**bad)
    assert Opts(kind="b", n=5, x=1e-9, sizes=(3,)).n == 5


def test_train_config_fields_are_the_training_flags():
    parser = dict(PARSERS)[("train", "translate")]
    flags = {a.dest for a in parser._actions}
    assert {f.name for f, s in option_fields(TrainConfig) if s.cli} <= flags
    assert {"monitor", "extra", "final_splits"}.isdisjoint(flags)


# ----------------------------------------------------------------- every command: every option given is used or refused

def _positionals(parser) -> list[str]:
    """Placeholder values of a command's required positional arguments (a run that does not exist)."""
    return ["no-such-run" for a in parser._actions if not a.option_strings and a.nargs in (None, "+")
            and not isinstance(a, argparse._SubParsersAction)]


def _value(cls, f, spec) -> list[str]:
    """A valid command-line value of a field (nothing for a switch)."""
    from qkv.options import base_type, field_type

    tp, _ = base_type(field_type(cls, f.name))
    if spec.choices:
        return [str(spec.choices[-1])]
    if tp is bool:
        return []
    if tp is int:
        return [str(int(spec.low or 0) + 1)]
    if tp is float:
        return ["0.5"]
    if getattr(tp, "__origin__", None) is tuple:
        return ["1,2"]
    return ["x"]


def _flag(cls, f, spec) -> str:
    return spec.flag or "--" + f.name.replace("_", "-")


def _given(cls, f, spec, value: str) -> list[str]:
    """``f``'s flag with ``value``, and the options ``f`` itself requires (so that the rule under test is the one
    that refuses)."""
    from qkv.options import base_type, field_type

    fields = {g.name: (g, s) for g, s in option_fields(cls)}
    needed = [arg for r in spec.requires if r in fields for arg in (_flag(cls, *fields[r]), *_value(cls, *fields[r]))]
    if base_type(field_type(cls, f.name))[0] is bool:  # a switch: given means on
        assert value == "True" and f.default is False, (cls.__name__, f.name, value)
        return [_flag(cls, f, spec), *needed]
    return [_flag(cls, f, spec), value, *needed]


def _rule_cases():
    """``(argv, flag)``: for every command but training (its options are checked above), every option with a rule
    (``requires``, ``excludes``, ``applies``) given where the rule says it means nothing."""
    for path, parser in PARSERS:
        if not path or path[0] == "train":
            continue
        for cls in getattr(parser, "_qkv_options", []):
            fields = {f.name: (f, s) for f, s in option_fields(cls)}
            for f, spec in option_fields(cls):
                base = [*path, *_positionals(parser), _flag(cls, f, spec), *_value(cls, f, spec)]
                needed = [r for r in spec.requires if r in fields]
                if needed:
                    yield pytest.param(base, _flag(cls, f, spec), id=f"{' '.join(path)}-{f.name}-without-{needed[0]}")
                for other, values in (spec.excludes or {}).items():
                    of, ospec = fields[other]
                    yield pytest.param([*base, *_given(cls, of, ospec, str(values[0]))], _flag(cls, f, spec),
                                       id=f"{' '.join(path)}-{f.name}-{other}={values[0]}")
                for other, values in (spec.applies or {}).items():
                    of, ospec = fields[other]
                    bad = True if ospec.choices is None else next(c for c in ospec.choices if c not in values)
                    yield pytest.param([*base, *_given(cls, of, ospec, str(bad))], _flag(cls, f, spec),
                                       id=f"{' '.join(path)}-{f.name}-{other}={bad}")


RULES = list(_rule_cases())


def test_the_predicting_commands_have_rules():
    commands = {p.values[0][0] for p in RULES}
    assert {"transcribe", "summarize", "caption", "segment", "answer", "classify", "show-attention"} <= commands
    ids = {p.id for p in RULES}
    assert {"transcribe-limit-without-evaluate", "transcribe-on_error-without-evaluate",
            "transcribe-length_penalty-beam=1", "summarize-coverage_penalty-beam=1",
            "caption-on_error-without-evaluate", "segment-data-without-evaluate"} <= ids


@pytest.mark.parametrize("argv,flag", RULES)
def test_an_option_that_would_be_ignored_is_refused_naming_it(argv, flag, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(f"qkv: error: {flag} ")
    assert "goes with" in err or "does not apply" in err


def test_an_option_that_is_used_is_not_refused(tmp_path, capsys):
    """The same options, where they mean something, pass the rules (the run is then missing: another error)."""
    for argv in (["transcribe", "no-such-run", "--evaluate", "test", "--max-utterances", "3", "--json", "x.json",
                  "--on-error", "skip"],
                 ["transcribe", "no-such-run", "--evaluate", "test", "--beam", "2", "--length-penalty", "1"],
                 ["summarize", "no-such-run", "--evaluate", "x", "--limit", "2", "--split", "valid"],
                 ["caption", "no-such-run", "--evaluate", "--data", "x", "--on-error", "skip", "--max-images", "2"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "goes with" not in err and "does not apply" not in err and "no-such-run" in err, err


# ------------------------------------------------------------------------------ one device check for every command

def _bad_devices() -> list[str]:
    import torch

    bad = ["tpu", "cuda:99", "gpu0", ""]
    if not torch.cuda.is_available():
        bad.append("cuda")
    if not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        bad.append("mps")
    return bad


DEVICE_COMMANDS = [(path, parser) for path, parser in PARSERS
                   if any(a.dest == "device" for a in parser._actions)]


def test_every_predicting_command_takes_device():
    names = {" ".join(p) for p, _ in DEVICE_COMMANDS}
    assert {"translate", "classify", "caption", "answer", "summarize", "transcribe", "segment", "show-attention",
            "evaluate", "view", "predict", "faithfulness", "train speech"} <= names


@pytest.mark.parametrize("path,parser", DEVICE_COMMANDS, ids=[" ".join(p) for p, _ in DEVICE_COMMANDS])
def test_an_unusable_device_is_one_line_before_any_work(path, parser, capsys, tmp_path):
    extra = ["--data", "x.tsv"] if path == ("train", "sentiment") else []
    out = ["--out", str(tmp_path / "run")] if path[0] == "train" else []
    for device in _bad_devices():
        assert main([*path, *_positionals(parser), *extra, *out, "--device", device]) == 2, device
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and err.startswith(f"qkv: error: --device {device}"), err
    assert not (tmp_path / "run").exists()
