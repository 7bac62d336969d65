"""Stateful models on the real sluice-server (sequence_batching, direct strategy) with tritonclient's
sequence_id / sequence_start / sequence_end: interleaved sequences from many clients over gRPC,
HTTP and a gRPC stream equal to the reference sums, string correlation ids, sequences waiting for
a slot, idle expiry, every error case with the server serving after, and model control: a sequence
stays on the version it started on across a reload, and a retired version ends the sequences left
after the drain period."""
import concurrent.futures
import os
import queue
import random
import shutil
import subprocess
import sys
import time
from typing import Dict, List

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from torch import nn
from tritonclient.utils import InferenceServerException

from conftest import CLIENT, ROOT, client_for, start_server, write_bundled
from make_test_repository import write_model

sys.path.insert(0, os.path.join(ROOT, "models"))
from bundled_models import Accumulator  # noqa: E402

CONTROLS = """sequence_batching {{
  max_sequence_idle_microseconds: {idle_us}
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "END" control [ {{ kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: {corrid} }} ] }}
  ]
}}
"""
IO = ('input [{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }]\n'
      'output [{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }]\n')


class StringKeyed(nn.Module):
    """The bundled accumulator with string correlation ids (CORRID TYPE_STRING: List[str])."""

    totals: Dict[str, int]

    def __init__(self):
        super().__init__()
        self.totals = {}

    def forward(self, INPUT: torch.Tensor, START: torch.Tensor, END: torch.Tensor, READY: torch.Tensor,
                CORRID: List[str]) -> torch.Tensor:
        out = torch.zeros_like(INPUT)
        for row in range(INPUT.size(0)):
            if int(READY[row, 0]) == 0:
                continue
            key = CORRID[row]
            total = int(INPUT[row, 0])
            if int(START[row, 0]) == 0 and key in self.totals:
                total += self.totals[key]
            out[row, 0] = total
            self.totals[key] = total
        return out


def copy_bundled_weights(root, name, version=1):
    """The bundled accumulator's model.pt as `name`'s version."""
    os.makedirs(root / name / str(version), exist_ok=True)
    shutil.copy(root / "accumulator" / "1" / "model.pt", root / name / str(version) / "model.pt")


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    root = write_bundled(tmp_path_factory.mktemp("sequences"), ["accumulator"])
    # One instance with two slots and a short idle time: slots run out, sequences expire.
    write_model(root, "acc_small", 'platform: "pytorch_libtorch"\nmax_batch_size: 2\n' + IO
                + 'instance_group [{ kind: KIND_CPU count: 1 }]\n'
                + CONTROLS.format(idle_us=400000, corrid="TYPE_INT64"))
    copy_bundled_weights(root, "acc_small")
    write_model(root, "acc_string", 'platform: "pytorch_libtorch"\nmax_batch_size: 4\n' + IO
                + CONTROLS.format(idle_us=5000000, corrid="TYPE_STRING"), StringKeyed())
    return root


@pytest.fixture(scope="module")
def server(repository, tmp_path_factory):
    server = start_server(repository, tmp_path_factory, ["--device", "cpu"])
    yield server
    assert server.stop() == 0, server.log()


def value(v):
    return np.array([[v]], dtype=np.int32)


def infer(client, module, sequence_id, v, start=False, end=False, model="accumulator"):
    data = module.InferInput("INPUT", [1, 1], "INT32")
    data.set_data_from_numpy(value(v))
    result = client.infer(model, [data], sequence_id=sequence_id, sequence_start=start, sequence_end=end)
    return int(result.as_numpy("OUTPUT")[0, 0]), result


def test_the_model_takes_what_clients_send_and_hides_the_controls(server):
    client = grpcclient.InferenceServerClient(server.url)
    metadata = client.get_model_metadata("accumulator", as_json=True)
    assert [i["name"] for i in metadata["inputs"]] == ["INPUT"]
    config = client.get_model_config("accumulator", as_json=True)["config"]
    # (JSON leaves out an enum's zero value, CONTROL_SEQUENCE_START.)
    kinds = [c["control"][0].get("kind", "CONTROL_SEQUENCE_START") for c in config["sequence_batching"]["control_input"]]
    assert kinds == ["CONTROL_SEQUENCE_START", "CONTROL_SEQUENCE_END", "CONTROL_SEQUENCE_READY",
                     "CONTROL_SEQUENCE_CORRID"]
    assert "event=model_ready model=accumulator version=1 device=cpu x2 batching=sequence" in server.log()


def test_interleaved_sequences_from_many_clients_equal_the_reference_sums(server):
    """24 sequences of 12 steps from 12 clients at once, over gRPC and HTTP: more sequences than
    the 8 slots, so later ones wait for a slot; every answer is the running sum. (Each client runs
    its two sequences one after the other: a client that held one slot while it waited for a
    second would, with every client doing so, hold all of them until the idle time ends those
    sequences. Interleaving within one client is the stream test's.)"""
    def run_client(index):
        rng = random.Random(index)
        client, module = client_for(server, "grpc" if index % 2 == 0 else "http")
        ids = [5000 + 2 * index, 5001 + 2 * index]
        sums = {i: 0 for i in ids}
        values = {i: [rng.randint(-50, 100) for _ in range(12)] for i in ids}
        for i in ids:
            for step in range(12):
                sums[i] += values[i][step]
                got, _ = infer(client, module, i, values[i][step], start=step == 0, end=step == 11)
                assert got == sums[i], (i, step)
        client.close()
        return True

    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        assert all(pool.map(run_client, range(12)))
    stats = grpcclient.InferenceServerClient(server.url).get_inference_statistics("accumulator", as_json=True)
    model = stats["model_stats"][0]
    assert int(model["inference_count"]) >= 288
    # Rows of several sequences ran together.
    assert int(model["execution_count"]) < int(model["inference_count"]), model


def test_a_grpc_stream_carries_a_sequence_in_order(server):
    """Triton's simple_grpc_sequence_stream_infer_client flow: two sequences interleaved on one
    stream, answers matched by request id."""
    client = grpcclient.InferenceServerClient(server.url)
    answers = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    values = [3, 1, 4, 1, 5, 9, 2, 6]
    for step, v in enumerate(values):
        for sequence_id, sign in ((901, 1), (902, -1)):
            data = grpcclient.InferInput("INPUT", [1, 1], "INT32")
            data.set_data_from_numpy(value(sign * v))
            client.async_stream_infer("accumulator", [data], request_id=f"{sequence_id}-{step}",
                                      sequence_id=sequence_id, sequence_start=step == 0,
                                      sequence_end=step == len(values) - 1)
    got = {}
    try:
        for _ in range(2 * len(values)):
            result, error = answers.get(timeout=30)
            assert error is None, error.message()
            got[result.get_response().id] = int(result.as_numpy("OUTPUT")[0, 0])
    finally:
        client.stop_stream()  # an open stream would hold the server's shutdown for its grace period
    for step in range(len(values)):
        assert got[f"901-{step}"] == sum(values[:step + 1])
        assert got[f"902-{step}"] == -sum(values[:step + 1])


def test_string_correlation_ids(server):
    client = grpcclient.InferenceServerClient(server.url)
    http = httpclient.InferenceServerClient(server.http_url)
    assert infer(client, grpcclient, "alice", 5, start=True, model="acc_string")[0] == 5
    assert infer(http, httpclient, "bob", 7, start=True, model="acc_string")[0] == 7
    assert infer(http, httpclient, "alice", 1, model="acc_string")[0] == 6
    assert infer(client, grpcclient, "bob", 1, end=True, model="acc_string")[0] == 8
    with pytest.raises(InferenceServerException, match="takes string sequence ids"):
        infer(client, grpcclient, 12, 1, start=True, model="acc_string")
    with pytest.raises(InferenceServerException, match="takes integer sequence ids"):
        infer(client, grpcclient, "carol", 1, start=True)
    assert infer(client, grpcclient, "alice", 1, end=True, model="acc_string")[0] == 7


def test_every_error_is_named_and_the_server_serves_after(server):
    client = grpcclient.InferenceServerClient(server.url)
    http = httpclient.InferenceServerClient(server.http_url)
    cases = [
        (lambda: infer(client, grpcclient, 0, 1, start=True), "StatusCode.INVALID_ARGUMENT",
         "every request needs the parameter sequence_id"),
        (lambda: infer(client, grpcclient, 777, 1), "StatusCode.INVALID_ARGUMENT",
         "sequence 777 of model 'accumulator' is not active: its first request must set sequence_start"),
        (lambda: infer(http, httpclient, 778, 1), None, "sequence 778 of model 'accumulator' is not active"),
    ]
    for call, status, words in cases:
        with pytest.raises(InferenceServerException) as raised:
            call()
        assert words in str(raised.value), raised.value
        if status:
            assert raised.value.status() == status
    assert infer(client, grpcclient, 779, 2, start=True)[0] == 2
    with pytest.raises(InferenceServerException, match="sequence 779 of model 'accumulator' is already active"):
        infer(client, grpcclient, 779, 2, start=True)
    assert infer(client, grpcclient, 779, 3, end=True)[0] == 5
    with pytest.raises(InferenceServerException, match="sequence 779 of model 'accumulator' is not active"):
        infer(client, grpcclient, 779, 1)
    # Two rows in one request of a sequence.
    rows = grpcclient.InferInput("INPUT", [2, 1], "INT32")
    rows.set_data_from_numpy(np.array([[1], [2]], dtype=np.int32))
    with pytest.raises(InferenceServerException, match="needs batch size 1, found 2"):
        client.infer("accumulator", [rows], sequence_id=780, sequence_start=True)
    # A control input is the server's to fill.
    data = grpcclient.InferInput("INPUT", [1, 1], "INT32")
    data.set_data_from_numpy(value(1))
    start = grpcclient.InferInput("START", [1, 1], "INT32")
    start.set_data_from_numpy(value(1))
    with pytest.raises(InferenceServerException,
                       match=r"input 'START' of model 'accumulator' is filled by the server with the sequence "
                             r"batcher \(CONTROL_SEQUENCE_START\); do not send it"):
        client.infer("accumulator", [data, start], sequence_id=781, sequence_start=True)
    # Wrong parameter types.
    with pytest.raises(InferenceServerException, match="'sequence_id' must not be negative"):
        infer(client, grpcclient, -4, 1, start=True)
    # The failed starts left nothing behind: those ids start cleanly, and the server serves on.
    assert infer(client, grpcclient, 780, 4, start=True, end=True)[0] == 4
    assert infer(client, grpcclient, 781, 6, start=True, end=True)[0] == 6
    assert client.is_server_live() and client.is_model_ready("accumulator")


def test_sequences_beyond_the_slots_wait_for_one(server):
    """acc_small has one instance with two slots: a third sequence's start waits until one ends."""
    client = grpcclient.InferenceServerClient(server.url)
    assert infer(client, grpcclient, 61, 1, start=True, model="acc_small")[0] == 1
    assert infer(client, grpcclient, 62, 2, start=True, model="acc_small")[0] == 2
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        third = pool.submit(lambda: infer(grpcclient.InferenceServerClient(server.url), grpcclient, 63, 3,
                                          start=True, model="acc_small")[0])
        time.sleep(0.2)
        assert not third.done()  # waiting for a slot
        assert infer(client, grpcclient, 61, 10, end=True, model="acc_small")[0] == 11
        assert third.result(timeout=10) == 3
    assert infer(client, grpcclient, 62, 5, end=True, model="acc_small")[0] == 7
    assert infer(client, grpcclient, 63, 5, end=True, model="acc_small")[0] == 8


def test_an_idle_sequence_expires(server):
    """acc_small ends a sequence after 400 ms without a request; its slot serves the next one."""
    client = grpcclient.InferenceServerClient(server.url)
    assert infer(client, grpcclient, 71, 1, start=True, model="acc_small")[0] == 1
    time.sleep(0.2)
    assert infer(client, grpcclient, 71, 1, model="acc_small")[0] == 2  # within the idle time
    time.sleep(1.0)
    with pytest.raises(InferenceServerException, match="after 400 ms without a request"):
        infer(client, grpcclient, 71, 1, model="acc_small")
    assert "event=sequence_idle_expired model=acc_small sequence=71" in server.log()
    assert infer(client, grpcclient, 71, 9, start=True, end=True, model="acc_small")[0] == 9


@pytest.fixture()
def controlled(tmp_path_factory):
    """A server in explicit model-control mode with a 2 s drain period, over its own repository."""
    root = write_bundled(tmp_path_factory.mktemp("reload"), ["accumulator"])
    server = start_server(root, tmp_path_factory, ["--device", "cpu", "--model-control-mode", "explicit",
                                                   "--load-model", "accumulator", "--shutdown-grace-seconds", "2"])
    yield root, server
    assert server.stop() == 0, server.log()


def test_a_sequence_stays_on_its_version_across_a_reload(controlled):
    root, server = controlled
    client = grpcclient.InferenceServerClient(server.url)
    assert infer(client, grpcclient, 1, 5, start=True)[0] == 5
    # Version 2 (ten times the input) replaces version 1 while sequence 1 is active.
    write_model(root, "accumulator", (root / "accumulator" / "config.pbtxt").read_text(), Accumulator(scale=10),
                versions=(2,))
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        reload = pool.submit(client.load_model, "accumulator")  # returns once version 1 has drained
        deadline = time.monotonic() + 60
        while "event=model_ready model=accumulator version=2" not in server.log():
            assert time.monotonic() < deadline, server.log()
            time.sleep(0.05)
        got, result = infer(client, grpcclient, 2, 5, start=True)  # a new sequence: version 2
        assert (got, result.get_response().model_version) == (50, "2")
        got, result = infer(client, grpcclient, 1, 1)  # the old one: still version 1, its sum kept
        assert (got, result.get_response().model_version) == (6, "1")
        assert not reload.done()  # version 1 drains its sequence
        got, result = infer(client, grpcclient, 1, 1, end=True)
        assert (got, result.get_response().model_version) == (7, "1")
        reload.result(timeout=30)
    assert "event=model_draining_sequences model=accumulator version=1 active=1" in server.log()
    assert "event=model_version_retired model=accumulator version=1" in server.log()
    assert infer(client, grpcclient, 2, 1, end=True)[0] == 60


def test_a_retired_version_ends_the_sequences_left_after_the_drain_period(controlled):
    root, server = controlled
    client = grpcclient.InferenceServerClient(server.url)
    assert infer(client, grpcclient, 3, 5, start=True)[0] == 5
    started = time.monotonic()
    client.load_model("accumulator")  # the same files again: a new load of version 1
    assert time.monotonic() - started >= 1.5  # it waited for the drain period (2 s)
    assert "event=model_sequences_ended model=accumulator version=1 sequences=1" in server.log()
    with pytest.raises(InferenceServerException, match="sequence 3 of model 'accumulator' is not active"):
        infer(client, grpcclient, 3, 1)
    assert infer(client, grpcclient, 3, 4, start=True, end=True)[0] == 4
    # An unload ends them the same way.
    assert infer(client, grpcclient, 4, 1, start=True)[0] == 1
    client.unload_model("accumulator")
    assert "event=model_sequences_ended model=accumulator version=1 sequences=1" in server.log()
    with pytest.raises(InferenceServerException):
        infer(client, grpcclient, 4, 1)
    assert client.is_server_live()


def test_sluice_client_sends_sequence_requests(server):
    def run(*flags):
        return subprocess.run([CLIENT, "--url", server.url, "infer", "accumulator", *flags],
                              capture_output=True, text=True, timeout=30)

    started = run("--sequence-id", "88", "--sequence-start")
    assert started.returncode == 0, started.stderr
    assert "output OUTPUT INT32 [1,1]" in started.stdout, started.stdout
    assert run("--sequence-id", "88", "--sequence-end").returncode == 0
    late = run("--sequence-id", "88")
    assert late.returncode != 0
    assert "sequence 88 of model 'accumulator' is not active" in late.stderr


def test_metrics_count_sequences_by_outcome(server):
    """Scraped after the tests above (file order): sequences ended and expired are counted, none of
    the accumulator's is left active, and models without sequences export no sequence series."""
    client = grpcclient.InferenceServerClient(server.url)
    assert infer(client, grpcclient, 95, 1, start=True)[0] == 1
    text = server.metrics_text()
    samples = {}
    for line in text.splitlines():
        if line.startswith("sluice_sequences"):
            name, number = line.rsplit(" ", 1)
            samples[name] = float(number)
    assert samples['sluice_sequences_active{model="accumulator",version="1"}'] == 1
    assert samples['sluice_sequences_total{model="accumulator",outcome="ended",version="1"}'] >= 24
    assert samples['sluice_sequences_total{model="acc_small",outcome="idle_expired",version="1"}'] >= 1
    assert infer(client, grpcclient, 95, 1, end=True)[0] == 2
