"""Operator libraries against the real server, through tritonclient over gRPC and HTTP:
torchvision's operators with no configuration (a model calling all six, and a torchvision Faster
R-CNN), answers equal to torch; an operator library of our own (built by ctest against the wheel's
LibTorch) loaded by --operator-library, by sluice.operator_libraries and by Triton's
MODEL_INIT_LIBRARY (its init and fini hooks called per instance); and the refusals, each with its
reason while the server goes on serving: a missing library, one that aborts its probe (it takes
the namespace of a library loaded before it), one that does not load, a path outside the allowed directories and one
that climbs out with "..". A library that fails at start-up stops the start."""
import os
import shutil
import subprocess
import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import SERVER, start_server
from torch import nn
from vision_models import DETECTOR_CONFIG, VISION_CONFIG, VISION_OUTPUTS, Detector, VisionOps, config, vision_inputs

OPS_DIR = os.environ.get("SLUICE_TEST_OPS_DIR", os.path.join(os.path.dirname(SERVER), "..", "tests",
                                                             "operator_libraries"))
TEST_OPS = os.path.join(OPS_DIR, "libsluice_test_ops.so")
CLASH_OPS = os.path.join(OPS_DIR, "libsluice_clash_ops.so")
UNRESOLVED_OPS = os.path.join(OPS_DIR, "libsluice_unresolved_ops.so")
BUNDLED = os.path.join(os.path.dirname(SERVER), "..", "lib", "sluice", "torchvision_ops.so")

pytestmark = pytest.mark.skipif(not os.path.exists(TEST_OPS) or not os.path.exists(BUNDLED),
                                reason="needs the test operator libraries and the bundled torchvision operators")


class ScaleAdd(nn.Module):
    """OUTPUT__0 = sluice_test::scale_add(INPUT__0, 2) = INPUT__0 * 2 + 1 (the test library's operator)."""

    def forward(self, INPUT__0: torch.Tensor) -> torch.Tensor:
        return torch.ops.sluice_test.scale_add(INPUT__0, 2.0)


def scale_config(parameters="", count=1):
    return ('max_batch_size: 4\n'
            'input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
            'output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
            f'instance_group [ {{ kind: KIND_CPU count: {count} }} ]\n' + parameters)


def parameter(key, value):
    return f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}\n'


def write(root, name, config, module=None, files=()):
    os.makedirs(os.path.join(root, name, "1"), exist_ok=True)
    with open(os.path.join(root, name, "config.pbtxt"), "w") as f:
        f.write(config)
    if module is not None:
        module.save(os.path.join(root, name, "1", "model.pt"))
    for source, relative in files:
        os.makedirs(os.path.dirname(os.path.join(root, name, relative)), exist_ok=True)
        shutil.copy(source, os.path.join(root, name, relative))


@pytest.fixture(scope="module")
def scripted():
    torch.ops.load_library(TEST_OPS)  # scripting a call needs the operator's schema here too
    return {"vision": torch.jit.script(VisionOps()), "detector": torch.jit.script(Detector().eval()),
            "scale": torch.jit.script(ScaleAdd())}


@pytest.fixture(scope="module")
def served(scripted, tmp_path_factory):
    """A repository with the models that load and those that must be refused, served with
    --operator-library-dir OPS_DIR and nothing else about operators."""
    root = tmp_path_factory.mktemp("repository")
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    shutil.copy(TEST_OPS, elsewhere / "libsluice_test_ops.so")
    write(root, "vision", config(VISION_CONFIG), scripted["vision"])
    write(root, "detector", config(DETECTOR_CONFIG), scripted["detector"])
    write(root, "by_parameter", scale_config(parameter("sluice.operator_libraries", "libsluice_test_ops.so")),
          scripted["scale"])
    write(root, "by_init_library", scale_config(parameter("MODEL_INIT_LIBRARY", "libsluice_test_ops.so"), count=2),
          scripted["scale"])
    write(root, "missing", scale_config(parameter("sluice.operator_libraries", "ops/libnothing.so")),
          scripted["scale"])
    write(root, "clash", scale_config(parameter("sluice.operator_libraries",
                                                "libsluice_test_ops.so, ops/libsluice_clash_ops.so")),
          scripted["scale"], files=[(CLASH_OPS, "ops/libsluice_clash_ops.so")])
    write(root, "unresolved", scale_config(parameter("sluice.operator_libraries", "libsluice_unresolved_ops.so")),
          scripted["scale"])
    write(root, "outside", scale_config(parameter("sluice.operator_libraries",
                                                  str(elsewhere / "libsluice_test_ops.so"))), scripted["scale"])
    os.symlink(elsewhere / "libsluice_test_ops.so", os.path.join(root, "clash", "escape.so"))
    write(root, "symlink_out", scale_config(parameter("sluice.operator_libraries", "../clash/escape.so")),
          scripted["scale"])
    write(root, "link_escape", scale_config(parameter("sluice.operator_libraries", "escape.so")), scripted["scale"],
          files=[])
    os.symlink(elsewhere / "libsluice_test_ops.so", os.path.join(root, "link_escape", "escape.so"))
    init_log = tmp_path_factory.mktemp("init") / "hooks.log"
    server = start_server(root, tmp_path_factory,
                          ["--strict-readiness", "false", "--device", "cpu", "--model-control-mode", "explicit",
                           "--load-model", "*", "--operator-library-dir", OPS_DIR],
                          env={**os.environ, "SLUICE_TEST_INIT_LOG": str(init_log)})
    from conftest import wait_models_loaded
    wait_models_loaded(server, timeout=180)
    yield server, root, init_log
    assert server.stop() == 0, server.log()


def model_states(server):
    client = grpcclient.InferenceServerClient(server.url)
    try:
        return {m["name"]: (m.get("state"), m.get("reason", "")) for m in
                client.get_model_repository_index(as_json=True)["models"]}
    finally:
        client.close()


def infer(client_module, url, model, inputs, outputs):
    client = client_module.InferenceServerClient(url)
    try:
        wire = []
        for name, value in inputs.items():
            tensor = client_module.InferInput(name, list(value.shape), "FP32")
            tensor.set_data_from_numpy(value)
            wire.append(tensor)
        result = client.infer(model, wire, outputs=[client_module.InferRequestedOutput(o) for o in outputs])
        return [result.as_numpy(o) for o in outputs]
    finally:
        client.close()


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_torchvision_operators_need_no_configuration(served, scripted, protocol):
    server, _, _ = served
    inputs = vision_inputs()
    module, url = (grpcclient, server.url) if protocol == "grpc" else (httpclient, server.http_url)
    answers = infer(module, url, "vision", inputs, VISION_OUTPUTS)
    with torch.inference_mode():
        expected = scripted["vision"](*(torch.from_numpy(v) for v in inputs.values()))
    assert len(answers[0]) > 0
    for name, answer, want in zip(VISION_OUTPUTS, answers, expected):
        np.testing.assert_allclose(answer, want.numpy(), rtol=1e-5, atol=1e-5, err_msg=name)


def test_the_server_runs_them_without_python(served):
    """torchvision's operators are in the server's address space, and no Python is."""
    server, _, _ = served
    with open(f"/proc/{server.process.pid}/maps") as f:
        mapped = {line.split()[-1] for line in f if "/" in line}
    names = {os.path.basename(path) for path in mapped}
    assert "torchvision_ops.so" in names, sorted(names)
    assert not [name for name in names if name.startswith(("libpython", "libtorch_python"))], sorted(names)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_faster_rcnn_answers_as_torch(served, scripted, protocol):
    server, _, _ = served
    image = np.random.default_rng(5).uniform(0, 1, size=(3, 240, 320)).astype(np.float32)
    module, url = (grpcclient, server.url) if protocol == "grpc" else (httpclient, server.http_url)
    boxes, scores, labels = infer(module, url, "detector", {"IMAGE": image}, ["BOXES__0", "SCORES__1", "LABELS__2"])
    with torch.inference_mode():
        want_boxes, want_scores, want_labels = scripted["detector"](torch.from_numpy(image))
    assert len(scores) > 0, "box_score_thresh=0 keeps detections"
    assert boxes.shape == (len(scores), 4) and labels.dtype == np.int64
    np.testing.assert_allclose(scores, want_scores.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(boxes, want_boxes.numpy(), rtol=1e-4, atol=1e-3)
    np.testing.assert_array_equal(labels, want_labels.numpy())


@pytest.mark.parametrize("model", ["by_parameter", "by_init_library"])
def test_own_library_by_parameter(served, model):
    server, _, _ = served
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    for module, url in ((grpcclient, server.url), (httpclient, server.http_url)):
        (answer,) = infer(module, url, model, {"INPUT__0": x}, ["OUTPUT__0"])
        np.testing.assert_array_equal(answer, x * 2 + 1)


def test_a_library_two_models_name_is_loaded_once(served):
    server, _, _ = served
    text = server.metrics_text()
    series = [line for line in text.splitlines() if line.startswith("sluice_operator_library_operators{")]
    ours = [line for line in series if "libsluice_test_ops.so" in line]
    assert len(ours) == 1, series
    assert ours[0].endswith(" 1"), ours
    bundled = [line for line in series if 'library="torchvision_ops.so"' in line]
    assert len(bundled) == 1 and float(bundled[0].rsplit(" ", 1)[1]) >= 6, series
    assert server.log().count("event=operator_library_loaded library=libsluice_test_ops.so") == 1
    ready = [line for line in server.log().splitlines() if "event=model_ready model=by_parameter " in line]
    assert ready and 'operator_libraries="libsluice_test_ops.so"' in ready[0], ready


def test_init_hooks_run_per_instance(served):
    server, root, init_log = served
    lines = init_log.read_text().splitlines()
    version_dir = os.path.join(os.path.realpath(root), "by_init_library", "1")
    inits = [line for line in lines if line.startswith("init ")]
    assert len(inits) == 2, lines  # instance_group count 2
    assert all(os.path.realpath(line.split()[1]) == version_dir and line.split()[2] == "-1" for line in inits), lines
    client = grpcclient.InferenceServerClient(server.url)
    try:
        client.unload_model("by_init_library")
    finally:
        client.close()
    import time
    deadline = time.monotonic() + 30
    while init_log.read_text().count("fini") < 2:
        assert time.monotonic() < deadline, init_log.read_text()
        time.sleep(0.1)
    assert init_log.read_text().splitlines().count("fini -1") == 2


@pytest.mark.parametrize("model,reason", [
    ("missing", "not found"),
    ("clash", "TORCH_LIBRARY"),
    ("unresolved", "undefined symbol"),
    ("outside", "outside the model's directory"),
    ("symlink_out", "'..'"),
    ("link_escape", "outside the model's directory"),
])
def test_refused_with_its_reason_while_serving(served, model, reason):
    server, _, _ = served
    state, why = model_states(server)[model]
    assert state == "UNAVAILABLE", (state, why)
    assert reason in why, why
    # The server goes on: the models that load still answer.
    x = np.ones((1, 3), np.float32)
    (answer,) = infer(grpcclient, server.url, "by_parameter", {"INPUT__0": x}, ["OUTPUT__0"])
    np.testing.assert_array_equal(answer, x * 2 + 1)


def test_clash_reason_names_the_namespace(served):
    server, _, _ = served
    _, why = model_states(server)["clash"]
    assert "sluice_test" in why and "child process" in why and "Aborted" in why, why


@pytest.fixture(scope="module")
def flag_repository(scripted, tmp_path_factory):
    root = tmp_path_factory.mktemp("flagged")
    write(root, "scaled", scale_config(), scripted["scale"])
    return root


def test_own_library_by_flag(flag_repository, tmp_path_factory):
    server = start_server(flag_repository, tmp_path_factory, ["--device", "cpu", "--operator-library", TEST_OPS])
    try:
        x = np.array([[1, 2, 3]], np.float32)
        (answer,) = infer(grpcclient, server.url, "scaled", {"INPUT__0": x}, ["OUTPUT__0"])
        np.testing.assert_array_equal(answer, x * 2 + 1)
        assert 'origin="--operator-library"' in server.log()
    finally:
        assert server.stop() == 0


def test_without_the_library_the_model_says_what_is_missing(flag_repository, tmp_path_factory):
    server = start_server(flag_repository, tmp_path_factory, ["--device", "cpu", "--strict-readiness", "false"])
    try:
        from conftest import wait_models_loaded
        wait_models_loaded(server)
        state, why = model_states(server)["scaled"]
        assert state == "UNAVAILABLE" and "sluice_test::scale_add" in why, why
    finally:
        assert server.stop() == 0


@pytest.mark.parametrize("libraries,reason", [
    ([TEST_OPS, CLASH_OPS], "TORCH_LIBRARY"),
    (["/nonexistent/libops.so"], "does not exist"),
    ([UNRESOLVED_OPS], "undefined symbol"),
])
def test_a_bad_startup_library_stops_the_start(flag_repository, libraries, reason):
    flags = [arg for library in libraries for arg in ("--operator-library", library)]
    run = subprocess.run([SERVER, "--model-repository", str(flag_repository), "--device", "cpu", "--grpc-port", "0",
                          "--http-port", "0", "--metrics-port", "0"] + flags,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert reason in run.stdout + run.stderr, run.stdout + run.stderr


def test_print_env_lists_the_libraries():
    run = subprocess.run([SERVER, "--device", "cpu", "--print-env", "--operator-library", TEST_OPS],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    lines = [line for line in run.stdout.splitlines() if line.startswith("operator library:")]
    assert len(lines) == 2, run.stdout
    assert "torchvision_ops.so (bundled torchvision)" in lines[0] and "in torchvision" in lines[0]
    assert "libsluice_test_ops.so (--operator-library): 1 operators in sluice_test" in lines[1]
    assert run.stdout.splitlines()[-1].startswith("result:")
    off = subprocess.run([SERVER, "--device", "cpu", "--print-env", "--torchvision-ops", "off"],
                         capture_output=True, text=True, timeout=120)
    assert "operator libraries: none" in off.stdout
