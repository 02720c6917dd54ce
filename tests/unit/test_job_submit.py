"""``rayless job submit``'s runtime_env: read from Ray's flags, and merged into the driver's
``ray.init`` as Ray's job manager merges them."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from rayless.cli import build_parser
from rayless.job import job_runtime_env
from rayless.ray._worker import merge_job_runtime_env


def _args(*argv: str) -> argparse.Namespace:
    line = ["job", "submit", *argv]
    return build_parser(line).parse_args(line)


def test_the_flags_make_one_runtime_env_with_absolute_paths(tmp_path: Path) -> None:
    (tmp_path / "env.yaml").write_text(
        "working_dir: ./\nexcludes: ['/.git/']\nenv_vars:\n  TOKENIZERS_PARALLELISM: 'true'\n"
    )
    args = _args(
        "--address=http://127.0.0.1:8265",
        "--runtime-env",
        str(tmp_path / "env.yaml"),
        "--runtime-env-json",
        '{"py_modules": ["libs/mine"], "env_vars": {"A": "1"}}',
        "--",
        "python3",
        "train.py",
        "--lr",
        "0.1",
    )
    env = job_runtime_env(args, str(tmp_path))
    assert env == {
        "working_dir": str(tmp_path),
        "excludes": ["/.git/"],
        "env_vars": {"A": "1"},  # the JSON's key replaces the file's, as Ray's CLI does
        "py_modules": [str(tmp_path / "libs" / "mine")],
    }
    assert args.entrypoint == ["--", "python3", "train.py", "--lr", "0.1"]
    override = _args("--runtime-env-json", '{"working_dir": "a"}', "--working-dir", "b", "x")
    assert job_runtime_env(override, "/w")["working_dir"] == "/w/b"
    with pytest.raises(ValueError, match="a runtime_env is a mapping"):
        job_runtime_env(_args("--runtime-env-json", "[1]", "x"), "/w")


def test_the_jobs_runtime_env_merges_with_ray_inits(monkeypatch: pytest.MonkeyPatch) -> None:
    job = {"working_dir": "/w", "env_vars": {"A": "1"}}
    assert merge_job_runtime_env(job, {"env_vars": {"B": "2"}, "py_modules": ["/m"]}) == {
        "working_dir": "/w",
        "py_modules": ["/m"],
        "env_vars": {"A": "1", "B": "2"},
    }
    assert merge_job_runtime_env(job, None) == job
    with pytest.raises(ValueError, match=r"both set \['A'\]"):
        merge_job_runtime_env(job, {"env_vars": {"A": "3"}})
    with pytest.raises(ValueError, match=r"both set \['working_dir'\]"):
        merge_job_runtime_env(job, {"working_dir": "/x"})
    monkeypatch.setenv("RAY_OVERRIDE_JOB_RUNTIME_ENV", "1")
    assert merge_job_runtime_env(job, {"env_vars": {"A": "3"}, "working_dir": "/x"}) == {
        "working_dir": "/x",
        "env_vars": {"A": "3"},
    }
