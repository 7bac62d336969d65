"""Dynamic batching end to end: concurrent clients against the real server, each answer equal to
the un-batched torch reference; queue timeouts, caps, cancellation and padding; ModelStatistics."""
import concurrent.futures
import threading
import time

import grpc
import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException


def row_mix(x):
    """What the batched test models compute (make_test_repository.RowMix), in torch."""
    t = torch.from_numpy(x)
    return (t * 2.0 + t.sum(dim=1, keepdim=True)).numpy()


def statistics(triton, model):
    return triton.get_inference_statistics(model).model_stats[0]


def infer(client, model, data, **kwargs):
    inp = grpcclient.InferInput("INPUT__0", list(data.shape), "FP32")
    inp.set_data_from_numpy(data)
    return client.infer(model, [inp], **kwargs)


def test_32_concurrent_clients_get_the_unbatched_reference(server, triton):
    before = statistics(triton, "batched")
    errors = []

    def client_loop(index):
        client = grpcclient.InferenceServerClient(url=server.url)
        rng = np.random.default_rng(index)
        try:
            for _ in range(15):
                rows = int(rng.integers(1, 4))
                data = rng.random((rows, 4), dtype=np.float32) * 100
                got = infer(client, "batched", data).as_numpy("OUTPUT__0")
                np.testing.assert_allclose(got, row_mix(data), rtol=1e-6, atol=1e-5)
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)
        finally:
            client.close()

    threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    after = statistics(triton, "batched")
    inferences = after.inference_count - before.inference_count
    executions = after.execution_count - before.execution_count
    assert inferences >= 32 * 15
    assert executions > 0
    assert inferences / executions > 1.5, f"average batch {inferences / executions:.2f}"
    assert after.inference_stats.queue.count > before.inference_stats.queue.count
    assert any(b.batch_size > 1 for b in after.batch_stats)


def test_statistics_rpc_matches_triton_meaning(triton, stub):
    stats = statistics(triton, "padded")
    assert stats.name == "padded" and stats.version == "1"
    everything = stub.ModelStatistics(service_pb2.ModelStatisticsRequest(), timeout=5)
    assert {s.name for s in everything.model_stats} >= {"batched", "dtype_fp32", "versioned"}
    with pytest.raises(grpc.RpcError) as error:
        stub.ModelStatistics(service_pb2.ModelStatisticsRequest(name="nope"), timeout=5)
    assert error.value.code() == grpc.StatusCode.NOT_FOUND


def test_padding_rows_never_reach_the_caller(triton):
    before = {b.batch_size: b.compute_infer.count for b in statistics(triton, "padded").batch_stats}
    data = np.arange(4, dtype=np.float32).reshape(1, 4)
    result = infer(triton, "padded", data)
    assert result.as_numpy("OUTPUT__0").shape == (1, 4)
    np.testing.assert_allclose(result.as_numpy("OUTPUT__0"), row_mix(data))
    after = {b.batch_size: b.compute_infer.count for b in statistics(triton, "padded").batch_stats}
    assert after.get(4, 0) == before.get(4, 0) + 1  # the model saw a batch of 4
    assert set(after) == {4}


def test_queue_timeout_drops_the_request_before_the_model(triton):
    before = statistics(triton, "slow_queue")
    started = time.monotonic()
    with pytest.raises(InferenceServerException) as error:
        infer(triton, "slow_queue", np.ones((1, 4), np.float32), timeout=20000)  # 20 ms
    assert error.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    assert "did not run" in error.value.message()
    assert time.monotonic() - started < 1.0  # well before the 1.5 s batching delay
    after = statistics(triton, "slow_queue")
    assert after.execution_count == before.execution_count
    assert after.inference_stats.fail.count == before.inference_stats.fail.count + 1


def test_full_queue_rejects_at_once_and_queued_requests_still_run(server):
    # slow_queue: max_queue_size 2 and a 1.5 s delay, so of three requests sent together two
    # wait and exactly one is turned away at once, whatever their order.
    data = np.ones((1, 4), np.float32)
    clients = [grpcclient.InferenceServerClient(url=server.url) for _ in range(3)]

    def call(client):
        started = time.monotonic()
        try:
            return infer(client, "slow_queue", data), time.monotonic() - started
        except InferenceServerException as error:
            return error, time.monotonic() - started

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        outcomes = list(pool.map(call, clients))
    for client in clients:
        client.close()
    rejected = [(r, t) for r, t in outcomes if isinstance(r, InferenceServerException)]
    served = [r for r, _ in outcomes if not isinstance(r, InferenceServerException)]
    assert len(rejected) == 1 and len(served) == 2, outcomes
    error, elapsed = rejected[0]
    assert error.status() == "StatusCode.UNAVAILABLE"
    assert "max_queue_size" in error.message()
    assert elapsed < 1.0  # at once, not after the batching delay
    for result in served:
        np.testing.assert_allclose(result.as_numpy("OUTPUT__0"), row_mix(data))


def test_cancelled_call_leaves_the_queue(server, triton):
    from tritonclient.grpc import service_pb2_grpc
    before = statistics(triton, "slow_queue")
    request = service_pb2.ModelInferRequest(model_name="slow_queue")
    request.inputs.add(name="INPUT__0", datatype="FP32", shape=[1, 4])
    request.raw_input_contents.append(np.ones((1, 4), np.float32).tobytes())
    with grpc.insecure_channel(server.url) as channel:
        future = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer.future(request, timeout=30)
        time.sleep(0.2)  # let it reach the queue
        future.cancel()
        deadline = time.monotonic() + 1.0  # well before the 1.5 s batching delay
        while time.monotonic() < deadline:
            now = statistics(triton, "slow_queue")
            if now.inference_stats.fail.count > before.inference_stats.fail.count:
                break
            time.sleep(0.02)
    assert now.inference_stats.fail.count == before.inference_stats.fail.count + 1
    assert now.execution_count == before.execution_count
