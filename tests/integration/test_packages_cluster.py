"""A spawn's packages (``working_dir``, ``py_modules``) on a two-node local cluster: every
node fetches them from the head and runs the actor from its own extract."""

from __future__ import annotations

from pathlib import Path

import pytest

from rayless.actors import Cluster
from rayless.actors.api.packages import pack_module, pack_working_dir
from rayless.actors.errors import PackageError
from rayless.actors.protocol.messages import PackageRef
from tests.integration.actor_classes import Importer

pytestmark = pytest.mark.integration


async def test_each_node_runs_the_actor_from_its_own_extract(
    local_cluster: Cluster, tmp_path: Path
) -> None:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "pkg_cluster_helper.py").write_text("VALUE = 41\n")
    (tmp_path / "code" / "config.txt").write_text("lr=0.1")
    (tmp_path / "lib" / "pkg_cluster_lib").mkdir(parents=True)
    (tmp_path / "lib" / "pkg_cluster_lib" / "__init__.py").write_text("ONE = 1\n")
    packages = [
        pack_working_dir(str(tmp_path / "code")),
        pack_module(str(tmp_path / "lib" / "pkg_cluster_lib")),
    ]
    dirs = set()
    for node in ("node-0", "node-1"):
        a = await local_cluster.spawn(Importer, node=node, packages=packages)
        assert await a.value("pkg_cluster_helper", "VALUE") == 41
        assert await a.value("pkg_cluster_lib", "ONE") == 1
        assert await a.read("config.txt") == "lr=0.1"
        cwd = await a.cwd()
        assert cwd != str(tmp_path / "code") and cwd.endswith(packages[0].ref.digest)
        dirs.add(cwd)
        await local_cluster.kill(a)
    assert len(dirs) == 2  # each node its own extract
    # a reference the head does not hold fails the spawn, saying so
    unknown = PackageRef("ab" * 32, 10, working_dir=True)
    with pytest.raises(PackageError, match="holds no package"):
        await local_cluster.spawn(Importer, packages=[unknown])
