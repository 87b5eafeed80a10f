"""Every option of every tailgate command has a help line, and the help is plain text."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Iterator

import pytest

from deploy import cli

MARKUP = ("`", "%(", "**", "::", ".. ", "](", ":func:", ":class:")
"""reST and Markdown syntax, and printf-style placeholders argparse left unexpanded."""
PLACEHOLDER = re.compile(r"\{[A-Za-z_][A-Za-z0-9_.]*\}")
"""A str.format field left in a help line (`{DEFAULT_SCALE}`)."""


def walk(
    parser: argparse.ArgumentParser, path: str
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """The parser and each of its subcommands' parsers, nested ones included."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from walk(sub, f"{path} {name}")


def captured_parsers(main: Callable[[list[str]], int]) -> list[argparse.ArgumentParser]:
    """The parsers a command's main() builds inside itself (`tailgate live` passes its words
    on), caught at parse_args, before it runs anything."""
    seen: list[argparse.ArgumentParser] = []

    class Caught(Exception):
        pass

    def catch(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        seen.append(self)
        raise Caught

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(argparse.ArgumentParser, "parse_args", catch)
        with pytest.raises(Caught):
            main([])
    return seen


def all_parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    from loadtests.live import main as live_main
    from loadtests.swayam_live import main as pool_main

    found = list(walk(cli.build_parser(), "tailgate"))
    for main in (live_main, pool_main):
        for parser in captured_parsers(main):
            found += list(walk(parser, parser.prog))
    return found


def problems_of(path: str, parser: argparse.ArgumentParser) -> list[str]:
    """What is wrong with one parser's help: options without help, markup, placeholders."""
    out = []
    formatter = parser._get_formatter()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            out += [
                f"{path} {name}: no help line" for name in action.choices if not helps.get(name)
            ]
            continue
        name = "/".join(action.option_strings) or action.dest
        if not action.help or action.help == argparse.SUPPRESS or not action.help.strip():
            out.append(f"{path} {name}: no help line")
            continue
        text = formatter._expand_help(action)
        if PLACEHOLDER.search(text):
            out.append(f"{path} {name}: unexpanded placeholder in {text!r}")
    text = parser.format_help()
    out += [f"{path}: markup {m!r} in its help" for m in MARKUP if m in text]
    return out


def test_every_option_of_every_command_has_a_plain_help_line() -> None:
    parsers = all_parsers()
    names = {path for path, _ in parsers}
    # The walk reaches nested commands, those of tailgate live included.
    for path in ("tailgate edge-agent run", "tailgate sim experiment", "tailgate profile"):
        assert path in names
    assert {"tailgate live run", "tailgate live maxload", "tailgate live pool"} <= names
    problems = [p for path, parser in parsers for p in problems_of(path, parser)]
    assert problems == []


def test_the_walk_finds_an_option_without_help() -> None:
    parser = argparse.ArgumentParser(prog="t")
    sub = parser.add_subparsers(dest="c")
    run = sub.add_parser("run", help="runs")
    nested = run.add_subparsers(dest="d").add_parser("deep")  # no help line for the command
    nested.add_argument("--bare")
    run.add_argument("--fmt", help="rate {unit}")
    problems = [p for path, p_ in walk(parser, "t") for p in problems_of(path, p_)]
    assert problems == [
        "t run deep: no help line",
        "t run --fmt: unexpanded placeholder in 'rate {unit}'",
        "t run deep --bare: no help line",
    ]


def test_top_level_help_lists_every_command_with_one_line() -> None:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    text = parser.format_help()
    commands = list(sub.choices)
    assert {"up", "gateway", "taskserver", "edge-agent", "query", "sim", "profile"} <= set(commands)
    assert {"live", "config"} <= set(commands)
    lines = text.splitlines()
    for name in commands:
        # Each command on a line of its own with its description beside it.
        row = next((line for line in lines if line.split()[:1] == [name]), None)
        assert row is not None, f"{name} missing from tailgate --help"
        assert len(row.split()) > 1, f"{name}: no description in tailgate --help"
    assert not [m for m in MARKUP if m in text]
    assert not PLACEHOLDER.search(text.split("positional arguments:")[1])
