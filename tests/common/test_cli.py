"""visionmoe.common.cli and .validators: exit codes, signals, one-line errors, validators."""

import argparse
import os
import signal

import pytest

from visionmoe.common import validators as V
from visionmoe.common.cli import (
    EXIT_INTERRUPTED, EXIT_TERMINATED, EXIT_USAGE, CLIError, OneLineParser, Terminated, exit_status,
    import_with_signals_held, signals_as_exceptions,
)


def test_exit_status_prints_one_line_per_kind(capsys):
    assert exit_status(KeyboardInterrupt(), "tool cmd", ()) == EXIT_INTERRUPTED
    assert exit_status(Terminated(), "tool cmd", ()) == EXIT_TERMINATED
    assert exit_status(CLIError("bad value\nsecond line"), "tool cmd", ()) == EXIT_USAGE
    assert exit_status(ValueError("boom"), "tool cmd", (ValueError,)) == EXIT_USAGE
    assert exit_status(ValueError(""), "tool cmd", (ValueError,)) == EXIT_USAGE
    assert exit_status(RuntimeError("a bug"), "tool cmd", (ValueError,)) is None
    err = capsys.readouterr().err.splitlines()
    assert err == ["tool cmd: interrupted", "tool cmd: terminated", "tool cmd: error: bad value",
                   "tool cmd: error: boom", "tool cmd: error: ValueError"]


def test_sigterm_becomes_an_exception_and_the_handlers_are_restored():
    before_term, before_int = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with pytest.raises(Terminated):
        with signals_as_exceptions():
            os.kill(os.getpid(), signal.SIGTERM)  # Python runs the handler before the next line
    assert signal.getsignal(signal.SIGTERM) == before_term and signal.getsignal(signal.SIGINT) == before_int


def test_imports_complete_under_a_held_signal():
    import_with_signals_held("json", "csv")


def test_one_line_parser(capsys):
    p = OneLineParser(prog="tool")
    p.add_argument("--n", type=V.positive_int)
    with pytest.raises(SystemExit) as e:
        p.parse_args(["--n", "0"])
    assert e.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tool: error: argument --n: expected a positive integer")


@pytest.mark.parametrize("fn, good, bad", [
    (V.positive_int, ("1", 1), ["0", "-1", "x", "1.5"]),
    (V.nonnegative_int, ("0", 0), ["-1", "x"]),
    (V.rgb, ("0,0.5,1", [0.0, 0.5, 1.0]), ["1,1", "2,0,0", "a,b,c"]),
])
def test_validators(fn, good, bad):
    assert fn(good[0]) == good[1]
    for text in bad:
        with pytest.raises(argparse.ArgumentTypeError, match="expected"):
            fn(text)


def test_check_finite():
    V.check_finite("--scale", 0.0, 0.0)
    with pytest.raises(CLIError, match="--fps must be > 0, got 0"):
        V.check_finite("--fps", 0.0, 0.0, strict=True)
    with pytest.raises(CLIError, match="finite"):
        V.check_finite("--scale", float("nan"))
