"""Every path from the network to the disk, tried hostile over gRPC and HTTP against the real
server: model names and versions with "..", "/", NUL bytes, percent-encoding, absolute paths and
overlong components, in every call that names a model (ready, metadata, config, infer,
statistics, trace settings, load and unload); a canary model lying just outside the repository
that each traversal aims at. Each is refused with a client error (never INTERNAL or 500), the
canary is never loaded, read into the index or named in the log, and the server serves on."""
import json
import os
import shutil
import urllib.parse

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from conftest import start_server, wait_models_loaded
from test_http import assert_still_serving, call

# What a client may send as a model name, aimed at ../outside/canary (a loadable model beside the
# repository) or at files of the system.
NAMES = ["..", "../outside/canary", "../../outside/canary", "dtype_fp32/../../outside/canary",
         "/etc/passwd", "/tmp", ".hidden", ".", "dtype_fp32/1", "dtype\0_fp32", "x" * 300,
         "%2e%2e%2foutside%2fcanary", "dtype_fp32\\..\\..\\outside\\canary"]
VERSIONS = ["../1", "1/../1", "-1", "0", "99999999999999999999999", "1\0", "%2e%2e", "1 ", " 1"]
CLIENT_ERRORS = ("StatusCode.NOT_FOUND", "StatusCode.INVALID_ARGUMENT", "StatusCode.UNAVAILABLE",
                 "StatusCode.FAILED_PRECONDITION")


@pytest.fixture(scope="module")
def explicit(test_repository, tmp_path_factory):
    """The test repository, copied beside a canary model (outside/canary) that nothing may load,
    served in explicit mode so that load and unload take names too."""
    base = tmp_path_factory.mktemp("hostile_paths")
    repository = base / "repository"
    shutil.copytree(test_repository, repository, symlinks=True)
    canary = base / "outside" / "canary"
    shutil.copytree(repository / "dtype_fp32", canary)
    server = start_server(repository, tmp_path_factory,
                          ["--device", "cpu", "--strict-readiness", "false", "--model-control-mode", "explicit",
                           "--load-model", "dtype_fp32", "--trace-config", "level=TIMESTAMPS",
                           "--trace-config", "rate=1000000"])
    wait_models_loaded(server)
    yield server, base
    assert server.stop() == 0, server.log()


def grpc_calls(client, name, version=""):
    tensor = grpcclient.InferInput("INPUT__0", [1, 3], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 3), np.float32))
    return {
        "ready": lambda: client.is_model_ready(name, version),
        "metadata": lambda: client.get_model_metadata(name, version),
        "config": lambda: client.get_model_config(name, version),
        "infer": lambda: client.infer(name, [tensor], model_version=version),
        "statistics": lambda: client.get_inference_statistics(name, version),
        "trace": lambda: client.get_trace_settings(model_name=name),
        "load": lambda: client.load_model(name),
        "unload": lambda: client.unload_model(name),
    }


def assert_refused_or_false(call, what):
    try:
        answer = call()
    except InferenceServerException as error:
        assert str(error.status()) in CLIENT_ERRORS, (what, error.status(), error.message())
        assert len(error.message()) < 1024, what
        return
    assert answer is False, (what, answer)  # ready: false is the answer for what does not exist


def assert_canary_untouched(server, base):
    client = grpcclient.InferenceServerClient(server.url)
    names = {m.name for m in client.get_model_repository_index().models}
    assert "canary" not in names and not any("outside" in n for n in names), names
    # The log names what clients asked for, quoted (so a name cannot forge a line), but nothing
    # outside the repository was loaded or read as a model.
    with open(server.log_path, "rb") as f:
        log = f.read().decode("utf-8")  # valid UTF-8 whatever the clients sent
    for line in log.splitlines():
        if "event=model_load " in line or "event=model_ready" in line or "event=repository" in line:
            assert "canary" not in line and "model=../" not in line and "model=/" not in line, line


def test_hostile_model_names_over_grpc_are_refused(explicit):
    server, base = explicit
    client = grpcclient.InferenceServerClient(server.url)
    for name in NAMES:
        for what, call in grpc_calls(client, name).items():
            assert_refused_or_false(call, (name, what))
    for version in VERSIONS:
        for what in ("ready", "metadata", "config", "infer", "statistics"):
            assert_refused_or_false(grpc_calls(client, "dtype_fp32", version)[what], (version, what))
    assert_canary_untouched(server, base)
    assert client.is_model_ready("dtype_fp32")
    assert_still_serving(server)


def http_paths(name, version=None):
    model = f"/v2/models/{name}" + (f"/versions/{version}" if version is not None else "")
    infer_body = json.dumps({"inputs": [{"name": "INPUT__0", "shape": [1, 3], "datatype": "FP32",
                                         "data": [1.0, 2.0, 3.0]}]})
    return [("GET", f"{model}/ready", None), ("GET", model, None), ("GET", f"{model}/config", None),
            ("POST", f"{model}/infer", infer_body), ("GET", f"{model}/stats", None),
            ("GET", f"/v2/models/{name}/trace/setting", None),
            ("POST", f"/v2/repository/models/{name}/load", "{}"),
            ("POST", f"/v2/repository/models/{name}/unload", "{}")]


def test_hostile_model_names_over_http_are_refused(explicit):
    server, base = explicit
    encoded = set()
    for name in NAMES:
        encoded.add(urllib.parse.quote(name, safe=""))       # every byte that needs it escaped
        encoded.add(urllib.parse.quote(name, safe="/"))      # slashes as they are
    encoded |= {"..%2F..%2Foutside%2Fcanary", "%2E%2E", ".%2e", "%252e%252e", "dtype_fp32%00",
                "dtype_fp32%2F..%2F..%2Foutside%2Fcanary", "%C0%AE%C0%AE", "dtype_fp32;/../x"}
    for name in sorted(encoded):
        for method, path, body in http_paths(name):
            status, _, answer = call(server, method, path, body)
            assert status in (400, 404, 405, 503), (method, path, status, answer[:200])
            if status != 405:
                assert "error" in json.loads(answer), (path, answer[:200])
    for version in VERSIONS:
        quoted = urllib.parse.quote(version, safe="")
        for method, path, body in http_paths("dtype_fp32", quoted)[:5]:
            status, _, answer = call(server, method, path, body)
            assert status in (400, 404), (method, path, status, answer[:200])
    assert_canary_untouched(server, base)
    assert_still_serving(server)


def test_a_symlink_in_the_repository_to_a_model_outside_it(explicit):
    """A model directory that is a symbolic link out of the repository (as `ln -s` by someone
    with write access to it): what the operator put there is served like any model; the escape
    is the repository writer's, not the client's, and digests pin what it may run
    (--model-digests). A client still cannot name the target through the link's parent."""
    server, base = explicit
    link = base / "repository" / "linked"
    os.symlink(base / "outside" / "canary", link)
    try:
        client = grpcclient.InferenceServerClient(server.url)
        for name in ("linked/..", "linked/../..", "linked/../../outside/canary"):
            for what, call in grpc_calls(client, name).items():
                assert_refused_or_false(call, (name, what))
    finally:
        os.unlink(link)
    assert_still_serving(server)
