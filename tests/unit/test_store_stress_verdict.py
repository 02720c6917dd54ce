"""The stress run's judge (``rayless.store.testing_stress.verify``) catches what it must."""

from __future__ import annotations

from typing import Any

from rayless.store.testing_stress import verify


def _tally(**kw: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "acked": [],
        "read": [],
        "corrupt": [],
        "lost_reported": [],
        "puts": 0,
        "fetches": 0,
        "errors": {},
    }
    return {**base, **kw}


def test_a_clean_run_is_ok_and_lost_samples_are_counted() -> None:
    producer = _tally(acked=[(1, 10), (2, 11), (3, 12)], puts=1)
    consumer = _tally(read=[1, 2], fetches=1, errors={"PartialResultError": 1})
    v = verify([producer, consumer], lost_indexes=[12])
    assert v.ok and (v.acked, v.read, v.lost) == (3, 2, 1)
    assert v.errors == {"PartialResultError": 1} and (v.puts, v.fetches) == (1, 1)


def test_duplicates_corruption_and_silent_loss_fail_the_run() -> None:
    producer = _tally(acked=[(1, 10), (2, 11), (3, 12)])
    assert verify([producer, _tally(read=[1, 1, 2, 3])], []).duplicated == [1]
    assert verify([producer, _tally(read=[1, 2, 3], corrupt=[2])], []).corrupt == [2]
    silent = verify([producer, _tally(read=[1, 2])], [])  # 3 neither read nor reported lost
    assert silent.missing == [3] and not silent.ok
    reported = verify([producer, _tally(read=[1, 2], lost_reported=[12])], [])
    assert reported.ok and reported.lost == 1


def test_a_sample_read_that_no_put_acknowledged_is_a_phantom() -> None:
    v = verify([_tally(acked=[(1, 10)]), _tally(read=[1, 9])], [])
    assert v.phantom == [9] and v.ok  # counted: its put may have landed, unacknowledged
