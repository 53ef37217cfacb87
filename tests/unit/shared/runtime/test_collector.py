"""A service's collector (`gpuyard.shared.runtime.collector.collect_less`): what lived at its start is left out of every later
collection, and the youngest generation is collected far less often than Python's default."""

from __future__ import annotations

import gc
import weakref

import pytest

from gpuyard.shared.runtime.collector import OLDER_THRESHOLDS, YOUNG_THRESHOLD, collect_less


@pytest.fixture
def restored_collector():
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def test_what_lived_at_the_start_is_frozen_and_collections_come_less_often(restored_collector):
    started_with = [[object()] for _ in range(1000)]  # containers alive at the service's start
    collect_less()
    assert gc.get_threshold() == (YOUNG_THRESHOLD, *OLDER_THRESHOLDS)
    assert YOUNG_THRESHOLD >= 20 * 700
    assert gc.get_freeze_count() >= len(started_with)
    tracked = {id(o) for o in gc.get_objects()}
    assert not any(id(o) in tracked for o in started_with)  # no longer walked by any collection


def test_cyclic_garbage_made_after_the_start_is_still_collected(restored_collector):
    collect_less()

    class Node:
        pass

    def cycle() -> Node:
        a, b = Node(), Node()
        a.other, b.other = b, a
        return a

    first = weakref.ref(cycle())  # unreachable at once; reference counting alone never frees it
    assert first() is not None
    for _ in range(YOUNG_THRESHOLD):  # more new containers than the threshold
        cycle()
    assert first() is None  # a collection ran on its own and took it


def test_a_service_whose_requests_wait_on_it_keeps_short_collections(restored_collector):
    gc.set_threshold(700, 10, 10)
    started_with = [[object()] for _ in range(100)]
    collect_less(pauses_matter=True)
    assert gc.get_threshold() == (700, 10, 10)
    assert gc.get_freeze_count() >= len(started_with)  # what lived at the start is still left out
