"""The reference of the ``qkv`` commands as Markdown, read from the parser itself (``qkv.cli.build_parser()``).

Every command and subcommand, its usage line, its description and each option with the help text ``--help``
prints (defaults and choices included), in the order the parser lists them. The page cannot drift from the
commands: it is written from them each time the site is built (and the tests compare it with ``--help``).
"""

from __future__ import annotations

import argparse


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                out.append((name, helps.get(name, ""), sub))
    return out


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _flags(action: argparse.Action, formatter) -> str:
    if not action.option_strings:
        return f"`{formatter._metavar_formatter(action, action.dest)(1)[0]}`"
    if action.nargs == 0:
        return ", ".join(f"`{s}`" for s in action.option_strings)
    arg = formatter._format_args(action, formatter._get_default_metavar_for_optional(action))
    return ", ".join(f"`{s} {arg}`" for s in action.option_strings)


def options_table(parser: argparse.ArgumentParser) -> list[str]:
    """The rows of the table of a parser's arguments (positionals first), with ``--help``'s text."""
    formatter = parser._get_formatter()
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) or action.help == argparse.SUPPRESS:
            continue
        help_text = formatter._expand_help(action) if action.help else ""
        rows.append(f"| {_flags(action, formatter)} | {_cell(help_text)} |")
    return (["| argument | what it does |", "|---|---|", *rows]) if rows else []


def _section(name: str, summary: str, parser: argparse.ArgumentParser, depth: int) -> list[str]:
    lines = [f"{'#' * depth} `{name}`", ""]
    if summary:
        lines += [_cell(summary), ""]
    if parser.description and parser.description != summary:
        lines += [parser.description.strip(), ""]
    lines += ["```text", parser.format_usage().strip(), "```", ""]
    subs = _subcommands(parser)
    table = options_table(parser)
    if table:
        lines += [*table, ""]
    for sub_name, sub_help, sub in subs:
        lines += _section(f"{name} {sub_name}", sub_help, sub, min(depth + 1, 4))
    return lines


def markdown() -> str:
    """The whole page."""
    from qkv.cli import build_parser

    parser = build_parser()
    lines = ["# Command-line reference", "",
             "Every `qkv` command with the options and help that `qkv COMMAND --help` prints; this page is written "
             "from the command's own parser each time the documentation is built. Options that every command "
             "takes come first.", ""]
    lines += ["## `qkv`", "", (parser.description or "").strip(), "", "```text", parser.format_usage().strip(),
              "```", "", *options_table(parser), ""]
    for name, summary, sub in _subcommands(parser):
        lines += _section(f"qkv {name}", summary, sub, 2)
    return "\n".join(lines) + "\n"
