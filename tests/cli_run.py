"""Running the CLI in the test's process: its exit code and output, and the shape of its errors
(one line, naming the command), for the CLI's tests and those of commands elsewhere."""

from __future__ import annotations

import pytest

from lanceloader.cli import main


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of ``lanceloader ARGS`` run in this process."""
    try:
        code = main(args)
    except SystemExit as exc:  # argparse: --help and usage errors
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(code: int, err: str, command: str, *fragments: str) -> None:
    assert code == 2, err
    assert err.startswith(f"lanceloader {command}: error: "), err
    assert len(err.strip().splitlines()) == 1, err
    for fragment in fragments:
        assert fragment in err, err
