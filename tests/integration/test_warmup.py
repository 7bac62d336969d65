"""Shape buckets, the per-model cuDNN benchmark decision, warm-up before ready, and the environment
report, against the real sluice-server with tritonclient."""
import os
import re
import subprocess
import time

import grpc
import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
from conftest import SERVER, ServerProcess, start_server
from grpc_health.v1 import health_pb2, health_pb2_grpc
from repository_helpers import traced_convs_module, warmed_pairs, write
from torch import nn
from tritonclient.utils import InferenceServerException

HAS_GPU = torch.cuda.is_available()
SEQ_BUCKETS = [4, 8, 16]


class MaskedSequence(nn.Module):
    """Padding-safe: per-position outputs ignore the other positions, and the pooled output
    averages over the true length only (from the lengths input the server fills)."""

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor):
        per_position = tokens * 2.0 + 1.0
        positions = torch.arange(tokens.shape[1]).unsqueeze(0)
        mask = (positions < lengths).to(tokens.dtype).unsqueeze(-1)
        pooled = (tokens * mask).sum(dim=1) / lengths.to(tokens.dtype)
        return {"per_position": per_position, "pooled": pooled}


class SlowToWarm(nn.Module):
    """Runs `n` small matmuls: cheap for clients (n = 1), slow for its warm-up sample (zeros, so
    that no denormal floats slow it down further)."""

    def forward(self, x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        w = torch.full([64, 64], 0.01)
        for _ in range(int(n[0])):
            x = torch.tanh(x @ w)
        return x


class SlowAboveFour(nn.Module):
    """Doubles its input; a batch of more than 4 rows also burns about 100 small matmuls, so that
    sizes 5-8 serve far fewer rows per second than size 4 (like a CPU conv net whose kernels
    change with the batch size)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > 4:
            w = torch.full([64, 64], 0.001)
            y = torch.ones([64, 64])
            for _ in range(100):
                y = torch.tanh(y @ w)
            return x * 2.0 + y[0, 0] * 0.0
        return x * 2.0


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("warmup_repository"))
    write(root, "seq_padded", f"""
max_batch_size: 4
input [ {{ name: "tokens" data_type: TYPE_FP32 dims: [ -1, 2 ] }},
        {{ name: "lengths" data_type: TYPE_INT64 dims: [ 1 ] }} ]
output [ {{ name: "per_position" data_type: TYPE_FP32 dims: [ -1, 2 ] }},
         {{ name: "pooled" data_type: TYPE_FP32 dims: [ 2 ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: 200000 preferred_batch_size: [ 4 ] }}
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
parameters {{ key: "sluice.pad_batch_to_preferred" value {{ string_value: "true" }} }}
parameters {{ key: "sluice.buckets" value {{ string_value: "seq={','.join(map(str, SEQ_BUCKETS))}" }} }}
parameters {{ key: "sluice.bucket_dims" value {{ string_value: "tokens:0=seq, per_position:0=seq" }} }}
parameters {{ key: "sluice.pad_value" value {{ string_value: "-7" }} }}
parameters {{ key: "sluice.lengths_input" value {{ string_value: "lengths" }} }}
""", torch.jit.script(MaskedSequence()))
    write(root, "traced_convs", """
max_batch_size: 2
input [ { name: "image" data_type: TYPE_FP32 dims: [ 3, 8, 8 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 2 ] } ]
instance_group [ { kind: KIND_CPU count: 2 } ]
""", traced_convs_module())
    write(root, "variable", """
max_batch_size: 4
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
""", torch.jit.script(nn.Identity()))
    write(root, "cliff", """
max_batch_size: 8
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
dynamic_batching { max_queue_delay_microseconds: 300000 }
instance_group [ { kind: KIND_CPU count: 1 } ]
parameters { key: "INTRA_OP_THREAD_COUNT" value { string_value: "1" } }
""", torch.jit.script(SlowAboveFour()))
    return root


@pytest.fixture(scope="module")
def warm_server(repository, tmp_path_factory):
    server = start_server(repository, tmp_path_factory, ["--device", "cpu"])
    yield server
    assert server.stop() == 0, server.log()


@pytest.fixture()
def client(warm_server):
    triton = grpcclient.InferenceServerClient(url=warm_server.url)
    yield triton
    triton.close()


def reference(tokens):
    return MaskedSequence()(torch.from_numpy(tokens),
                            torch.full((tokens.shape[0], 1), tokens.shape[1], dtype=torch.int64))


def infer_tokens(client, tokens):
    tensor = grpcclient.InferInput("tokens", list(tokens.shape), "FP32")
    tensor.set_data_from_numpy(tokens)
    return client.infer("seq_padded", [tensor])


def test_padded_requests_equal_the_unpadded_torch_reference(client):
    rng = np.random.default_rng(1)
    for length in [1, 3, 4, 5, 11, 16]:
        tokens = rng.standard_normal((2, length, 2)).astype(np.float32)
        result = infer_tokens(client, tokens)
        expected = reference(tokens)
        assert result.as_numpy("per_position").shape == (2, length, 2)  # cut back from the bucket
        np.testing.assert_array_equal(result.as_numpy("per_position"), expected["per_position"].numpy())
        np.testing.assert_allclose(result.as_numpy("pooled"), expected["pooled"].numpy(), rtol=1e-6)


def test_requests_of_different_lengths_in_one_bucket_batch_together(client, warm_server):
    """Lengths 5, 6, 7 and 8 share bucket 8: sent together they run as one batch of 4."""
    rng = np.random.default_rng(2)
    inputs = [rng.standard_normal((1, length, 2)).astype(np.float32) for length in (5, 6, 7, 8)]
    results = []

    def done(result, error):
        results.append((result, error))

    for tokens in inputs:
        tensor = grpcclient.InferInput("tokens", list(tokens.shape), "FP32")
        tensor.set_data_from_numpy(tokens)
        client.async_infer("seq_padded", [tensor], done)
    deadline = time.monotonic() + 30
    while len(results) < len(inputs) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(results) == len(inputs)
    for result, error in results:
        assert error is None, error
    by_length = {r.as_numpy("per_position").shape[1]: r for r, _ in results}
    for tokens in inputs:
        np.testing.assert_allclose(by_length[tokens.shape[1]].as_numpy("pooled"),
                                   reference(tokens)["pooled"].numpy(), rtol=1e-6)
    stats = client.get_inference_statistics("seq_padded", as_json=True)["model_stats"][0]
    assert any(int(b["batch_size"]) == 4 for b in stats["batch_stats"]), stats["batch_stats"]


def test_above_the_largest_bucket_is_rejected_and_the_server_keeps_serving(client):
    with pytest.raises(InferenceServerException) as error:
        infer_tokens(client, np.zeros((1, 17, 2), np.float32))
    assert "StatusCode.INVALID_ARGUMENT" in str(error.value.status())
    assert "dimension 1 is 17, above the largest bucket (16) of padded axis 'seq'" in error.value.message()
    assert infer_tokens(client, np.ones((1, 16, 2), np.float32)).as_numpy("per_position").shape == (1, 16, 2)


def test_the_lengths_input_is_the_servers(client):
    metadata = client.get_model_metadata("seq_padded", as_json=True)
    assert [i["name"] for i in metadata["inputs"]] == ["tokens"]
    tokens = grpcclient.InferInput("tokens", [1, 2, 2], "FP32")
    tokens.set_data_from_numpy(np.zeros((1, 2, 2), np.float32))
    lengths = grpcclient.InferInput("lengths", [1, 1], "INT64")
    lengths.set_data_from_numpy(np.array([[2]], np.int64))
    with pytest.raises(InferenceServerException) as error:
        client.infer("seq_padded", [tokens, lengths])
    assert "is filled by the server" in error.value.message()


def test_traced_nested_convolutions_are_rewritten_and_compute_the_reference(client, warm_server):
    image = np.random.default_rng(3).standard_normal((2, 3, 8, 8)).astype(np.float32)
    tensor = grpcclient.InferInput("image", list(image.shape), "FP32")
    tensor.set_data_from_numpy(image)
    result = client.infer("traced_convs", [tensor]).as_numpy("OUTPUT__0")
    expected = traced_convs_module()(torch.from_numpy(image)).detach().numpy()
    np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-6)
    log = warm_server.log()
    assert re.search(r"event=cudnn_benchmark model=traced_convs version=1 benchmark=on "
                     r"reason=\"fixed shapes \(2 in the set\)\" convolutions=2 rewritten=2", log), log


def test_warmed_pairs_equal_the_computed_shape_set(warm_server):
    log = warm_server.log()
    expected = {(instance, f"batch={b} image[{b},3,8,8]") for instance in (0, 1) for b in (1, 2)}
    assert warmed_pairs(log, "traced_convs") == expected
    # Bucketed, and padded to the one preferred batch size: 4 x each bucket, on the one instance.
    assert warmed_pairs(log, "seq_padded") == {(0, f"batch=4 tokens[4,{s},2]") for s in SEQ_BUCKETS}
    assert re.search(r"event=warmup model=traced_convs version=1 shapes=2 instances=2 pairs=4 "
                     r"warmup_ms=\d+", log), log
    # Open-ended shapes: no benchmark, nothing to warm.
    assert re.search(r"event=cudnn_benchmark model=variable version=1 benchmark=off reason=\"variable "
                     r"shapes: input 'INPUT__0' dimension 0 is variable", log), log
    assert "event=warmup model=variable version=1 shapes=variable instances=0 pairs=0" in log


def test_auto_batch_sizes_skip_the_sizes_that_serve_fewer_rows_per_second(client, warm_server):
    log = warm_server.log()
    found = re.search(r"event=auto_batch_sizes model=cliff version=1 sizes=(\S+) rows_per_s=\"([^\"]+)\"", log)
    assert found, log
    # Sizes 1-4 cost one multiply each, so rows/s grows with the size (each size at least 1.33x
    # the one below it, beyond the 0.9 bound); 5-8 also burn 100 matmuls. Timed in rounds across
    # the sizes, a busy host slows them alike (with both cores kept busy by two other processes:
    # 123k/247k/369k/492k rows/s for 1-4, five runs of five alike).
    assert found.group(1) == "1,2,3,4", found.group(0)
    rates = dict(pair.split(":") for pair in found.group(2).split(","))
    assert sorted(int(size) for size in rates) == list(range(1, 9))
    assert max(float(rates[str(size)]) for size in range(5, 9)) < 0.5 * float(rates["4"]), found.group(0)
    # Padded to its one preferred size (4): every row count pads to 4, so more rows always serve
    # more real rows per second and every count is kept.
    assert re.search(r'event=auto_batch_sizes model=seq_padded version=1 sizes=1,2,3,4 rows_per_s="4:\d+"', log), log
    assert "event=auto_batch_sizes model=traced_convs version=1 off=\"no dynamic_batching\"" in log

    # The ModelConfig answer and the metrics say the same.
    parameters = client.get_model_config("cliff").config.parameters
    assert parameters["sluice.auto_batch_sizes.chosen"].string_value == "1,2,3,4"
    assert parameters["sluice.auto_batch_sizes.rows_per_second"].string_value == found.group(2)
    assert client.get_model_config("seq_padded").config.parameters["sluice.auto_batch_sizes.chosen"].string_value \
        == "1,2,3,4"
    assert "sluice.auto_batch_sizes.chosen" not in client.get_model_config("traced_convs").config.parameters
    text = warm_server.metrics_text()
    series = set(re.findall(r'sluice_model_auto_batch_rows_per_second\{batch_size="(\d+)",model="cliff"', text))
    assert series == {"1", "2", "3", "4"}, text

    # Eight requests waiting together (a 300 ms delay) run as two batches of 4, not one of 8.
    results = []
    for row in range(8):
        data = np.full((1, 4), row, dtype=np.float32)
        tensor = grpcclient.InferInput("INPUT__0", [1, 4], "FP32")
        tensor.set_data_from_numpy(data)
        client.async_infer("cliff", [tensor], lambda result, error, row=row: results.append((row, result, error)))
    deadline = time.monotonic() + 30
    while len(results) < 8 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(results) == 8
    for row, result, error in results:
        assert error is None, error
        np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), np.full((1, 4), row * 2.0, dtype=np.float32))
    stats = client.get_inference_statistics("cliff", as_json=True)["model_stats"][0]
    counts = {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats["batch_stats"]}
    assert max(counts) <= 4 and counts.get(4) == 2, counts


def test_cudnn_benchmark_flag_and_warmup_switch(repository, tmp_path_factory):
    server = start_server(repository, tmp_path_factory, ["--device", "cpu", "--cudnn-benchmark", "off",
                                                         "--warmup", "false"])
    try:
        log = server.log()
        assert ("event=cudnn_benchmark model=traced_convs version=1 benchmark=off "
                "reason=\"--cudnn-benchmark=off\"") in log
        assert warmed_pairs(log, "traced_convs") == set()
    finally:
        assert server.stop() == 0, server.log()


def write_slow_model(tmp_path_factory, name, count, iterations):
    """A repository with one SlowToWarm model whose warm-up sample runs `iterations` matmuls,
    `count` times."""
    root = str(tmp_path_factory.mktemp(f"{name}_repository"))
    write(root, name, f"""
max_batch_size: 0
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ 64, 64 ] }},
        {{ name: "n" data_type: TYPE_INT64 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 64, 64 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
model_warmup [ {{ name: "long" batch_size: 0 count: {count}
  inputs {{ key: "x" value: {{ data_type: TYPE_FP32 dims: [ 64, 64 ] zero_data: true }} }}
  inputs {{ key: "n" value: {{ data_type: TYPE_INT64 dims: [ 1 ] input_data_file: "n.bin" }} }} }} ]
""", torch.jit.script(SlowToWarm()))
    os.makedirs(os.path.join(root, name, "warmup"))
    np.array([iterations], np.int64).tofile(os.path.join(root, name, "warmup", "n.bin"))
    return root


def health(url, service=""):
    with grpc.insecure_channel(url) as channel:
        return health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=5).status


def test_readiness_waits_for_warm_up(tmp_path_factory):
    root = write_slow_model(tmp_path_factory, "slow", count=1, iterations=400000)  # ~4 s
    log = tmp_path_factory.mktemp("slow_log") / "server.log"
    server = ServerProcess(root, ["--device", "cpu"], log_path=str(log))
    try:
        server.wait_serving(ready=False)
        client = grpcclient.InferenceServerClient(url=server.url)
        # Live at once, but neither the server nor the model is ready while the sample runs.
        assert client.is_server_live()
        assert not client.is_server_ready()
        assert not client.is_model_ready("slow")
        assert health(server.url) == health_pb2.HealthCheckResponse.NOT_SERVING
        assert health(server.url, "ready") == health_pb2.HealthCheckResponse.NOT_SERVING
        x = grpcclient.InferInput("x", [64, 64], "FP32")
        x.set_data_from_numpy(np.zeros((64, 64), np.float32))
        n = grpcclient.InferInput("n", [1], "INT64")
        n.set_data_from_numpy(np.array([1], np.int64))
        with pytest.raises(InferenceServerException) as error:
            client.infer("slow", [x, n])
        assert "StatusCode.UNAVAILABLE" in str(error.value.status())
        assert "event=warmup model=slow" not in server.log()  # the checks above ran during warm-up
        server.wait_serving(ready=True)
        assert health(server.url) == health_pb2.HealthCheckResponse.SERVING
        assert client.infer("slow", [x, n]).as_numpy("OUTPUT__0").shape == (64, 64)
        assert re.search(r"event=warmup_pass model=slow version=1 instance=0 shape=\"model_warmup 'long'\"",
                         server.log())
        client.close()
    finally:
        assert server.stop() == 0, server.log()


def test_shutdown_during_warm_up_is_prompt(tmp_path_factory):
    root = write_slow_model(tmp_path_factory, "endless", count=1000, iterations=20000)  # ~1000 x 0.2 s
    log = tmp_path_factory.mktemp("endless_log") / "server.log"
    server = ServerProcess(root, ["--device", "cpu"], log_path=str(log))
    server.wait_serving(ready=False)
    deadline = time.monotonic() + 30
    while "event=cudnn_benchmark" not in server.log() and "event=cpu_threads" not in server.log():
        assert time.monotonic() < deadline, server.log()
        time.sleep(0.05)
    time.sleep(0.5)  # inside the warm-up now
    started = time.monotonic()
    assert server.stop(timeout=10) == 0, server.log()
    assert time.monotonic() - started < 5
    assert "event=shutdown_during_load" in server.log()
    assert "warm-up abandoned: the server is shutting down" in server.log()


def test_print_env_without_gpu():
    result = subprocess.run([SERVER, "--print-env"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f"libtorch: {torch.__version__.split('+')[0]}\n" in out
    assert f"cuda_built_with: {torch.version.cuda}\n" in out
    assert "cudnn_compiled: 9." in out and "cudnn_loaded: 9." in out
    assert "cudnn_benchmark: auto" in out
    assert re.search(r"intra_op_threads: \d+\n", out)
    if HAS_GPU:
        assert "gpu 0: " in out
    else:
        assert "gpus: none\n" in out
        assert "result: no usable GPU; every model runs on the CPU" in out
        assert "problem: " in out  # it says why: no driver, or no GPU visible


def test_cuda_graphs_on_a_cpu_instance_are_ignored_with_one_line_and_the_model_serves(tmp_path_factory):
    """optimization.cuda.graphs loads on a CPU-only host (repositories move between machines
    unchanged): the server says once that it ignores it, and answers as torch does."""
    from conftest import write_bundled
    root = write_bundled(tmp_path_factory.mktemp("graphs_cpu"), ["mlp"])
    with open(root / "mlp" / "config.pbtxt", "a") as f:
        f.write("optimization { cuda { graphs: true } }\n")
    server = start_server(root, tmp_path_factory, ["--device", "cpu"])
    try:
        client = grpcclient.InferenceServerClient(url=server.url)
        rows = np.random.default_rng(4).random((3, 784), dtype=np.float32)
        tensor = grpcclient.InferInput("INPUT__0", list(rows.shape), "FP32")
        tensor.set_data_from_numpy(rows)
        for _ in range(4):  # past the passes a GPU instance would capture after
            got = client.infer("mlp", [tensor]).as_numpy("OUTPUT__0")
        model = torch.jit.load(str(root / "mlp" / "1" / "model.pt"))
        with torch.inference_mode():
            want = model(torch.from_numpy(rows)).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        client.close()
        lines = [line for line in server.log().splitlines() if "optimization.cuda.graphs is ignored" in line]
        assert len(lines) == 1 and "event=model_warning model=mlp" in lines[0], lines
    finally:
        assert server.stop() == 0
