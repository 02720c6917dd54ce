"""Coalesced batches (``protocol.pack_batch``/``split_batch``) and the session version check."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rayless.transport.errors import ProtocolError
from rayless.transport.protocol import (
    BATCH,
    CONTROL,
    PROTOCOL,
    VERSION,
    Kind,
    check_version,
    envelope,
    is_batch,
    open_envelope,
    pack_batch,
    split_batch,
)

# one-frame messages as the pump coalesces them: a control block with an inlined header
messages = st.builds(
    lambda kind, req_id, header: envelope(kind, req_id, [header])[0],
    st.sampled_from([Kind.REQUEST, Kind.REPLY, Kind.ERROR, Kind.ONEWAY, Kind.PING]),
    st.integers(0, 2**64 - 1),
    st.binary(min_size=1, max_size=300),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(messages, min_size=1, max_size=60))
def test_a_batch_splits_into_the_messages_it_was_made_of(msgs: list[bytes]) -> None:
    frame = pack_batch(msgs)
    assert is_batch(frame)
    parts = split_batch(frame)
    assert [bytes(p) for p in parts] == msgs
    for part, msg in zip(parts, msgs, strict=True):  # each opens as if it travelled alone
        assert open_envelope([part], 0)[:2] == open_envelope([msg], 0)[:2]


@settings(max_examples=300, deadline=None)
@given(st.lists(messages, min_size=1, max_size=20), st.data())
def test_a_damaged_batch_is_refused_or_splits_into_well_bounded_parts(
    msgs: list[bytes], data: st.DataObject
) -> None:
    frame = bytearray(pack_batch(msgs))
    cut = data.draw(st.integers(0, len(frame)))
    damaged = bytes(frame[:cut])
    if data.draw(st.booleans()) and len(frame) > CONTROL.size:
        pos = data.draw(st.integers(CONTROL.size, len(frame) - 1))
        frame[pos] ^= data.draw(st.integers(1, 255))
        damaged = bytes(frame)
    try:
        parts = split_batch(damaged)
    except ProtocolError:
        return
    # whatever parses must lie inside the frame and match the announced count
    assert sum(len(p) for p in parts) + 4 * len(parts) + CONTROL.size == len(damaged)
    assert len(parts) == CONTROL.unpack_from(damaged)[3]


def test_a_frame_of_another_kind_is_not_a_batch() -> None:
    assert not is_batch(envelope(Kind.REQUEST, 1, [b"\x90"])[0])
    assert not is_batch(CONTROL.pack(VERSION, BATCH, 0, 0))  # nothing after the block
    with pytest.raises(ProtocolError):
        split_batch(CONTROL.pack(VERSION + 1, BATCH, 0, 0) + b"\x00" * 4)


def test_a_batch_inside_a_batch_is_an_unknown_kind() -> None:
    inner = pack_batch([envelope(Kind.PING, 0)[0]])
    (part,) = split_batch(pack_batch([inner]))
    with pytest.raises(ProtocolError, match="unknown message kind"):
        open_envelope([part], 0)


def test_another_protocol_version_is_refused_with_a_clear_message() -> None:
    check_version(PROTOCOL, "peer")
    for other in (None, 1, PROTOCOL + 1, "2"):
        with pytest.raises(ProtocolError, match="same rayless version"):
            check_version(other, "the server at tcp://x:1")
