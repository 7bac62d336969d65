"""Triton's priorities and queue policies against the real server, with tritonclient over gRPC and
HTTP: priority_levels and default_priority_level (a request's `priority`, 0 or out of range meaning
the default), each level's max_queue_size, timeout_action DELAY (a timed-out request waits behind
its level instead of failing) against REJECT, preserve_ordering, and Sluice's per-level metrics.

The model spins for as many steps as its first input value says, one request per batch on one
instance, so that requests queue behind a running one and the order they run in shows in the
order their answers come back."""
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import start_server
from harness.server import metric_value as metric
from make_test_repository import Spin, tensor_block, write_model

BLOCK_STEPS = 200000  # holds the instance for about a second (5-8 us a step here) while the rest queue
STEPS = 5000          # tens of milliseconds apart: the order answers come back in is the order they ran


def spin_config(batching, instances=1):
    return ('platform: "pytorch_libtorch"\nmax_batch_size: 1\n'
            + tensor_block("input", "INPUT__0", "TYPE_FP32", [2])
            + tensor_block("output", "OUTPUT__0", "TYPE_FP32", [2])
            + f"dynamic_batching {{ {batching} }}\ninstance_group [{{ kind: KIND_CPU count: {instances} }}]\n")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("priorities")
    write_model(root, "ranked", spin_config(
        "priority_levels: 3 default_priority_level: 2 "
        "priority_queue_policy { key: 3 value: { max_queue_size: 2 } }"), Spin())
    # Level 1 delays timed-out requests, level 2 fails them; both let a request set its timeout.
    write_model(root, "delayed", spin_config(
        "priority_levels: 2 default_priority_level: 2 "
        "priority_queue_policy { key: 1 value: { timeout_action: DELAY allow_timeout_override: true } } "
        "priority_queue_policy { key: 2 value: { timeout_action: REJECT allow_timeout_override: true } }"), Spin())
    write_model(root, "ordered", spin_config("preserve_ordering: true", instances=2), Spin())
    write_model(root, "unordered", spin_config("", instances=2), Spin())
    server = start_server(root, tmp_path_factory, ["--device", "cpu"])
    yield server
    assert server.stop() == 0, server.log()


def row(steps, tag):
    return np.array([[steps, tag]], dtype=np.float32)


class Answers:
    """Requests sent on their own threads; each answer (or error) with the moment it came back."""

    def __init__(self, server):
        self.server = server
        self.lock = threading.Lock()
        self.answers = {}
        self.threads = []

    def send(self, name, model, x, protocol="grpc", **kwargs):
        # The thread connects first and only then lets this one go on: calls arrive in the order
        # sent, whatever a new connection costs. (tritonclient.http's clients are bound to the
        # thread that made them.)
        connected = threading.Event()

        def run():
            try:
                if protocol == "grpc":
                    client = grpcclient.InferenceServerClient(self.server.url)
                    inp = grpcclient.InferInput("INPUT__0", list(x.shape), "FP32")
                else:
                    client = httpclient.InferenceServerClient(self.server.http_url)
                    inp = httpclient.InferInput("INPUT__0", list(x.shape), "FP32")
                inp.set_data_from_numpy(x)
                client.is_server_live()
                connected.set()
                result = client.infer(model, [inp], **kwargs).as_numpy("OUTPUT__0")
            except InferenceServerException as error:
                result = error
            finally:
                connected.set()
            with self.lock:
                self.answers[name] = (time.monotonic(), result)

        thread = threading.Thread(target=run)
        thread.start()
        self.threads.append(thread)
        assert connected.wait(timeout=30)
        time.sleep(0.03)  # arrivals in the order sent

    def wait(self):
        for thread in self.threads:
            thread.join(timeout=60)
        return self.answers

    def order(self):
        return [name for name, _ in sorted(self.wait().items(), key=lambda item: item[1][0])]


def test_higher_levels_run_first_and_each_level_has_its_own_cap(server):
    answers = Answers(server)
    answers.send("blocker", "ranked", row(BLOCK_STEPS, 0), priority=1)
    time.sleep(0.1)  # it runs; the rest queue behind it
    answers.send("low", "ranked", row(STEPS, 1), priority=3)
    answers.send("default", "ranked", row(STEPS, 2), protocol="http")  # no priority: level 2
    answers.send("high", "ranked", row(STEPS, 3), protocol="http", priority=1)
    answers.send("above", "ranked", row(STEPS, 4), priority=7)  # above the levels: level 2
    answers.send("low2", "ranked", row(STEPS, 5), priority=3)
    answers.send("low3", "ranked", row(STEPS, 6), protocol="http", priority=3)  # level 3 holds 2 already
    got = answers.wait()
    refused = got["low3"][1]
    assert isinstance(refused, InferenceServerException), got
    assert "priority level 3" in refused.message() and "max_queue_size" in refused.message()
    order = [name for name in answers.order() if name != "low3"]
    assert order == ["blocker", "high", "default", "above", "low", "low2"], order
    for name, tag in (("high", 3), ("default", 2), ("low", 1)):
        np.testing.assert_array_equal(got[name][1], row(STEPS, tag) + 1)
    # Sluice's per-level series: queue time per level, refusals by level and reason.
    text = server.metrics_text()
    labels = 'model="ranked",version="1"'
    assert metric(text, f'sluice_priority_queue_duration_seconds_count{{level="1",{labels}}}') == 2
    assert metric(text, f'sluice_priority_queue_duration_seconds_count{{level="2",{labels}}}') == 2
    assert metric(text, f'sluice_priority_queue_duration_seconds_count{{level="3",{labels}}}') == 2
    assert metric(text, f'sluice_priority_refused_total{{level="3",model="ranked",reason="rejected",version="1"}}') == 1
    assert metric(text, f'sluice_priority_refused_total{{level="1",model="ranked",reason="rejected",version="1"}}') == 0


def test_delay_keeps_a_timed_out_request_and_reject_fails_it(server):
    answers = Answers(server)
    answers.send("blocker", "delayed", row(BLOCK_STEPS, 0), priority=1)
    time.sleep(0.1)
    # 20 ms timeouts pass while the blocker runs. Level 1 delays: the timed-out request answers,
    # after the level-1 request that did not time out, before level 2. Level 2 rejects.
    answers.send("delayed", "delayed", row(STEPS, 1), priority=1, timeout=20000)
    answers.send("patient", "delayed", row(STEPS, 2), priority=1)
    answers.send("level2", "delayed", row(STEPS, 3), priority=2)
    answers.send("rejected", "delayed", row(STEPS, 4), protocol="http", priority=2, timeout=20000)
    got = answers.wait()
    expired = got["rejected"][1]
    assert isinstance(expired, InferenceServerException), got
    assert "deadline" in expired.message().lower() or "timeout" in expired.message().lower(), expired.message()
    np.testing.assert_array_equal(got["delayed"][1], row(STEPS, 1) + 1)
    order = [name for name in answers.order() if name != "rejected"]
    assert order == ["blocker", "patient", "delayed", "level2"], order
    text = server.metrics_text()
    assert metric(text, 'sluice_priority_refused_total{level="2",model="delayed",reason="timeout",version="1"}') == 1
    assert metric(text, 'sluice_priority_refused_total{level="1",model="delayed",reason="timeout",version="1"}') == 0


@pytest.mark.parametrize("model, in_order", [("ordered", True), ("unordered", False)])
def test_preserve_ordering_holds_a_quick_answer_behind_a_slow_one(server, model, in_order):
    # Two instances: the quick request runs beside the slow one and ends first.
    answers = Answers(server)
    answers.send("slow", model, row(BLOCK_STEPS, 1))
    answers.send("quick", model, row(STEPS, 2), protocol="http")
    got = answers.wait()
    # Held, the quick answer leaves right after the slow one (the two clients may see them a
    # moment apart either way); not held, it comes back most of a second earlier.
    quick_ahead = got["slow"][0] - got["quick"][0]
    if in_order:
        assert quick_ahead < 0.1, quick_ahead
    else:
        assert quick_ahead > 0.3, quick_ahead
    np.testing.assert_array_equal(got["quick"][1], row(STEPS, 2) + 1)
    np.testing.assert_array_equal(got["slow"][1], row(BLOCK_STEPS, 1) + 1)
