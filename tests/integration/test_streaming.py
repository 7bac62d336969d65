"""ModelStreamInfer on the real sluice-server with tritonclient's stream API and raw gRPC streams:
a thousand requests on one stream with mixed models and shapes matched by id, a bad request that
fails alone, a client that never reads its responses (the server stops reading at its in-flight
bound instead of buffering), queued requests cancelled when the stream ends, and the server
serving after each."""
import queue
import threading
import time

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc

from conftest import ASAN_BUILD, start_server, wait_models_ready
from harness.process import rss_bytes

MAX_IN_FLIGHT = 16


@pytest.fixture(scope="module")
def stream_server(test_repository, tmp_path_factory):
    server = start_server(test_repository, tmp_path_factory,
                          ["--strict-readiness", "false", "--device", "cpu",
                           "--grpc-stream-max-in-flight", str(MAX_IN_FLIGHT)])
    wait_models_ready(server, ["dtype_fp32", "dtype_int64", "multi_io", "slow_queue", "throws"])
    yield server
    assert server.stop() == 0, server.log()


def assert_serving(server):
    client = grpcclient.InferenceServerClient(server.url)
    inp = grpcclient.InferInput("INPUT__0", [1, 3], "FP32")
    inp.set_data_from_numpy(np.array([[1, 2, 3]], dtype=np.float32))
    np.testing.assert_array_equal(client.infer("dtype_fp32", [inp]).as_numpy("OUTPUT__0"), [[2, 4, 6]])
    client.close()


def test_a_thousand_requests_on_one_stream_with_mixed_models_and_shapes(stream_server):
    rng = np.random.default_rng(17)
    answers = queue.Queue()
    client = grpcclient.InferenceServerClient(stream_server.url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    expected = {}
    for i in range(1000):
        rows, width = int(rng.integers(1, 5)), int(rng.integers(1, 9))
        kind = i % 3
        if kind == 0:
            x = rng.random((rows, width), dtype=np.float32)
            inp = grpcclient.InferInput("INPUT__0", [rows, width], "FP32")
            inp.set_data_from_numpy(x)
            client.async_stream_infer("dtype_fp32", [inp], request_id=str(i))
            expected[str(i)] = {"OUTPUT__0": x + x}
        elif kind == 1:
            x = rng.integers(-1000, 1000, (rows, width), dtype=np.int64)
            inp = grpcclient.InferInput("INPUT__0", [rows, width], "INT64")
            inp.set_data_from_numpy(x)
            client.async_stream_infer("dtype_int64", [inp], request_id=str(i))
            expected[str(i)] = {"OUTPUT__0": x + x}
        else:
            values = rng.random((rows, 4), dtype=np.float32)
            counts = rng.integers(0, 10, (rows, 4), dtype=np.int64)
            inputs = [grpcclient.InferInput("values", [rows, 4], "FP32"),
                      grpcclient.InferInput("counts", [rows, 4], "INT64")]
            inputs[0].set_data_from_numpy(values)
            inputs[1].set_data_from_numpy(counts)
            client.async_stream_infer("multi_io", inputs, request_id=str(i))
            expected[str(i)] = {"total": values + counts.astype(np.float32), "twice": counts * 2}
    seen = set()
    for _ in range(1000):
        result, error = answers.get(timeout=60)
        assert error is None, error
        request_id = result.get_response().id
        assert request_id not in seen
        seen.add(request_id)
        for name, value in expected[request_id].items():
            np.testing.assert_array_equal(result.as_numpy(name), value)
    assert seen == set(expected)
    client.stop_stream()
    client.close()


def test_a_bad_request_fails_alone(stream_server):
    answers = queue.Queue()
    client = grpcclient.InferenceServerClient(stream_server.url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    good = grpcclient.InferInput("INPUT__0", [1, 2], "FP32")
    good.set_data_from_numpy(np.array([[1, 2]], dtype=np.float32))
    wrong_type = grpcclient.InferInput("INPUT__0", [1, 2], "INT32")
    wrong_type.set_data_from_numpy(np.array([[1, 2]], dtype=np.int32))
    client.async_stream_infer("dtype_fp32", [good], request_id="before")
    client.async_stream_infer("nope", [good], request_id="unknown model")
    client.async_stream_infer("dtype_fp32", [wrong_type], request_id="wrong type")
    negative = grpcclient.InferInput("INPUT__0", [1, 2], "FP32")
    negative.set_data_from_numpy(np.array([[-1, 1]], dtype=np.float32))
    client.async_stream_infer("throws", [negative], request_id="model raises")
    client.async_stream_infer("dtype_fp32", [good], request_id="after")
    ok, errors = [], []
    for _ in range(5):
        result, error = answers.get(timeout=30)
        if error is None:
            ok.append(result.get_response().id)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), [[2, 4]])
        else:
            errors.append(str(error))
    client.stop_stream()
    client.close()
    assert sorted(ok) == ["after", "before"]
    assert len(errors) == 3
    assert any("'nope'" in e for e in errors), errors
    assert any("has datatype INT32, model 'dtype_fp32' expects FP32" in e for e in errors), errors
    assert any("negative input is not allowed" in e for e in errors), errors


def test_error_responses_carry_the_request_id(stream_server):
    """tritonclient drops the response of a failed request; a raw stream sees its id."""
    channel = grpc.insecure_channel(stream_server.url)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    request = service_pb2.ModelInferRequest(model_name="nope", id="r-17")
    responses = list(stub.ModelStreamInfer(iter([request]), timeout=30))
    channel.close()
    assert len(responses) == 1
    assert "'nope'" in responses[0].error_message
    assert responses[0].infer_response.id == "r-17"
    assert responses[0].infer_response.model_name == "nope"


def test_a_client_that_never_reads_cannot_make_the_server_buffer(stream_server):
    """2,000 requests of 256 KiB offered on one stream whose responses are never read: the server
    stops reading at its in-flight bound, so the client's sends stall and the server's memory
    stays flat instead of growing by the 512 MiB offered."""
    payload = np.ones((1, 65536), dtype=np.float32).tobytes()
    sent = [0]

    def requests():
        for i in range(2000):
            request = service_pb2.ModelInferRequest(model_name="dtype_fp32", id=str(i))
            request.inputs.add(name="INPUT__0", datatype="FP32", shape=[1, 65536])
            request.raw_input_contents.append(payload)
            sent[0] += 1
            yield request

    channel = grpc.insecure_channel(stream_server.url)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    before = rss_bytes(stream_server.process.pid)
    call = stub.ModelStreamInfer(requests())  # the responses are never iterated
    last, stalled_since = -1, time.monotonic()
    deadline = time.monotonic() + 60
    while time.monotonic() - stalled_since < 2.0:
        assert time.monotonic() < deadline, f"sends never stalled ({sent[0]} sent)"
        if sent[0] != last:
            last, stalled_since = sent[0], time.monotonic()
        time.sleep(0.1)
    grown = rss_bytes(stream_server.process.pid) - before
    print(f"stalled after {sent[0]} requests; server RSS grew {grown / 2**20:.1f} MiB")
    assert sent[0] < 2000
    if not ASAN_BUILD:
        assert grown < 160 * 2**20, f"server RSS grew {grown / 2**20:.0f} MiB"
    call.cancel()
    channel.close()
    assert_serving(stream_server)


def test_queued_requests_are_cancelled_when_the_stream_ends(stream_server):
    """slow_queue holds a lone request 1.5 s for company: a stream cancelled right after sending
    two leaves them queued, and they are answered (CANCELLED) without running."""
    client = grpcclient.InferenceServerClient(stream_server.url)
    before = client.get_inference_statistics("slow_queue", as_json=True)["model_stats"][0]
    channel = grpc.insecure_channel(stream_server.url)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    release = threading.Event()

    def requests():
        for i in range(2):
            request = service_pb2.ModelInferRequest(model_name="slow_queue", id=str(i))
            request.inputs.add(name="INPUT__0", datatype="FP32", shape=[1, 4])
            request.raw_input_contents.append(np.ones((1, 4), dtype=np.float32).tobytes())
            yield request
        release.wait(10)  # keep the stream open until the test cancels it

    call = stub.ModelStreamInfer(requests())
    time.sleep(0.3)  # both queued
    call.cancel()
    release.set()
    channel.close()
    deadline = time.monotonic() + 5
    while True:
        after = client.get_inference_statistics("slow_queue", as_json=True)["model_stats"][0]
        failed = int(after["inference_stats"].get("fail", {}).get("count", 0)) - \
            int(before["inference_stats"].get("fail", {}).get("count", 0))
        if failed == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert failed == 2, after
    assert after.get("execution_count", 0) == before.get("execution_count", 0)  # neither ran
    client.close()
    assert_serving(stream_server)


def test_stream_closed_by_the_client_gets_every_answer_then_ends_ok(stream_server):
    channel = grpc.insecure_channel(stream_server.url)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    requests = []
    for i in range(3 * MAX_IN_FLIGHT):
        request = service_pb2.ModelInferRequest(model_name="dtype_fp32", id=str(i))
        request.inputs.add(name="INPUT__0", datatype="FP32", shape=[1, 1])
        request.raw_input_contents.append(np.array([[i]], dtype=np.float32).tobytes())
        requests.append(request)
    responses = list(stub.ModelStreamInfer(iter(requests), timeout=60))  # the iterator ends: half-close
    channel.close()
    assert sorted(int(r.infer_response.id) for r in responses) == list(range(3 * MAX_IN_FLIGHT))
    for r in responses:
        assert r.error_message == ""
        assert np.frombuffer(r.infer_response.raw_output_contents[0], dtype=np.float32)[0] == \
            2 * int(r.infer_response.id)
