"""The bounded queue: admission, deadline, cancellation, shutdown. The jobs are plain
functions here (the scheduler runs any callable); the engine goes through it in the server
tests."""

from __future__ import annotations

import threading
import time

import pytest

from onepass.server.admission import AdmissionQueue, Cancelled, Closed, Overloaded


def blocker():
    """A job that holds the worker until released."""
    gate = threading.Event()
    started = threading.Event()

    def work():
        started.set()
        gate.wait(5)
        return "blocker done"

    return work, gate, started


def test_runs_jobs_in_order_and_returns_results():
    s = AdmissionQueue(max_queue=8, deadline=5)
    order = []
    jobs = [s.submit(lambda i=i: order.append(i) or i * 2) for i in range(5)]
    assert [j.future.result(5) for j in jobs] == [0, 2, 4, 6, 8]
    assert order == [0, 1, 2, 3, 4]
    assert s.completed == 5
    s.close()


def test_exceptions_reach_the_caller():
    s = AdmissionQueue(max_queue=2, deadline=5)
    job = s.submit(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        job.future.result(5)
    s.close()


def test_full_queue_is_refused_at_once_with_retry_after():
    s = AdmissionQueue(max_queue=2, deadline=60)
    work, gate, started = blocker()
    first = s.submit(work)
    assert started.wait(5)
    queued = [s.submit(lambda: "ok") for _ in range(2)]
    with pytest.raises(Overloaded) as err:
        s.submit(lambda: "never")
    assert err.value.reason == "queue_full"
    assert 0 < err.value.retry_after <= 10
    assert "max_queue=2" in err.value.message
    gate.set()
    assert first.future.result(5) == "blocker done"
    assert [q.future.result(5) for q in queued] == ["ok", "ok"]
    s.close()


def test_expected_wait_over_the_deadline_is_refused():
    s = AdmissionQueue(max_queue=100, deadline=1.0, initial_service_seconds=0.4)
    work, gate, started = blocker()
    s.submit(work)
    assert started.wait(5)
    s.submit(lambda: None)  # one queued: expected wait 0.8 s (+0.4 s service) > 1 s
    with pytest.raises(Overloaded) as err:
        s.submit(lambda: None)
    assert err.value.reason == "overloaded"
    gate.set()
    s.close()


def test_job_past_its_deadline_is_not_run():
    s = AdmissionQueue(max_queue=10, deadline=0.05, initial_service_seconds=0.0)
    work, gate, started = blocker()
    s.submit(work)
    assert started.wait(5)
    ran = []
    late = s.submit(lambda: ran.append(1))
    time.sleep(0.1)
    gate.set()
    with pytest.raises(Overloaded) as err:
        late.future.result(5)
    assert err.value.reason == "deadline"
    assert ran == []
    s.close()


def test_cancelled_job_is_dropped_without_running():
    s = AdmissionQueue(max_queue=10, deadline=10)
    work, gate, started = blocker()
    s.submit(work)
    assert started.wait(5)
    ran = []
    job = s.submit(lambda: ran.append(1))
    assert s.depth == 1
    assert s.cancel(job) is True
    assert s.depth == 0
    with pytest.raises(Cancelled):
        job.future.result(1)
    gate.set()
    after = s.submit(lambda: "next")
    assert after.future.result(5) == "next"
    assert ran == []
    s.close()


def test_cancel_of_a_running_job_returns_false():
    s = AdmissionQueue(max_queue=10, deadline=10)
    work, gate, started = blocker()
    job = s.submit(work)
    assert started.wait(5)
    assert s.cancel(job) is False
    gate.set()
    assert job.future.result(5) == "blocker done"
    s.close()


def test_close_fails_queued_jobs_and_refuses_new_ones():
    s = AdmissionQueue(max_queue=10, deadline=10)
    work, gate, started = blocker()
    s.submit(work)
    assert started.wait(5)
    queued = s.submit(lambda: "never")
    assert s.close() == 1
    with pytest.raises(Closed):
        queued.future.result(1)
    with pytest.raises(Closed):
        s.submit(lambda: None)
    gate.set()


def test_service_time_estimate_follows_the_jobs():
    s = AdmissionQueue(max_queue=10, deadline=10, initial_service_seconds=1.0)
    for _ in range(10):
        s.submit(lambda: time.sleep(0.01)).future.result(5)
    assert s.service_seconds < 0.2
    s.close()


def test_model_work_a_running_job_waits_for_is_bounded_by_its_deadline():
    """A worker's job waiting for model work (the model's step line) gets its deadline and
    its client's departure too: withdrawn work raises instead of holding the worker."""
    from concurrent.futures import Future

    from onepass.server.admission import wait_for_model

    s = AdmissionQueue(max_queue=10, deadline=0.3)
    withdrawn = []

    def never() -> bool:  # model work nobody takes: withdrawing it succeeds
        withdrawn.append(time.monotonic())
        return True

    job = s.submit(lambda: wait_for_model(Future(), never))
    with pytest.raises(Overloaded) as info:
        job.future.result(5)
    assert info.value.reason == "deadline" and "deadline 0.3 s" in info.value.message
    assert withdrawn and withdrawn[0] - job.enqueued < 0.6

    s = AdmissionQueue(max_queue=10, deadline=30)
    job = s.submit(lambda: wait_for_model(Future(), never))
    time.sleep(0.1)
    assert s.cancel(job) is False  # running: the client leaves while it waits for the model
    with pytest.raises(Cancelled):
        job.future.result(5)

    taken: Future = Future()  # the model took the work: it is awaited past the deadline
    s = AdmissionQueue(max_queue=10, deadline=0.1)
    job = s.submit(lambda: wait_for_model(taken, lambda: False))
    threading.Timer(0.4, lambda: taken.set_result("logits")).start()
    assert job.future.result(5) == "logits"
    assert wait_for_model(taken, never) == "logits"  # outside a job: a plain wait
    s.close()
