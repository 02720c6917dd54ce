"""An actor's ``executable`` (Ray's ``py_executable``): how it is parsed, which of the
driver's import path goes with it, which node-side spawner starts it."""

from __future__ import annotations

import asyncio
import os
import site
import sys

import pytest

from rayless.actors.api.interpreter import code_paths, parse_executable
from rayless.actors.control.spawner import ProcessSpawner, Spawners, same_interpreter
from rayless.actors.errors import StartError
from rayless.actors.protocol.messages import Template
from rayless.ray._worker import RuntimeEnvSpec, parse_runtime_env
from tests.venvs import make_venv


def test_parse_executable() -> None:
    assert parse_executable(None) == () and parse_executable("") == ()
    assert parse_executable([]) == ()
    assert parse_executable("/v/bin/python") == ("/v/bin/python",)
    assert parse_executable("uv run --locked --extra 'v llm'") == (
        "uv",
        "run",
        "--locked",
        "--extra",
        "v llm",
    )
    assert parse_executable(["python3", "-X", "utf8"]) == ("python3", "-X", "utf8")
    with pytest.raises(ValueError, match="quotation"):
        parse_executable("uv run 'open")
    with pytest.raises(ValueError, match="a string or a list of strings"):
        parse_executable(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="a string or a list of strings"):
        parse_executable(["python", 3])  # type: ignore[list-item]


def test_code_paths_leave_the_drivers_packages_behind(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    code = os.path.join(str(tmp_path), "project")
    packages = site.getsitepackages()[0]
    stdlib = os.path.join(sys.base_prefix, "lib")
    elsewhere = "/opt/other/lib/python3/dist-packages"
    monkeypatch.setattr(sys, "path", [code, "", packages, stdlib, elsewhere])
    assert code_paths(()) == (code, packages, stdlib, elsewhere)  # forked: all of it
    assert code_paths(("/v/bin/python",)) == (code,)


def test_same_interpreter_is_this_binary_in_this_directory(tmp_path: object) -> None:
    assert same_interpreter((sys.executable,))
    assert not same_interpreter((sys.executable, "-X", "utf8"))  # arguments: a fresh process
    assert not same_interpreter((os.path.join(str(tmp_path), "missing"),))
    # another venv's python links to the same binary, but its packages are its own
    other = make_venv(os.path.join(str(tmp_path), "v"), bare=True)
    assert os.path.realpath(other) == os.path.realpath(sys.executable)
    assert not same_interpreter((other,))


def test_spawners_fork_for_our_interpreter_and_exec_others(tmp_path: object) -> None:
    forked = ProcessSpawner()  # stands in for a template's spawner: only its identity counts
    spawners = Spawners({Template.TORCH: forked, Template.LIGHT: forked}, token="t")

    async def run() -> None:
        await spawners.start(lambda pid, code: None)
        assert await spawners.get(Template.TORCH, ()) is forked
        assert await spawners.get(Template.TORCH, (sys.executable,)) is forked
        argv = (sys.executable, "-X", "utf8")
        other = await spawners.get(Template.LIGHT, argv)
        assert other is not forked and await spawners.get(Template.TORCH, argv) is other
        assert spawners.distinct() == [forked, other]
        missing = (os.path.join(str(tmp_path), "nope"), "-m")
        with pytest.raises(StartError, match="not an executable file on this node"):
            await spawners.get(Template.TORCH, missing)
        await spawners.aclose()

    asyncio.run(run())


def test_runtime_env_takes_py_executable_and_config() -> None:
    spec = parse_runtime_env(
        {"env_vars": {"B": "2", "A": "1"}, "py_executable": "uv run", "config": {"x": 1}}
    )
    assert spec == RuntimeEnvSpec((("A", "1"), ("B", "2")), ("uv", "run"))
    assert spec.env == {"A": "1", "B": "2"} and hash(spec)
    with pytest.raises(ValueError, match="conda"):
        parse_runtime_env({"conda": "env"})
    with pytest.raises(ValueError, match=r"'workdir': did you mean 'working_dir'\?"):
        parse_runtime_env({"workdir": "."})
