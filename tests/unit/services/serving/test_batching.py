"""Dynamic batching on a real ONNX Runtime session: concurrent requests merged into one run and split back,
never mixed across shapes, and off where it must be."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from gpuyard.services.serving.batching import Batcher, RunTimes
from gpuyard.services.serving.errors import ServingError, Unavailable
from gpuyard.services.serving.runtime import load_onnx

from .models import Mlp, doubler

RNG = np.random.default_rng(3)


def recorded(model) -> list[dict[str, tuple]]:
    """Record the input shapes of every `run` of `model` (the batches it was given)."""
    calls: list[dict[str, tuple]] = []
    run = model.run

    def recording(feeds, outputs=None):
        calls.append({name: array.shape for name, array in feeds.items()})
        return run(feeds, outputs)

    model.run = recording
    return calls


@pytest.fixture
async def batcher_of():
    """Make batchers that are closed after the test (their worker tasks end with it)."""
    made: list[Batcher] = []

    def make(model, **options) -> Batcher:
        made.append(Batcher(model, **options))
        return made[-1]

    yield make
    for batcher in made:
        await batcher.aclose()


def rows(n: int, width: int = 4) -> np.ndarray:
    return RNG.standard_normal((n, width)).astype(np.float32)


async def test_concurrent_requests_share_one_run_and_get_their_own_rows(batcher_of):
    mlp = Mlp()
    model = load_onnx(mlp.bytes)
    calls = recorded(model)
    batcher = batcher_of(model, max_batch_size=16, max_queue_delay_us=50_000)
    requests = [rows(n) for n in (1, 2, 1, 3, 1, 2, 1, 1)]  # 12 rows
    results = await asyncio.gather(*(batcher.infer({"x": x}, ["y"]) for x in requests))
    assert len(calls) < len(requests)
    assert sum(call["x"][0] for call in calls) == 12
    for x, result in zip(requests, results, strict=True):
        assert result["y"].shape == (len(x), 3)
        np.testing.assert_allclose(result["y"], mlp(x), rtol=1e-5, atol=1e-5)
    assert batcher.batches == len(calls) and batcher.batched_requests == len(requests)


async def test_a_full_batch_leaves_at_once_and_never_exceeds_the_maximum(batcher_of):
    model = load_onnx(Mlp().bytes)
    calls = recorded(model)
    batcher = batcher_of(model, max_batch_size=4, max_queue_delay_us=10_000_000)  # only size makes one leave
    requests = [rows(1) for _ in range(8)]
    await asyncio.wait_for(asyncio.gather(*(batcher.infer({"x": x}, ["y"]) for x in requests)), 5)
    assert [call["x"][0] for call in calls] == [4, 4]


async def test_requests_of_different_shapes_are_never_mixed(batcher_of):
    model = load_onnx(doubler())
    calls = recorded(model)
    batcher = batcher_of(model, max_batch_size=32, max_queue_delay_us=20_000)
    requests = [rows(n, width) for n, width in [(1, 2), (2, 5), (1, 2), (3, 5), (2, 2), (1, 7)]]
    results = await asyncio.gather(*(batcher.infer({"x": x}, ["y"]) for x in requests))
    for x, result in zip(requests, results, strict=True):
        np.testing.assert_array_equal(result["y"], 2 * x)
    widths = sorted(call["x"][1] for call in calls)
    assert widths == [2, 5, 7]  # one run per width, each holding only its own width
    assert sorted(call["x"][0] for call in calls) == [1, 4, 5]


@pytest.mark.parametrize(("mlp", "max_batch_size"), [(Mlp(batch=1), 8), (Mlp(), 1), (Mlp(), 0)])
async def test_batching_is_off_for_a_fixed_batch_dimension_or_a_maximum_of_one(
    mlp, max_batch_size, batcher_of
):
    model = load_onnx(mlp.bytes)
    calls = recorded(model)
    batcher = batcher_of(model, max_batch_size=max_batch_size, max_queue_delay_us=20_000)
    assert not batcher.enabled
    requests = [rows(1) for _ in range(4)]
    results = await asyncio.gather(*(batcher.infer({"x": x}, ["y"]) for x in requests))
    assert len(calls) == 4 and all(call["x"][0] == 1 for call in calls)
    for x, result in zip(requests, results, strict=True):
        np.testing.assert_allclose(result["y"], mlp(x), rtol=1e-5, atol=1e-5)


async def test_a_failing_run_fails_every_request_of_its_batch(batcher_of):
    model = load_onnx(Mlp().bytes)

    def broken(feeds, outputs=None):
        raise ServingError("the GPU fell off")

    model.run = broken
    batcher = batcher_of(model, max_batch_size=8, max_queue_delay_us=20_000)
    results = await asyncio.gather(
        *(batcher.infer({"x": rows(1)}, ["y"]) for _ in range(3)), return_exceptions=True
    )
    assert [str(r) for r in results] == ["the GPU fell off"] * 3


async def test_closing_answers_what_is_queued_and_refuses_the_rest(batcher_of):
    mlp = Mlp()
    batcher = batcher_of(load_onnx(mlp.bytes), max_batch_size=8, max_queue_delay_us=10_000_000)
    x = rows(2)
    queued = asyncio.ensure_future(batcher.infer({"x": x}, ["y"]))
    await asyncio.sleep(0.01)
    await asyncio.wait_for(batcher.aclose(), 5)  # does not wait out the delay
    np.testing.assert_allclose((await queued)["y"], mlp(x), rtol=1e-5, atol=1e-5)
    with pytest.raises(Unavailable):
        await batcher.infer({"x": x}, ["y"])


async def test_a_caller_that_went_away_is_skipped(batcher_of):
    mlp = Mlp()
    model = load_onnx(mlp.bytes)
    calls = recorded(model)
    batcher = batcher_of(model, max_batch_size=8, max_queue_delay_us=30_000)
    gone = asyncio.ensure_future(batcher.infer({"x": rows(3)}, ["y"]))
    await asyncio.sleep(0)
    gone.cancel()
    x = rows(1)
    result = await batcher.infer({"x": x}, ["y"])
    np.testing.assert_allclose(result["y"], mlp(x), rtol=1e-5, atol=1e-5)
    assert [call["x"][0] for call in calls] == [1]


async def test_requests_of_one_loop_iteration_make_one_batch_without_a_delay(batcher_of):
    model = load_onnx(Mlp().bytes)
    calls = recorded(model)
    batcher = batcher_of(model, max_batch_size=16, max_queue_delay_us=0)
    requests = [rows(1) for _ in range(6)]
    await asyncio.gather(*(batcher.infer({"x": x}, ["y"]) for x in requests))  # all queued in one iteration
    assert [call["x"][0] for call in calls] == [6]


async def test_requests_queued_during_a_run_in_a_thread_leave_together_when_it_ends(batcher_of):
    model = load_onnx(Mlp().bytes)
    started, release = threading.Event(), threading.Event()
    run = model.run

    def held(feeds, outputs=None):
        if not started.is_set():
            started.set()
            release.wait(5)
        return run(feeds, outputs)

    model.run = held
    calls = recorded(model)
    batcher = batcher_of(model, max_batch_size=16, max_queue_delay_us=0, inline_run_us=0)
    first = asyncio.ensure_future(batcher.infer({"x": rows(1)}, ["y"]))
    await asyncio.to_thread(started.wait, 5)
    later = [asyncio.ensure_future(batcher.infer({"x": rows(1)}, ["y"])) for _ in range(5)]
    for _ in range(10):  # loop iterations enough for any look at the queue: they stay queued
        await asyncio.sleep(0)
    assert len(calls) == 1
    release.set()
    await asyncio.gather(first, *later)
    assert [call["x"][0] for call in calls] == [1, 5]


def on_threads(model) -> list[int]:
    """Record the thread of every `run` of `model`."""
    threads: list[int] = []
    run = model.run

    def recording(feeds, outputs=None):
        threads.append(threading.get_ident())
        return run(feeds, outputs)

    model.run = recording
    return threads


@pytest.mark.parametrize("max_batch_size", [0, 8])
async def test_a_short_run_stays_on_the_event_loop_once_it_is_known_short(max_batch_size, batcher_of):
    mlp = Mlp()
    model = load_onnx(mlp.bytes)
    threads = on_threads(model)
    batcher = batcher_of(model, max_batch_size=max_batch_size, inline_run_us=50_000)
    for _ in range(3):
        x = rows(1)
        np.testing.assert_allclose((await batcher.infer({"x": x}, ["y"]))["y"], mlp(x), rtol=1e-5, atol=1e-5)
    loop_thread = threading.get_ident()
    assert threads[0] != loop_thread  # never run yet: in a thread
    assert threads[1:] == [loop_thread, loop_thread]
    assert batcher.inline_runs == 2


@pytest.mark.parametrize("max_batch_size", [0, 8])
async def test_a_long_run_stays_in_a_thread(max_batch_size, batcher_of):
    model = load_onnx(Mlp().bytes)
    threads = on_threads(model)
    run = model.run

    def slow(feeds, outputs=None):
        spin_until = time.thread_time() + 0.005  # 5 ms of CPU, as a larger model's run
        while time.thread_time() < spin_until:
            pass
        return run(feeds, outputs)

    model.run = slow
    batcher = batcher_of(model, max_batch_size=max_batch_size, inline_run_us=1_000)
    for _ in range(3):
        await batcher.infer({"x": rows(1)}, ["y"])
    assert threading.get_ident() not in threads and len(threads) == 3
    assert batcher.inline_runs == 0


async def test_a_failed_inline_batch_fails_its_requests_and_the_next_batch_still_runs(batcher_of):
    mlp = Mlp()
    model = load_onnx(mlp.bytes)
    run = model.run
    failing = [False]

    def flaky(feeds, outputs=None):
        if failing[0]:
            raise ServingError("the model failed: boom")
        return run(feeds, outputs)

    model.run = flaky
    batcher = batcher_of(model, max_batch_size=8, inline_run_us=50_000)
    await batcher.infer({"x": rows(3)}, ["y"])  # learnt short: batches of up to 3 rows run on the loop
    failing[0] = True
    results = await asyncio.gather(
        *(batcher.infer({"x": rows(1)}, ["y"]) for _ in range(3)), return_exceptions=True
    )
    assert [str(r) for r in results] == ["the model failed: boom"] * 3
    failing[0] = False
    x = rows(2)
    np.testing.assert_allclose((await batcher.infer({"x": x}, ["y"]))["y"], mlp(x), rtol=1e-5, atol=1e-5)
    assert batcher.inline_runs == 2


async def test_the_split_outputs_are_views_of_the_batch_output(batcher_of):
    model = load_onnx(Mlp().bytes)
    batcher = batcher_of(model, max_batch_size=8)
    results = await asyncio.gather(*(batcher.infer({"x": rows(n)}, ["y"]) for n in (1, 2, 3)))
    base = results[0]["y"].base
    assert base is not None and all(result["y"].base is base for result in results)
    assert [result["y"].shape[0] for result in results] == [1, 2, 3]


def test_run_times_fall_at_once_rise_slowly_and_answer_for_smaller_sizes():
    times = RunTimes()
    assert times.expected(RunTimes.size_class({"x": np.zeros((3, 5))})) is None  # 15 elements: class 16
    assert RunTimes.size_class({"x": np.zeros((3, 5))}) == 16
    assert RunTimes.size_class({"x": np.zeros((2, 8)), "m": np.zeros((2, 8))}) == 32
    times.record(16, 0.008)
    times.record(16, 0.001)
    assert times.expected(16) == 0.001  # a faster run: at once
    times.record(16, 0.009)
    assert times.expected(16) == pytest.approx(0.002)  # a slower one: an eighth of the way
    assert times.expected(4) == pytest.approx(0.002)  # no faster than a run of more elements
    assert times.expected(64) is None  # nor known from fewer
