"""Importing the transport must not import torch, numpy or tensordict; decoding a tensor must."""

from __future__ import annotations

from pathlib import Path

import msgpack
import torch

from rayless.transport.codec import encode
from tests.drivers import run_fresh

HEAVY = ("torch", "numpy", "tensordict")


def test_transport_imports_and_plain_values_stay_light() -> None:
    out = run_fresh(
        f"""
        import sys
        import rayless.transport.client
        import rayless.transport.server
        from rayless.transport.codec import decode, encode
        from rayless.transport.errors import BrokenError

        value = {{
            "t": (1, (2, "x"), b"\\x00\\xff"),
            (1, "k"): [None, 2.5, {{b"b": 3}}],
            "big": 2**100,
            "err": BrokenError("gone"),
        }}
        out = decode(encode(value))
        assert out["t"] == value["t"] and out[(1, "k")] == value[(1, "k")], out
        assert out["big"] == 2**100, out
        assert type(out["err"]) is BrokenError and "gone" in str(out["err"]), out
        print(sorted(m for m in {HEAVY!r} if m in sys.modules))
        """
    )
    assert out.strip() == "[]"


def test_decoding_a_tensor_imports_torch_on_demand(tmp_path: Path) -> None:
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    frames = encode({"x": (t, "label")})
    path = tmp_path / "frames.msgpack"
    path.write_bytes(msgpack.packb([bytes(f) for f in frames]))
    out = run_fresh(
        f"""
        import sys
        import msgpack
        from rayless.transport.codec import decode

        assert "torch" not in sys.modules
        frames = msgpack.unpackb(open({str(path)!r}, "rb").read())
        value = decode(frames)
        import torch

        x, label = value["x"]
        assert label == "label"
        assert torch.equal(x, torch.arange(12, dtype=torch.float32).reshape(3, 4)), x
        print("ok")
        """
    )
    assert out.strip() == "ok"
