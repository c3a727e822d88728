"""The `teola` command: each option's default in its help, one-line errors for bad input."""

from __future__ import annotations

import argparse

import pytest

from teola.cli import build_parser, main
from teola.cli_support import DefaultsFormatter


@pytest.mark.parametrize("command", ["demo", "bench", "profile"])
def test_every_option_has_a_help_text_and_its_default(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    options = [a for a in sub._actions if a.option_strings and a.dest != "help"]
    formatter = DefaultsFormatter(command)
    assert options
    for option in options:
        assert option.help, f"{command} {option.option_strings[0]}: no help text"
        assert "default" in (formatter._get_help_string(option) or ""), f"{command} {option.option_strings[0]}"
    with pytest.raises(SystemExit):
        main([command, "--help"])
    assert "(default: " in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["demo", "--questions", "9"], "9 is out of range: give a number from 1 to 8"),
        (["demo", "--questions", "two"], "'two' is not a whole number"),
        (["bench", "--rate", "-1"], "-1 must be above zero"),
        (["profile", "llamacpp", "--repeats", "0"], "0 is out of range: give a number at least 1"),
    ],
)
def test_bad_numbers_are_named_in_one_line(argv, message, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1] and "Traceback" not in "".join(err)


def test_a_bad_rate_list_names_the_option_and_gives_an_example() -> None:
    with pytest.raises(SystemExit, match=r"--rates: 'abc' is not a number \(hint: e.g. --rates 0.5,1,2\)"):
        main(["bench", "--rates", "0.5,abc"])


def test_the_demo_without_its_extras_says_which_and_how_to_install(monkeypatch, capsys) -> None:
    import teola.demo.cli as demo_cli

    monkeypatch.setattr(demo_cli.importlib.util, "find_spec", lambda name: None)
    assert main(["demo"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("teola demo needs the extras langchain, local, pgvector (hint: pip install -e")
