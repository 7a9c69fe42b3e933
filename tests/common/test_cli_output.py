"""visionmoe.common.cli_output: what a command shows besides its result and its error line."""

import logging
import warnings

import pytest

from visionmoe.common.cli_output import NORMAL, QUIET, VERBOSE, WARNINGS_LOGGER, command_output, verbosity

log = logging.getLogger("visionmoe.tests.cli_output")


def _speak():
    print("result line")
    log.info("stage one: 1.00 s")
    log.warning("dropped 3 of 9 Gaussians\nsecond line")
    warnings.warn("overflow encountered in cast", RuntimeWarning)


@pytest.mark.parametrize("level, out, err", [
    (QUIET, "", ""),
    (NORMAL, "result line\n", "warning: dropped 3 of 9 Gaussians\n"),
    (VERBOSE, "result line\n", "stage one: 1.00 s\nwarning: dropped 3 of 9 Gaussians\n"
                               "RuntimeWarning: overflow encountered in cast (test_cli_output.py:"),
])
def test_levels_and_warnings_as_one_line(capsys, level, out, err):
    with command_output(level):
        _speak()
    captured = capsys.readouterr()
    assert captured.out == out
    assert captured.err.startswith(err) and "Traceback" not in captured.err, captured.err
    assert captured.err.count("\n") == err.count("\n") + (level == VERBOSE)  # one line per record, no raw block


def test_everything_is_restored_afterwards(capsys):
    root_handlers = list(logging.getLogger().handlers)
    before = (logging.getLogger("visionmoe").level, list(logging.getLogger("visionmoe").handlers), warnings.showwarning)
    with command_output(QUIET):
        pass
    with pytest.raises(ValueError):
        with command_output(VERBOSE):
            raise ValueError("the command failed")
    after = (logging.getLogger("visionmoe").level, list(logging.getLogger("visionmoe").handlers), warnings.showwarning)
    assert after == before and logging.getLogger().handlers == root_handlers
    log.warning("outside a command")  # no handler of ours left: nothing of ours printed it
    assert "warning: outside" not in capsys.readouterr().err


def test_warnings_logger_is_under_visionmoe_and_quiet_wins():
    assert WARNINGS_LOGGER.startswith("visionmoe.")
    assert verbosity(quiet=True, verbose=True) == QUIET
    assert verbosity(False, True) == VERBOSE and verbosity(False, False) == NORMAL
