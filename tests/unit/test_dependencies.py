"""The runtime imports without the demo extra; the wheel holds one top-level name."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

DEMO_EXTRA = ("yaml", "matplotlib", "transformers", "tokenizers", "safetensors")
BLOCK = """
import importlib.abc, sys

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, Block())
"""


def _run(code: str, blocked: tuple[str, ...] = DEMO_EXTRA) -> subprocess.CompletedProcess[str]:
    block = BLOCK.format(blocked=blocked)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(block) + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def test_runtime_packages_import_without_the_demo_extra() -> None:
    proc = _run(
        """
        import rayless.transport, rayless.placement, rayless.actors, rayless.store
        import rayless.actors.control.agent, rayless.actors.control.head
        import rayless.actors.launch.node
        import rayless.weights.client, rayless.weights.sync
        print("ok")
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_demo_without_its_extra_says_what_to_install() -> None:
    proc = _run(
        """
        from rayless.cli import main
        raise SystemExit(main(["demo"]))
        """
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "pip install 'rayless[demo]'" in proc.stderr


def test_matplotlib_and_yaml_are_not_base_dependencies() -> None:
    tomllib = pytest.importorskip("tomllib")
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = " ".join(meta["dependencies"]).lower()
    assert "matplotlib" not in base and "pyyaml" not in base
    demo = " ".join(meta["optional-dependencies"]["demo"]).lower()
    assert "matplotlib" in demo and "pyyaml" in demo
    for name in ("transformers", "tokenizers", "safetensors"):  # the HF GRPO demo
        assert name not in base and f"{name}==" in demo


def test_the_hf_demo_without_its_extra_says_what_to_install() -> None:
    proc = _run(
        """
        from rayless.cli import main
        raise SystemExit(main(["demo", "--config", "grpo_hf"]))
        """,
        blocked=("transformers",),
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "needs transformers" in proc.stderr, proc.stderr
    assert "starting an embedded cluster" not in proc.stdout  # refused before any start


@pytest.mark.slow
def test_the_wheel_holds_only_rayless(tmp_path: Path) -> None:
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    proc = subprocess.run(
        [*pip, "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0 and "No module named" in proc.stderr:
        pytest.skip(f"cannot build a wheel here: {proc.stderr[-200:]}")
    assert proc.returncode == 0, proc.stderr
    (wheel,) = tmp_path.glob("rayless-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"rayless"}, tops
    for sub in ("transport", "placement", "actors", "store", "weights"):
        assert f"rayless/{sub}/__init__.py" in names
        assert f"rayless/{sub}/py.typed" in names
    # Every package of the checkout is in the wheel (a subpackage missing from pyproject's
    # ``packages`` list would be left out silently).
    for init in sorted(ROOT.glob("*/**/__init__.py")):
        rel = init.relative_to(ROOT)
        if rel.parts[0] in ("transport", "placement", "actors", "store", "weights"):
            assert f"rayless/{rel.as_posix()}" in names, rel
        elif rel.parts[0] == "rayless":
            assert rel.as_posix() in names, rel
    assert "rayless/configs/default.yaml" in names


def test_every_package_of_the_checkout_is_listed_for_the_wheel() -> None:
    # The quick form of the wheel test above (slow tier): a subpackage missing from
    # pyproject's ``packages`` is left out of the wheel silently.
    tomllib = pytest.importorskip("tomllib", reason="Python 3.11's tomllib reads pyproject.toml")

    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    layers = ("transport", "placement", "actors", "store", "weights")
    found = set()
    for init in ROOT.glob("*/**/__init__.py"):
        rel = init.parent.relative_to(ROOT)
        if rel.parts[0] in layers:
            found.add(".".join(("rayless", *rel.parts)))
        elif rel.parts[0] == "rayless":
            found.add(".".join(rel.parts))
    assert found - listed == set()
