"""The blocking faces written by scripts/gen_faces.py: the checked-in ones are current, a
face gets every public member of its async class with the same signature and docstring (a
new async method is one run of the script away), and SyncCluster's generated verbs keep its
timeout and its ClosedError once closed."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from rayless.actors.api import portal as portals
from rayless.actors.api.cluster import Cluster
from rayless.actors.api.sync import DEFAULT_TIMEOUT, SyncCluster
from rayless.transport.errors import ClosedError

ROOT = Path(__file__).resolve().parents[2]


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_faces", ROOT / "scripts" / "gen_faces.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_faces"] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


gen = _generator()


def test_the_checked_in_faces_are_current() -> None:
    assert gen.stale() == [], "a face is stale: run python scripts/gen_faces.py"


def test_sync_cluster_has_every_public_member_of_cluster() -> None:
    found = gen.members(Cluster)
    assert {"spawn", "spawn_group", "spawn_component", "shutdown", "token"} <= set(found)
    for name, member in found.items():
        own = getattr(SyncCluster, gen.RENAMED.get(name, name), None)
        assert own is not None, f"SyncCluster lacks {name}"
        theirs = getattr(Cluster, name)
        if member.kind == "property":
            assert isinstance(own, property), name
            continue
        if name in gen.RENAMED:
            continue  # close: the face's own
        assert inspect.signature(own).parameters == inspect.signature(theirs).parameters, name
        assert own.__doc__ == theirs.__doc__, name


class _FakeCluster:
    """What SyncCluster's verbs reach: each call recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[object, ...], dict[str, object]]] = []

    @property
    def token(self) -> str:
        return "t0k"

    async def spawn_group(self, cls: type, n: int, *args: Any, **kwargs: Any) -> list[str]:
        self.calls.append(("spawn_group", (cls, n, *args), kwargs))
        return [f"h{i}" for i in range(n)]

    async def shutdown(self) -> None:
        self.calls.append(("shutdown", (), {}))

    async def aclose(self) -> None:
        self.calls.append(("aclose", (), {}))


def test_sync_cluster_verbs_block_within_the_default_timeout_and_fail_once_closed() -> None:
    portal = portals.Portal("test-sync")
    fake = _FakeCluster()
    sync = SyncCluster(portal, fake)  # type: ignore[arg-type]
    limits: list[float | None] = []
    run = portal.run

    def recorded(aw: Any, timeout: float | None = None) -> Any:
        limits.append(timeout)
        return run(aw, timeout)

    portal.run = recorded  # type: ignore[method-assign]
    try:
        assert sync.spawn_group(int, 2, 7, torch_distributed=True) == ["h0", "h1"]
        assert sync.shutdown() is None and sync.token == "t0k"
        assert fake.calls == [
            ("spawn_group", (int, 2, 7), {"torch_distributed": True}),
            ("shutdown", (), {}),
        ]
        assert limits == [DEFAULT_TIMEOUT, DEFAULT_TIMEOUT]
    finally:
        sync.close()
    assert fake.calls[-1][0] == "aclose"
    with pytest.raises(ClosedError, match="sync cluster is closed"):
        sync.spawn_group(int, 1)
    with pytest.raises(ClosedError):
        sync.shutdown()


SOURCE = '''
from __future__ import annotations

import os
from decimal import Decimal
from typing import TypeVar

T = TypeVar("T")


class Base:
    async def inherited(self, x: int) -> int:
        """Base's."""
        return x

    async def replaced(self) -> str:
        return "base"


class Source(Base):
    """The async class."""

    @property
    def label(self) -> str:
        """Its label."""
        return "src"

    async def add(
        self, a: int, b: int = 1, *rest: int, scale: Decimal = Decimal(1), **kw: str
    ) -> Decimal:
        """Add them up.

        Raises:
            ValueError: never.
        """
        return (a + b + sum(rest)) * scale

    async def where(self, path: str | os.PathLike[str]) -> str:
        return os.fspath(path)

    async def wait(self, x: int, timeout: float | None = 5.0) -> int:
        return x

    async def replaced(self) -> str:
        return "source"

    async def mine(self) -> int:
        return 1

    async def aclose(self) -> None:
        self.closed = True

    def now(self, y: int) -> int:
        return y

    @classmethod
    def make(cls) -> Source:
        return cls()

    async def _private(self) -> None:
        return None
'''

FACE = '''
from __future__ import annotations

import asyncio
from typing import Any


class Face:
    """A face of Source."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.limits: list[float | None] = []

    def run(self, aw: Any, timeout: float | None = 99.0) -> Any:
        self.limits.append(timeout)
        return asyncio.run(aw)

    def mine(self) -> int:
        return -1

    # -- generated by scripts/gen_faces.py from Source: do not edit, run the script --
    # -- end of the generated members --
'''


@pytest.fixture
def fixture_face(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "facefix_src.py").write_text(textwrap.dedent(SOURCE).lstrip())
    (tmp_path / "facefix_face.py").write_text(textwrap.dedent(FACE).lstrip())
    for name in ("facefix_src", "facefix_face"):
        sys.modules.pop(name, None)
    yield gen.Face(
        path=str(tmp_path / "facefix_face.py"),
        face="Face",
        source="facefix_src:Source",
        inner="self.inner",
        call="self.run({aw})",
        timed_call="self.run({aw}, timeout if timeout is None else fabs(timeout))",
        module="facefix_face",
        needs=("from math import fabs",),
    )
    for name in ("facefix_src", "facefix_face"):
        sys.modules.pop(name, None)


def test_a_face_gets_every_public_member_of_its_async_class(fixture_face: Any) -> None:
    path = Path(fixture_face.path)
    assert gen.stale([fixture_face]) == [str(path)]
    text = gen.render(fixture_face)
    path.write_text(text)
    assert gen.stale([fixture_face]) == []  # written once, current
    assert "from decimal import Decimal" in text  # a default's name: imported at run time
    assert "from math import fabs" in text  # what the call template uses
    assert "if TYPE_CHECKING:\n    import os" in text  # an annotation's only: for mypy
    sys.modules.pop("facefix_face", None)
    face_cls = importlib.import_module("facefix_face").Face
    source_cls = importlib.import_module("facefix_src").Source
    from decimal import Decimal

    face = face_cls(source_cls())
    assert face.add(1, 2, 3, scale=Decimal(2), k="v") == Decimal(12)
    assert face.inherited(4) == 4 and face.replaced() == "source" and face.where("a") == "a"
    assert face.wait(1) == 1 and face.wait(2, timeout=-7.5) == 2 and face.wait(3, None) == 3
    assert face.label == "src" and face.now(5) == 5 and face.mine() == -1  # its own stays
    face.close()
    assert face.inner.closed
    assert face.limits == [99.0, 99.0, 99.0, 99.0, 5.0, 7.5, None, 99.0]
    for absent in ("make", "_private", "aclose"):
        assert absent not in vars(face_cls)
    sig = inspect.signature(face_cls.add)
    assert sig == inspect.signature(source_cls.add)
    assert face_cls.add.__doc__ == source_cls.add.__doc__
    assert face_cls.label.__doc__ == "Its label."


def test_a_new_async_method_makes_the_face_stale_until_the_script_runs(
    fixture_face: Any,
) -> None:
    path = Path(fixture_face.path)
    path.write_text(gen.render(fixture_face))
    src = Path(path.parent / "facefix_src.py")
    src.write_text(
        src.read_text() + "\n    async def extra(self, n: int) -> list[int]:\n"
        '        """New."""\n        return [n]\n'
    )
    importlib.reload(sys.modules["facefix_src"])
    assert gen.stale([fixture_face]) == [str(path)]
    path.write_text(gen.render(fixture_face))
    sys.modules.pop("facefix_face", None)
    face_cls = importlib.import_module("facefix_face").Face
    assert face_cls(sys.modules["facefix_src"].Source()).extra(3) == [3]
    assert "def extra(self, n: int) -> list[int]:" in path.read_text()


def test_a_type_variable_the_face_module_lacks_is_named(fixture_face: Any) -> None:
    src = Path(fixture_face.path).parent / "facefix_src.py"
    src.write_text(src.read_text() + "\n    async def same(self, x: T) -> T:\n        return x\n")
    with pytest.raises(gen.GenerationError, match="must define the TypeVar T"):
        gen.render(fixture_face)


def test_a_face_without_its_marker_region_is_refused(fixture_face: Any) -> None:
    text = Path(fixture_face.path).read_text().replace(gen.END, "")
    with pytest.raises(gen.GenerationError, match="needs one region"):
        gen.render(fixture_face, text)
