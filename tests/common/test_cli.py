"""visionmoe.common.cli and .validators: exit codes, signals, one-line errors, validators."""

import argparse
import os
import signal

import pytest

from visionmoe.common import validators as V
from visionmoe.common.cli import (
    EXIT_INTERRUPTED, EXIT_TERMINATED, EXIT_USAGE, CLIError, OneLineParser, Terminated, exit_status,
    import_with_signals_held, memory_error_line, signals_as_exceptions,
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


# --------------------------------------------------------------------------- issue 51/52: one line for every end


def test_subcommand_parsers_are_one_line_too(capsys):
    p = OneLineParser(prog="tool")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("run").add_argument("--n", type=V.positive_int, required=True)
    for argv, expected in ((["run", "--n", "x"], "tool run: error: argument --n: expected a positive integer"),
                           (["run"], "tool run: error: the following arguments are required: --n"),
                           (["fly"], "tool: error: argument command: invalid choice: 'fly'")):
        with pytest.raises(SystemExit) as e:
            p.parse_args(argv)
        err = capsys.readouterr().err
        assert e.value.code == EXIT_USAGE and err.count("\n") == 1 and err.startswith(expected), err
        assert "usage:" not in err
    with pytest.raises(SystemExit) as e:
        p.parse_args(["run", "--help"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("usage: tool run")


def test_numpy_memory_error_names_the_size(capsys):
    import numpy as np

    try:
        np.empty((1 << 40,), np.float32)  # 4 TiB: refused by the allocator at once
    except MemoryError as exc:
        line = memory_error_line(exc)
        assert exit_status(exc, "tool cmd", ()) == EXIT_USAGE
    else:  # pragma: no cover - a machine that grants 4 TiB
        pytest.skip("the allocator granted 4 TiB")
    assert line.startswith("out of memory: could not allocate 4096.00 GiB (4398046511104 bytes: an array of "
                           "1099511627776 items of 4 bytes)"), line
    assert capsys.readouterr().err == f"tool cmd: error: {line}\n"


def test_torch_and_bare_memory_errors_are_one_line():
    import torch

    with pytest.raises(RuntimeError) as info:
        torch.empty(1 << 46, dtype=torch.uint8)  # 64 TiB
    assert memory_error_line(info.value) == (
        f"out of memory: could not allocate 65536.00 GiB ({1 << 46} bytes); free memory or use a smaller input")
    line = memory_error_line(MemoryError())
    assert line.startswith("out of memory") and "an allocation failed" in line
    assert memory_error_line(RuntimeError("a bug")) is None and memory_error_line(ValueError("x")) is None


def test_a_broken_pipe_that_is_not_stdout_is_an_error():
    """Only a reader of stdout that has gone ends a command quietly; a writer's subprocess that
    died (ffmpeg) is a failure, passed on like any other error."""
    assert exit_status(BrokenPipeError(32, "Broken pipe"), "tool cmd", ()) is None
