"""String (BYTES) tensors end to end on the real sluice-server: the bundled text_classifier and
small string models through tritonclient (gRPC raw and typed, HTTP binary and JSON), many
concurrent batched requests with different string lengths equal to the model run directly, every
bad request with its code and the server serving after, Triton's reshape layout, a model whose
forward() disagrees with its config, and sluice-client --text."""
import concurrent.futures
import json
import random
import struct
import subprocess
from typing import List, Tuple

import grpc
import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from torch import nn
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from conftest import CLIENT, start_server, wait_models_ready, write_bundled
from make_test_repository import write_model
from test_http import call

SAMPLES = ["hello world", "", "12345", "naïve café", "中文!", "a.b,c", "tab\there", "x" * 300, "🙂 ok"]


class Joined(nn.Module):
    """No batch dimension: any number of strings in, one string out."""

    def forward(self, TEXT: List[str]) -> List[str]:
        return ["|".join(TEXT)]


class Tagged(nn.Module):
    """Triton's layout for batched strings: dims [1] reshaped to [], one string per row."""

    def forward(self, TEXT: List[str]) -> List[str]:
        return [f"{len(TEXT)}:{t}" for t in TEXT]


class SimpleString(nn.Module):
    """Triton's `simple_string` example model as TorchScript: two [16] vectors of numbers written
    as strings; their sum and difference, as strings. int("") raises, so the default shape
    warm-up (empty strings) must stay off for it."""

    def forward(self, INPUT0: List[str], INPUT1: List[str]) -> Tuple[List[str], List[str]]:
        sums: List[str] = []
        differences: List[str] = []
        for i in range(len(INPUT0)):
            a, b = int(INPUT0[i]), int(INPUT1[i])
            sums.append(str(a + b))
            differences.append(str(a - b))
        return sums, differences


class TensorTakingModel(nn.Module):
    def forward(self, TEXT: torch.Tensor) -> torch.Tensor:
        return TEXT


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    root = write_bundled(tmp_path_factory.mktemp("strings"), ["text_classifier"])
    write_model(root, "joined", 'platform: "pytorch_libtorch"\n'
                'input [{ name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] }]\n'
                'output [{ name: "JOINED" data_type: TYPE_STRING dims: [ 1 ] }]\n', Joined())
    write_model(root, "tagged", 'platform: "pytorch_libtorch"\nmax_batch_size: 8\n'
                'input [{ name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] reshape: { shape: [ ] } }]\n'
                'output [{ name: "TAGGED" data_type: TYPE_STRING dims: [ 1 ] reshape: { shape: [ ] } }]\n'
                'dynamic_batching { max_queue_delay_microseconds: 20000 }\n', Tagged())
    write_model(root, "simple_string", 'platform: "pytorch_libtorch"\nmax_batch_size: 8\n'
                'input [{ name: "INPUT0" data_type: TYPE_STRING dims: [ 16 ] },'
                ' { name: "INPUT1" data_type: TYPE_STRING dims: [ 16 ] }]\n'
                'output [{ name: "OUTPUT0" data_type: TYPE_STRING dims: [ 16 ] },'
                ' { name: "OUTPUT1" data_type: TYPE_STRING dims: [ 16 ] }]\n'
                'dynamic_batching { }\n', SimpleString())
    write_model(root, "tensor_taking", 'platform: "pytorch_libtorch"\n'
                'input [{ name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] }]\n'
                'output [{ name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }]\n', TensorTakingModel())
    return root


@pytest.fixture(scope="module")
def server(repository, tmp_path_factory):
    server = start_server(repository, tmp_path_factory, ["--strict-readiness", "false"])  # tensor_taking fails
    wait_models_ready(server, ["text_classifier", "joined", "tagged", "simple_string"])
    yield server
    assert server.stop() == 0, server.log()


@pytest.fixture(scope="module")
def classifier(repository):
    return torch.jit.load(str(repository / "text_classifier" / "1" / "model.pt"))


def reference(classifier, texts):
    with torch.inference_mode():
        scores, labels = classifier(list(texts))
    return scores.numpy(), [label.encode() for label in labels]


def column(texts):
    return np.array([[t.encode()] for t in texts], dtype=np.object_)


def serialize(elements):
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


def assert_classified(scores, labels, expected):
    np.testing.assert_array_equal(scores, expected[0])
    assert labels.shape == (len(expected[1]), 1)
    assert [row[0] for row in labels] == expected[1]


def test_metadata_and_config_name_the_string_type(server):
    client = grpcclient.InferenceServerClient(server.url)
    metadata = client.get_model_metadata("text_classifier", as_json=True)
    assert metadata["inputs"] == [{"name": "TEXT", "datatype": "BYTES", "shape": ["-1", "1"]}]
    assert metadata["outputs"][1] == {"name": "LABEL", "datatype": "BYTES", "shape": ["-1", "1"]}
    config = client.get_model_config("text_classifier", as_json=True)["config"]
    assert config["input"][0]["data_type"] == "TYPE_STRING"
    client.close()


def test_grpc_raw_and_typed_equal_the_model(server, classifier):
    client = grpcclient.InferenceServerClient(server.url)
    inp = grpcclient.InferInput("TEXT", [len(SAMPLES), 1], "BYTES")
    inp.set_data_from_numpy(column(SAMPLES))
    result = client.infer("text_classifier", [inp])
    assert_classified(result.as_numpy("SCORES"), result.as_numpy("LABEL"), reference(classifier, SAMPLES))
    client.close()

    # Typed form: one bytes_contents entry per element (what clients without the raw form send).
    channel = grpc.insecure_channel(server.url)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    request = service_pb2.ModelInferRequest(model_name="text_classifier")
    tensor = request.inputs.add(name="TEXT", datatype="BYTES", shape=[3, 1])
    tensor.contents.bytes_contents.extend([t.encode() for t in SAMPLES[:3]])
    response = stub.ModelInfer(request, timeout=30)
    channel.close()
    names = [o.name for o in response.outputs]
    labels = response.raw_output_contents[names.index("LABEL")]
    assert labels == serialize(reference(classifier, SAMPLES[:3])[1])
    assert list(response.outputs[names.index("LABEL")].shape) == [3, 1]


@pytest.mark.parametrize("binary", [True, False])
def test_http_binary_and_json_equal_the_model(server, classifier, binary):
    client = httpclient.InferenceServerClient(server.http_url)
    inp = httpclient.InferInput("TEXT", [len(SAMPLES), 1], "BYTES")
    inp.set_data_from_numpy(column(SAMPLES), binary_data=binary)
    outputs = [httpclient.InferRequestedOutput(name, binary_data=binary) for name in ("SCORES", "LABEL")]
    result = client.infer("text_classifier", [inp], outputs=outputs)
    expected = reference(classifier, SAMPLES)
    labels = result.as_numpy("LABEL")
    if not binary:  # tritonclient keeps JSON strings as str
        labels = np.array([[label.encode() if isinstance(label, str) else label for label in row] for row in labels],
                          dtype=np.object_)
        np.testing.assert_allclose(result.as_numpy("SCORES"), expected[0], rtol=1e-6)
        assert [row[0] for row in labels] == expected[1]
    else:
        assert_classified(result.as_numpy("SCORES"), labels, expected)
    client.close()


def test_concurrent_requests_with_different_lengths_batch_and_match(server, classifier):
    rng = random.Random(18)
    alphabet = "abc XYZ 019 .,;!? é中🙂\t"
    requests = []
    for _ in range(96):
        rows = rng.randint(1, 4)
        requests.append([("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 120)))) for _ in range(rows)])

    def one(texts):
        client = grpcclient.InferenceServerClient(server.url)
        try:
            inp = grpcclient.InferInput("TEXT", [len(texts), 1], "BYTES")
            inp.set_data_from_numpy(column(texts))
            result = client.infer("text_classifier", [inp])
            return result.as_numpy("SCORES"), result.as_numpy("LABEL")
        finally:
            client.close()

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, requests))
    for texts, (scores, labels) in zip(requests, results):
        assert_classified(scores, labels, reference(classifier, texts))
    client = grpcclient.InferenceServerClient(server.url)
    stats = client.get_inference_statistics("text_classifier", as_json=True)["model_stats"][0]
    client.close()
    print("executions", stats.get("execution_count"), "for", stats.get("inference_count"), "rows")


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_tritons_simple_string_example_client_flow(server, protocol):
    """What Triton's simple_{grpc,http}_string_infer_client.py do, against the TorchScript port of
    their model."""
    module = grpcclient if protocol == "grpc" else httpclient
    client = module.InferenceServerClient(server.url if protocol == "grpc" else server.http_url)
    in0 = np.expand_dims(np.arange(start=0, stop=16, dtype=np.int32), axis=0)
    in1 = np.ones(shape=(1, 16), dtype=np.int32)
    expected_sum, expected_diff = np.add(in0, in1), np.subtract(in0, in1)
    in0n = np.array([str(x).encode("utf-8") for x in in0.reshape(in0.size)], dtype=np.object_).reshape(in0.shape)
    in1n = np.array([str(x).encode("utf-8") for x in in1.reshape(in1.size)], dtype=np.object_).reshape(in1.shape)
    inputs = [module.InferInput("INPUT0", [1, 16], "BYTES"), module.InferInput("INPUT1", [1, 16], "BYTES")]
    inputs[0].set_data_from_numpy(in0n)
    inputs[1].set_data_from_numpy(in1n)
    outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]
    result = client.infer("simple_string", inputs, outputs=outputs)
    for i in range(16):
        assert int(result.as_numpy("OUTPUT0")[0][i]) == expected_sum[0][i]
        assert int(result.as_numpy("OUTPUT1")[0][i]) == expected_diff[0][i]
    # A string the model cannot parse fails that request with the model's message; the next works.
    inputs[0].set_data_from_numpy(np.array([[b"x"] * 16], dtype=np.object_))
    with pytest.raises(InferenceServerException, match="invalid literal|stoll|int"):
        client.infer("simple_string", inputs, outputs=outputs)
    inputs[0].set_data_from_numpy(in0n)
    assert int(client.infer("simple_string", inputs, outputs=outputs).as_numpy("OUTPUT0")[0][15]) == 16
    client.close()


def test_tritons_reshape_layout_batches_one_string_per_row(server):
    def one(text):
        client = grpcclient.InferenceServerClient(server.url)
        try:
            inp = grpcclient.InferInput("TEXT", [1, 1], "BYTES")
            inp.set_data_from_numpy(column([text]))
            return client.infer("tagged", [inp]).as_numpy("TAGGED")
        finally:
            client.close()

    texts = [f"t{i}" * i for i in range(8)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, texts))
    for text, result in zip(texts, results):
        assert result.shape == (1, 1)
        count, tagged = result[0][0].decode().split(":", 1)
        assert tagged == text and 1 <= int(count) <= 8  # the list held the whole batch


def test_unbatched_model_takes_any_number_of_strings(server):
    client = grpcclient.InferenceServerClient(server.url)
    for texts in (["a"], ["a", "", "ü"], [""] * 5):
        inp = grpcclient.InferInput("TEXT", [len(texts)], "BYTES")
        inp.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=np.object_))
        result = client.infer("joined", [inp]).as_numpy("JOINED")
        assert result.tolist() == ["|".join(texts).encode()]
    client.close()


def raw_request(model, shape, data, datatype="BYTES"):
    request = service_pb2.ModelInferRequest(model_name=model)
    request.inputs.add(name="TEXT", datatype=datatype, shape=shape)
    request.raw_input_contents.append(data)
    return request


def test_bad_requests_fail_alone_and_the_server_serves_on(server, classifier):
    channel = grpc.insecure_channel(server.url)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    cases = [
        (raw_request("text_classifier", [1, 1], struct.pack("<I", 50) + b"short"),
         "BYTES element 0 has length 50, but only 5 bytes are left"),
        (raw_request("text_classifier", [3, 1], serialize([b"a", b"b"])),
         "has 2 BYTES elements but its shape needs 3"),
        (raw_request("text_classifier", [1, 1], serialize([b"a"]) + b"xy"), "has 2 bytes after its 1 BYTES element"),
        (raw_request("text_classifier", [2, 1], serialize([b"ok", b"\xff\xfe"])),
         "BYTES element 1 is not valid UTF-8 (at its byte 0); the model takes it as str"),
        (raw_request("text_classifier", [1, 1], struct.pack("<f", 1.0), datatype="FP32"),
         "input 'TEXT' has datatype FP32, model 'text_classifier' expects BYTES"),
        (raw_request("text_classifier", [1, 2], serialize([b"a", b"b"])), "dimension 1 is 2"),
        (raw_request("text_classifier", [17, 1], serialize([b"a"] * 17)), "batch size 17 is outside [1, 16]"),
    ]
    for request, message in cases:
        with pytest.raises(grpc.RpcError) as error:
            stub.ModelInfer(request, timeout=30)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT, message
        assert message in error.value.details()
    channel.close()

    # Over HTTP: a JSON value that is not a string, and a binary input with a broken length.
    body = json.dumps({"inputs": [{"name": "TEXT", "shape": [2, 1], "datatype": "BYTES", "data": ["a", 3]}]})
    status, _, answer = call(server, "POST", "/v2/models/text_classifier/infer", body)
    assert status == 400 and "has a value that is not a string" in json.loads(answer)["error"]
    header = json.dumps({"inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES",
                                     "parameters": {"binary_data_size": 6}}]}).encode()
    status, _, answer = call(server, "POST", "/v2/models/text_classifier/infer", header + struct.pack("<I", 9) + b"ab",
                             headers={"Inference-Header-Content-Length": str(len(header))})
    assert status == 400 and "has length 9, but only 2 bytes are left" in json.loads(answer)["error"]

    # A good request after all of them, in a batch of its own or with others.
    client = grpcclient.InferenceServerClient(server.url)
    inp = grpcclient.InferInput("TEXT", [2, 1], "BYTES")
    inp.set_data_from_numpy(column(["still", "serving"]))
    result = client.infer("text_classifier", [inp])
    assert_classified(result.as_numpy("SCORES"), result.as_numpy("LABEL"), reference(classifier, ["still", "serving"]))
    client.close()


def test_a_forward_that_takes_a_tensor_for_a_string_input_does_not_load(server):
    client = grpcclient.InferenceServerClient(server.url)
    index = {m["name"]: m for m in client.get_model_repository_index(as_json=True)["models"]}
    assert index["tensor_taking"]["state"] == "UNAVAILABLE"
    assert ("input 'TEXT' is TYPE_STRING in config.pbtxt, but forward() takes 'TEXT' as Tensor"
            in index["tensor_taking"]["reason"])
    inp = grpcclient.InferInput("TEXT", [1], "BYTES")
    inp.set_data_from_numpy(np.array([b"x"], dtype=np.object_))
    with pytest.raises(InferenceServerException, match="tensor_taking"):
        client.infer("tensor_taking", [inp])
    client.close()


def test_sluice_client_sends_text(server, classifier):
    result = subprocess.run([CLIENT, "--url", server.url, "infer", "text_classifier", "--text", "TEXT=12345",
                             "--text", "TEXT=hello there"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert 'input  TEXT BYTES [2,1] ["12345", "hello there"]' in result.stdout
    assert 'output LABEL BYTES [2,1] ["digits", "letters"]' in result.stdout
    bad = subprocess.run([CLIENT, "--url", server.url, "infer", "joined", "--text", "NOPE=x"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "has no input 'NOPE'" in bad.stderr
