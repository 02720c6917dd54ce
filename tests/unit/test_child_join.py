"""A spawned child's way into its parent's cluster: the token travels only to a child."""

from __future__ import annotations

import multiprocessing.context
import pickle

from rayless.actors.ext import ChildJoin


def test_the_token_is_pickled_only_to_start_a_child() -> None:
    join = ChildJoin("tcp://127.0.0.1:7000", "s" * 32)
    assert "s" * 8 not in repr(join)
    copy = pickle.loads(pickle.dumps(join))  # torch.save, a message: no token
    assert copy == ChildJoin("tcp://127.0.0.1:7000", None)
    multiprocessing.context.set_spawning_popen(object())  # what spawn's Popen sets meanwhile
    try:
        sent = pickle.dumps(join)
    finally:
        multiprocessing.context.set_spawning_popen(None)
    assert pickle.loads(sent) == join
