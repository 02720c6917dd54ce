"""The store's controller and a CPU unit start without torch: their modules (and the schema,
update and plain-value code the controller runs) import neither torch nor tensordict (numpy,
~0.1 s, is allowed: the controller's columnar state may use it). Each check runs in a fresh
interpreter, so nothing this test process imported counts."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

HEAVY = ("torch", "tensordict")


def _loaded_after(code: str) -> list[str]:
    """The heavy modules in ``sys.modules`` after running ``code`` in a fresh interpreter."""
    probe = textwrap.dedent(code) + textwrap.dedent(
        f"""
        import sys
        print(",".join(m for m in {HEAVY!r} if m in sys.modules))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    return [m for m in out.stdout.strip().split(",") if m]


def test_the_controller_modules_do_not_import_torch() -> None:
    loaded = _loaded_after(
        """
        import rayless.store.controller.actor
        import rayless.store.controller.column_puts
        import rayless.store.controller.fetches
        import rayless.store.controller.records
        import rayless.store.controller.samplers
        import rayless.store.controller.state
        from rayless.store.data.fields import FieldSchema
        from rayless.store.data.meta import BatchMeta
        from rayless.store.data.plain import check_plain, estimate_plain_bytes
        from rayless.store.data.updates import DataUpdate
        from rayless.store.errors import SchemaError

        # what the controller does with a unit's notification and custom meta
        s = FieldSchema.from_dict(FieldSchema("dense", "bfloat16", (2, 3), "cpu").to_dict())
        n = FieldSchema("jagged", "int64", (None,))
        up = DataUpdate.from_dict(DataUpdate("p", [0, 1], {"x": s, "t": n}).to_dict())
        assert up.schemas["x"].merged(s, "x") == s
        check_plain({"a": [1, "x", b"y", None, 2.5]}, "custom_meta[0]")
        assert estimate_plain_bytes(["ab"]) > 0
        for bad in ("Tensor", "uint32"):
            try:
                FieldSchema("dense", bad, (1,))
            except SchemaError:
                pass
            else:
                raise AssertionError(bad)
        """
    )
    assert loaded == [], f"the controller's modules imported {loaded}"


def test_the_unit_module_does_not_import_torch_until_it_holds_tensors() -> None:
    loaded = _loaded_after(
        """
        from rayless.store.unit.actor import StorageUnit, reservation_ttl, unit_device
        assert unit_device("cpu") == "cpu" and reservation_ttl() > 0
        """
    )
    assert loaded == [], f"the unit's module imported {loaded}"


def test_check_plain_still_knows_numpy_arrays() -> None:
    from rayless.store.data.plain import check_plain, estimate_plain_bytes
    from rayless.store.errors import SchemaError

    check_plain(np.zeros(3), "v")
    assert estimate_plain_bytes(np.zeros(4, dtype=np.int64)) == 64 + 32
    with pytest.raises(SchemaError, match="numpy array of Python objects"):
        check_plain(np.array([object()], dtype=object), "v")
