"""Classes of a driver's ``__main__`` travel by value (issue 13, item 1).

Before: actor processes re-imported the driver's script as ``__mp_main__``: a script without
the ``if __name__ == "__main__":`` guard ran again in every actor (a second cluster, or
``asyncio.run() cannot be called from a running event loop``), a script read from stdin
failed with an ImportError after the cluster started, and ``python -c`` and notebooks could
not define actor classes at all. Each driver here runs in its own interpreter.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.environ import without_rayless

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

# The driver: module-level code that leaves a mark, a global helper, an exception class and
# two actor classes of __main__ (the relay catches the greeter's error in another process).
BODY = """
import asyncio, dataclasses, enum, os
from rayless import actors


with open(os.environ["MARK"], "a") as mark:
    mark.write(f"{os.getpid()}\\n")

SCALE = 3

def scaled(x):
    return x * SCALE

class Mode(enum.Enum):
    TRAIN = 1
    EVAL = 2

@dataclasses.dataclass
class Batch:
    ids: list
    mode: Mode

class CodeErr(Exception):
    def __init__(self, code, message):
        super().__init__(code, message)
        self.code = code

class Greeter(actors.Actor):
    def hello(self, who):
        return f"hello {who} {scaled(2)} {__name__}"

    def fail(self, code):
        raise CodeErr(code, "from the greeter")

    def grow(self, batch):
        assert batch.mode is Mode.TRAIN
        return Batch(batch.ids + [len(batch.ids)], Mode.EVAL)

class Relay:
    def __init__(self, greeter):
        self.greeter = greeter

    async def relay(self):
        try:
            await self.greeter.fail(7)
        except CodeErr as exc:
            return f"relay caught {exc.code} {exc.args}"

async def main():
    async with actors.Cluster.local(nodes=1) as cluster:
        greeter = await cluster.spawn(Greeter)
        print(await greeter.hello("driver"))
        try:
            await greeter.fail(42)
        except CodeErr as exc:
            print(f"driver caught {exc.code} {exc.args}")
        relay = await cluster.spawn(Relay, greeter)
        print(await relay.relay())
        got = await greeter.grow(Batch([1, 2], Mode.TRAIN))
        print(type(got) is Batch, got.ids, got.mode is Mode.EVAL)
"""

EXPECTED = [
    "hello driver 6 __main__",
    "driver caught 42 (42, 'from the greeter')",
    "relay caught 7 (7, 'from the greeter')",
    "True [1, 2, 2] True",  # a dataclass and an Enum of __main__, there and back
]


def _run(args: list[str], tmp_path: Path, stdin: str | None = None) -> list[str]:
    """Run a driver; its stdout lines. Asserts it succeeded and its module code ran once."""
    mark = tmp_path / "mark"
    out = subprocess.run(
        [sys.executable, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=180,
        cwd=str(tmp_path),
        env={**_env(), "MARK": str(mark)},
    )
    assert out.returncode == 0, out.stderr
    assert len(mark.read_text().splitlines()) == 1, "the driver's module code ran again"
    return out.stdout.splitlines()


def _env() -> dict[str, str]:

    return without_rayless()


def test_a_script_without_the_main_guard(tmp_path: Path) -> None:
    script = tmp_path / "unguarded.py"
    script.write_text(BODY + "\nasyncio.run(main())\n")
    assert _run([str(script)], tmp_path) == EXPECTED


def test_a_script_with_the_main_guard(tmp_path: Path) -> None:
    script = tmp_path / "guarded.py"
    script.write_text(BODY + "\nif __name__ == '__main__':\n    asyncio.run(main())\n")
    assert _run([str(script)], tmp_path) == EXPECTED


def test_an_unguarded_script_with_the_sync_facade(tmp_path: Path) -> None:
    """Before: every actor re-ran the script and started a second cluster inside itself."""
    script = tmp_path / "sync_driver.py"
    script.write_text(
        BODY
        + textwrap.dedent(
            """
            with actors.Cluster.local_sync(nodes=1) as cluster:
                greeter = cluster.spawn(Greeter)
                print(greeter.hello.call("sync"))
            """
        )
    )
    assert _run([str(script)], tmp_path) == ["hello sync 6 __main__"]


def test_an_unguarded_ray_script_passes_its_dataclasses_and_enums(tmp_path: Path) -> None:
    """A Ray user's script: a dataclass and an Enum of __main__ as arguments and results of
    an actor method and a task (before: a TypeError at the sender)."""
    script = tmp_path / "ray_driver.py"
    script.write_text(
        textwrap.dedent(
            """
            import dataclasses, enum, os
            from rayless import ray

            with open(os.environ["MARK"], "a") as mark:
                mark.write(f"{os.getpid()}\\n")

            ray.init(num_cpus=2)

            class Mode(enum.Enum):
                TRAIN = 1
                EVAL = 2

            @dataclasses.dataclass
            class Batch:
                ids: list
                mode: Mode = Mode.TRAIN

            @ray.remote
            class Worker:
                def grow(self, batch):
                    return Batch(batch.ids + [len(batch.ids)], Mode.EVAL)

            @ray.remote
            def total(batch):
                return sum(batch.ids), batch.mode.name

            w = Worker.remote()
            got = ray.get(w.grow.remote(Batch([1, 2])))
            print(type(got) is Batch, got.ids, got.mode is Mode.EVAL)
            print(ray.get(total.remote(got)))
            """
        )
    )
    assert _run([str(script)], tmp_path) == ["True [1, 2, 2] True", "(5, 'EVAL')"]


def test_a_script_read_from_stdin(tmp_path: Path) -> None:
    assert _run(["-"], tmp_path, stdin=BODY + "\nasyncio.run(main())\n") == EXPECTED


def test_python_dash_c(tmp_path: Path) -> None:
    assert _run(["-c", BODY + "\nasyncio.run(main())\n"], tmp_path) == EXPECTED


@pytest.mark.slow
def test_a_jupyter_notebook(tmp_path: Path) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    cells = [
        "from rayless import actors\ncluster = await actors.Cluster.local(nodes=1)",
        textwrap.dedent(
            """
            class Doubler:
                def double(self, x):
                    return 2 * x

                def fail(self):
                    raise LookupError("nothing here")
            """
        ),
        "doubler = await cluster.spawn(Doubler)\nprint(await doubler.double(21))",
        textwrap.dedent(
            """
            try:
                await doubler.fail()
            except LookupError as exc:
                print("caught", exc.args)
            """
        ),
        "await cluster.aclose()",
    ]
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    path = tmp_path / "driver.ipynb"
    nbformat.write(notebook, str(path))
    client = nbclient.NotebookClient(
        nbformat.read(str(path), as_version=4),
        timeout=180,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    executed = client.execute(env=_env())
    outputs = [out.get("text", "") for cell in executed.cells for out in cell.get("outputs", [])]
    assert "42\n" in outputs and "caught ('nothing here',)\n" in outputs
