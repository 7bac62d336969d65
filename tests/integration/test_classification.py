"""Triton's classification extension over the wire: outputs asked for with a class count
(tritonclient's `class_count`, the output parameter "classification") come back as BYTES
"<score>:<index>[:<label>]", byte for byte as Triton writes them, over gRPC and HTTP (JSON and
binary), with labels from the output's label_filename; the refusals keep their words; and Triton's
own image_client.py classifies an image (when SLUICE_TRITON_EXAMPLES names Triton's examples)."""
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

import numpy as np
import pytest
import torch
from torch import nn

from conftest import start_server, wait_models_ready
from make_test_repository import write_model

LABELS = ["cat", "dog", "", "eel", "fox"]  # index 2 has no label: nothing is appended

# Fixed weights: the scores of an input row are its softmax over x @ W (5 classes).
WEIGHTS = torch.tensor([[0.5, -1.0, 2.0, 0.0, 1.5],
                        [1.0, 0.25, -0.5, 2.0, 0.0],
                        [-1.5, 2.0, 0.0, 0.5, 1.0],
                        [0.0, 0.0, 1.0, -1.0, 0.75]])


class Classifier(nn.Module):
    """Class scores as FP32 (labelled), the same as FP16, and a BOOL output classes cannot come from."""

    def __init__(self):
        super().__init__()
        self.weights = nn.Parameter(WEIGHTS.clone(), requires_grad=False)

    def forward(self, INPUT__0: torch.Tensor):
        probs = torch.softmax(INPUT__0 @ self.weights, dim=1)
        return probs, probs.half(), probs > 0.2


class Counts(nn.Module):
    """A model without batching whose INT32 output is classified as one row."""

    def forward(self, INPUT__0: torch.Tensor):
        return (INPUT__0 * 10).to(torch.int32)


class ImageClassifier(nn.Module):
    """What image_client.py expects: one CHW FP32 image in, one FP32 vector of class scores out."""

    def forward(self, INPUT__0: torch.Tensor):
        means = INPUT__0.mean(dim=(2, 3))  # [batch, 3]
        return torch.cat([means, means[:, :1] - means[:, 1:2]], dim=1)  # [batch, 4]


CLASSIFIER_CONFIG = ('platform: "pytorch_libtorch"\nmax_batch_size: 4\n'
                     'input [{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] }]\n'
                     'output [{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 5 ] label_filename: "labels.txt" },'
                     ' { name: "OUTPUT__1" data_type: TYPE_FP16 dims: [ 5 ] },'
                     ' { name: "OUTPUT__2" data_type: TYPE_BOOL dims: [ 5 ] }]\n'
                     'dynamic_batching { }\n')
COUNTS_CONFIG = ('platform: "pytorch_libtorch"\nmax_batch_size: 0\n'
                 'input [{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ 2, 3 ] }]\n'
                 'output [{ name: "OUTPUT__0" data_type: TYPE_INT32 dims: [ 2, 3 ] }]\n')
IMAGE_CONFIG = ('platform: "pytorch_libtorch"\nmax_batch_size: 2\n'
                'input [{ name: "INPUT__0" data_type: TYPE_FP32 format: FORMAT_NCHW dims: [ 3, 8, 8 ] }]\n'
                'output [{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] label_filename: "classes.txt" }]\n')
IMAGE_LABELS = ["red", "green", "blue", "warm"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("classification")
    write_model(root, "classifier", CLASSIFIER_CONFIG, Classifier())
    (root / "classifier" / "labels.txt").write_text("\n".join(LABELS) + "\n")
    write_model(root, "counts", COUNTS_CONFIG, Counts())
    write_model(root, "image", IMAGE_CONFIG, ImageClassifier())
    (root / "image" / "classes.txt").write_text("\n".join(IMAGE_LABELS) + "\n")
    # A label file that is not there: the model does not load, and says why.
    write_model(root, "unlabelled", CLASSIFIER_CONFIG, Classifier())
    server = start_server(root, tmp_path_factory, ["--device", "cpu", "--strict-readiness", "false"])
    wait_models_ready(server, ["classifier", "counts", "image"])
    yield server
    assert server.stop() == 0, server.log()


def triton_classes(scores, count, labels=None, integer=False):
    """The strings Triton writes for one row: top `count`, highest first, equal scores by index."""
    flat = [float(v) if not integer else int(v) for v in np.asarray(scores).reshape(-1)]
    order = sorted(range(len(flat)), key=lambda i: (-flat[i], i))[:count]
    out = []
    for i in order:
        text = f"{flat[i]}:{i}" if integer else f"{flat[i]:f}:{i}"
        if labels and i < len(labels) and labels[i]:
            text += f":{labels[i]}"
        out.append(text.encode())
    return out


def inputs_batch():
    return np.array([[1.0, 0.0, 0.5, -1.0], [0.25, 2.0, -0.5, 1.0]], dtype=np.float32)


def reference(batch):
    probs = torch.softmax(torch.from_numpy(batch) @ WEIGHTS, dim=1)
    return probs.numpy(), probs.half().numpy()


def test_grpc_answers_each_row_with_its_top_classes_as_triton_writes_them(server):
    import tritonclient.grpc as grpcclient
    batch = inputs_batch()
    probs, halves = reference(batch)
    with grpcclient.InferenceServerClient(server.url) as client:
        given = grpcclient.InferInput("INPUT__0", list(batch.shape), "FP32")
        given.set_data_from_numpy(batch)
        result = client.infer("classifier", [given], outputs=[
            grpcclient.InferRequestedOutput("OUTPUT__0", class_count=3),
            grpcclient.InferRequestedOutput("OUTPUT__1", class_count=2),
            grpcclient.InferRequestedOutput("OUTPUT__2")])
        first = result.as_numpy("OUTPUT__0")
        assert first.shape == (2, 3)
        for row in range(2):
            assert list(first[row]) == triton_classes(probs[row], 3, LABELS)
        # FP16 classes: a Sluice extension (Triton refuses FP16 for classification).
        second = result.as_numpy("OUTPUT__1")
        assert second.shape == (2, 2)
        for row in range(2):
            assert list(second[row]) == triton_classes(halves[row].astype(np.float32), 2)
        # The output asked for without a class count is the tensor, beside the classes.
        assert result.as_numpy("OUTPUT__2").tolist() == (probs > 0.2).tolist()
        response = result.get_response()
        assert [o.datatype for o in response.outputs] == ["BYTES", "BYTES", "BOOL"]

        # More classes than the row has: every class, the shape says so.
        many = client.infer("classifier", [given],
                            outputs=[grpcclient.InferRequestedOutput("OUTPUT__0", class_count=50)])
        assert many.as_numpy("OUTPUT__0").shape == (2, 5)
        assert list(many.as_numpy("OUTPUT__0")[1]) == triton_classes(probs[1], 5, LABELS)


def test_without_batching_the_answer_has_shape_k_and_integers_print_as_integers(server):
    import tritonclient.grpc as grpcclient
    values = np.array([[0.1, 0.7, 0.3], [0.9, 0.7, 0.0]], dtype=np.float32)
    with grpcclient.InferenceServerClient(server.url) as client:
        given = grpcclient.InferInput("INPUT__0", [2, 3], "FP32")
        given.set_data_from_numpy(values)
        result = client.infer("counts", [given],
                              outputs=[grpcclient.InferRequestedOutput("OUTPUT__0", class_count=4)])
    classes = result.as_numpy("OUTPUT__0")
    assert classes.shape == (4,)
    assert list(classes) == triton_classes((values * 10).astype(np.int32), 4, integer=True)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_http_answers_the_same_bytes(server, binary):
    import tritonclient.http as httpclient
    batch = inputs_batch()
    probs, _ = reference(batch)
    with httpclient.InferenceServerClient(server.http_url) as client:
        given = httpclient.InferInput("INPUT__0", list(batch.shape), "FP32")
        given.set_data_from_numpy(batch, binary_data=binary)
        result = client.infer("classifier", [given], outputs=[
            httpclient.InferRequestedOutput("OUTPUT__0", binary_data=binary, class_count=1),
            # FP16 has no JSON form, its classes do: asked for as JSON, it is answered.
            httpclient.InferRequestedOutput("OUTPUT__1", binary_data=False, class_count=1)])
    classes = result.as_numpy("OUTPUT__0")
    assert classes.shape == (2, 1)
    for row in range(2):
        expected = triton_classes(probs[row], 1, LABELS)
        assert [c if isinstance(c, bytes) else c.encode() for c in classes[row]] == expected
    assert result.get_output("OUTPUT__1")["datatype"] == "BYTES"


def post_json(server, model, body):
    request = urllib.request.Request(f"http://{server.http_url}/v2/models/{model}/infer",
                                     data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_refusals_say_what_is_wrong_and_the_server_keeps_serving(server):
    row = {"name": "INPUT__0", "shape": [1, 4], "datatype": "FP32", "data": [1, 0, 0, 0]}
    cases = [
        ({"name": "OUTPUT__2", "parameters": {"classification": 2}},
         "output 'OUTPUT__2': class result not available for output due to unsupported type 'BOOL'"),
        ({"name": "OUTPUT__0", "parameters": {"classification": -1}},
         "output 'OUTPUT__0': the parameter 'classification' must be a non-negative integer"),
        ({"name": "OUTPUT__0", "parameters": {"classification": "many"}},
         "found the string \"many\""),
    ]
    for output, message in cases:
        status, answer = post_json(server, "classifier", {"inputs": [row], "outputs": [output]})
        assert status == 400, answer
        assert message in answer["error"], answer
    # Zero asks for the tensor, as no parameter does.
    status, answer = post_json(server, "classifier", {
        "inputs": [row], "outputs": [{"name": "OUTPUT__0", "parameters": {"classification": 0}}]})
    assert status == 200, answer
    assert answer["outputs"][0]["datatype"] == "FP32"


def test_the_configuration_names_the_label_file_and_a_missing_one_stops_the_load(server):
    import tritonclient.grpc as grpcclient
    with grpcclient.InferenceServerClient(server.url) as client:
        config = client.get_model_config("classifier").config
        assert config.output[0].label_filename == "labels.txt"
        assert not client.is_model_ready("unlabelled")
        index = {m.name: m for m in client.get_model_repository_index().models}
        assert "cannot read its label_filename" in index["unlabelled"].reason
        assert "labels.txt" in index["unlabelled"].reason


EXAMPLES = os.environ.get("SLUICE_TRITON_EXAMPLES", "")


@pytest.mark.skipif(not EXAMPLES, reason="SLUICE_TRITON_EXAMPLES names no directory of Triton's example clients")
@pytest.mark.parametrize("classes", [1, 3])
def test_tritons_image_client_classifies_an_image_unchanged(server, tmp_path, classes):
    from PIL import Image
    script = os.path.join(EXAMPLES, "image_client.py")
    if not os.path.exists(script):
        pytest.skip(f"image_client.py is not in {EXAMPLES}")
    image = tmp_path / "red.png"
    Image.new("RGB", (16, 16), (220, 40, 10)).save(image)
    run = subprocess.run([sys.executable, script, "-u", server.url, "-i", "grpc", "-m", "image",
                          "-c", str(classes), str(image)], capture_output=True, text=True, timeout=120)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    # Means 220, 40, 10 and red minus green 180: "red" scores highest, then "warm", then "green".
    lines = [line.strip() for line in output.splitlines() if " = " in line]
    expected = [("220.000000", "0", "red"), ("180.000000", "3", "warm"), ("40.000000", "1", "green")][:classes]
    assert lines == [f"{score} ({index}) = {label}" for score, index, label in expected], output
