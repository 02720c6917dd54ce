"""Every ``rayless`` subcommand answers ``--help`` (an argparse help text with a bare ``%``
crashed ``rayless launch --help`` with ValueError)."""

from __future__ import annotations

import pytest

from rayless.cli import SUBCOMMANDS, main


@pytest.mark.parametrize("command", sorted(SUBCOMMANDS))
def test_every_subcommand_prints_its_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    assert f"rayless {command}" in capsys.readouterr().out
