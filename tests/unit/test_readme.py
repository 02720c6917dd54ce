"""The README's test command is exactly what CI runs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```(?:bash|sh)\n(.*?)```", text, re.S)
    assert block, "README.md must open with a shell block holding the two commands"
    return [ln for ln in block.group(1).splitlines() if ln and not ln.startswith("#")]


def test_readme_opens_with_two_commands() -> None:
    cmds = _readme_commands()
    assert len(cmds) == 2, cmds
    assert "torch==2.13.0" in cmds[0] and "torch==2.13.0" in cmds[1]


def test_ci_runs_the_readme_test_command_and_the_slow_tier() -> None:
    test_cmd = _readme_commands()[1]
    final = test_cmd.split("&&")[-1].strip()
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    tiers = [ln.strip() for ln in ci if ln.strip().startswith("tier ")]
    assert any(ln.split("||")[0].strip().endswith(final) for ln in tiers), (final, tiers)
    slow = f"{final} -m slow"
    assert any(ln.split("||")[0].strip().endswith(slow) for ln in tiers), (slow, tiers)
    assert slow in (ROOT / "README.md").read_text(), "the README shows the slow tier's command"
    assert "pip install -q torch==2.13.0" in ci
    assert any("-e '.[test]'" in ln for ln in ci)


def test_ci_lists_the_slowest_tests_and_runs_in_parallel() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'PYTEST_ADDOPTS="--durations=15' in ci
    ini = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^addopts = ".*-n \d+ --dist loadgroup', ini, re.M), "xdist options"
    assert '"pytest-xdist' in ini
