"""Pinned model code (--model-digests, --require-model-digests) against the real server, with
tritonclient over gRPC and HTTP: a model and an operator library pinned in a manifest outside the
repository load and answer; a model file or a library with one byte changed is refused with the
expected and the actual digest, and the library's code never ran (its static initializer, which
appends to a marker file, did not: neither in the server nor in the probe's child); pinning the
new bytes in the manifest lets the next load take them; with --require-model-digests a model the
manifest does not list is refused."""
import hashlib
import os
import shutil

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from torch import nn

from conftest import start_server, wait_models_loaded
from test_operator_libraries import TEST_OPS, ScaleAdd, parameter, scale_config

pytestmark = pytest.mark.skipif(not os.path.exists(TEST_OPS), reason="needs the test operator library")


class Double(nn.Module):
    def forward(self, INPUT__0: torch.Tensor) -> torch.Tensor:
        return INPUT__0 * 2.0


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def write_model(root, name, module, parameters=""):
    os.makedirs(root / name / "1", exist_ok=True)
    (root / name / "config.pbtxt").write_text(scale_config(parameters))
    module.save(str(root / name / "1" / "model.pt"))


def append_byte(path):
    os.chmod(path, 0o644)
    with open(path, "ab") as f:
        f.write(b"\0")


def states(server):
    client = grpcclient.InferenceServerClient(server.url)
    return {m.name: (m.state, m.reason) for m in client.get_model_repository_index().models}


def infer(client, module, model, x):
    tensor = module.InferInput("INPUT__0", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return client.infer(model, [tensor]).as_numpy("OUTPUT__0")


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    torch.ops.load_library(TEST_OPS)  # scripting a call needs the operator's schema
    root = tmp_path_factory.mktemp("pinned_repository")
    double, scale = torch.jit.script(Double()), torch.jit.script(ScaleAdd())
    write_model(root, "plain", double)
    write_model(root, "tampered", double)
    write_model(root, "unlisted", double)
    library = parameter("sluice.operator_libraries", "libsluice_test_ops.so")
    write_model(root, "with_library", scale, library)
    shutil.copy(TEST_OPS, root / "with_library" / "libsluice_test_ops.so")
    write_model(root, "tampered_library", scale, library)
    shutil.copy(TEST_OPS, root / "tampered_library" / "libsluice_test_ops.so")
    # The manifest, outside the repository, as `sha256sum` writes it from the repository's root.
    pinned = ["plain/1/model.pt", "tampered/1/model.pt", "with_library/1/model.pt",
              "with_library/libsluice_test_ops.so", "tampered_library/1/model.pt",
              "tampered_library/libsluice_test_ops.so"]
    manifest = tmp_path_factory.mktemp("digests") / "SHA256SUMS"
    manifest.write_text("".join(f"{sha256(root / path)}  {path}\n" for path in pinned))
    # Then one byte changes in two of the pinned files.
    append_byte(root / "tampered" / "1" / "model.pt")
    append_byte(root / "tampered_library" / "libsluice_test_ops.so")
    return root, manifest


def test_pinned_files_load_and_a_changed_byte_is_refused_before_any_of_it_runs(repository, tmp_path_factory):
    root, manifest = repository
    marker = tmp_path_factory.mktemp("marker") / "loads.log"
    server = start_server(root, tmp_path_factory,
                          ["--device", "cpu", "--strict-readiness", "false", "--model-control-mode", "explicit",
                           "--load-model", "plain", "--load-model", "tampered", "--load-model", "unlisted",
                           "--load-model", "tampered_library", "--model-digests", str(manifest)],
                          env={**os.environ, "SLUICE_TEST_LOAD_MARKER": str(marker)})
    try:
        wait_models_loaded(server)
        index = states(server)
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        for client, module in ((grpcclient.InferenceServerClient(server.url), grpcclient),
                               (httpclient.InferenceServerClient(server.http_url), httpclient)):
            np.testing.assert_allclose(infer(client, module, "plain", x), x * 2.0)
            np.testing.assert_allclose(infer(client, module, "unlisted", x), x * 2.0)  # not required
        changed = sha256(root / "tampered" / "1" / "model.pt")
        assert index["tampered"][0] == "UNAVAILABLE"
        assert f"has SHA-256 {changed}, not " in index["tampered"][1], index["tampered"]
        assert "as --model-digests pins it: it was not loaded" in index["tampered"][1]
        library = root / "tampered_library" / "libsluice_test_ops.so"
        assert index["tampered_library"][0] == "UNAVAILABLE"
        assert f"operator library {library} has SHA-256 {sha256(library)}" in index["tampered_library"][1]
        assert not marker.exists(), marker.read_text()  # its code never ran, not even in a probe

        # The library pinned as it is: it loads (its initializer runs, in the probe and here).
        client = grpcclient.InferenceServerClient(server.url)
        client.load_model("with_library")
        np.testing.assert_allclose(infer(client, grpcclient, "with_library", x), x * 2.0 + 1.0)
        assert marker.exists() and marker.read_text().count("loaded") >= 1
        # The operator pins the changed bytes: the next load takes them (the manifest is read again).
        lines = [f"{changed}  tampered/1/model.pt" if line.endswith("  tampered/1/model.pt") else line
                 for line in manifest.read_text().splitlines()]
        manifest.write_text("\n".join(lines) + "\n")
        client.load_model("tampered")
        np.testing.assert_allclose(infer(client, grpcclient, "tampered", x), x * 2.0)
    finally:
        assert server.stop() == 0, server.log()
    leftovers = [p for p in os.listdir("/tmp") if p.startswith("sluice-pinned-")
                 and not os.path.exists(f"/proc/{p.rsplit('-', 1)[1]}")]
    assert not leftovers, leftovers  # each server removes its private copies at exit


def test_the_export_recipe_pins_files_as_sha256sum_would(tmp_path):
    import subprocess
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "models"))
    from sluice_export import pin
    model = tmp_path / "repo" / "m" / "1" / "model.pt2"
    os.makedirs(model.parent)
    model.write_bytes(b"first")
    manifest = tmp_path / "SHA256SUMS"
    assert pin(str(model), str(manifest)) == f"{hashlib.sha256(b'first').hexdigest()}  m/1/model.pt2"
    model.write_bytes(b"second")
    pin(str(model), str(manifest))  # replaces its line
    library = tmp_path / "repo" / "m" / "libops.so"
    library.write_bytes(b"ops")
    pin(str(library), str(manifest), repository=str(tmp_path / "repo"))
    check = subprocess.run(["sha256sum", "--check", str(manifest)], cwd=tmp_path / "repo",
                           capture_output=True, text=True)
    assert check.returncode == 0 and check.stdout.count(": OK") == 2, check.stdout + check.stderr


def test_required_digests_refuse_a_model_the_manifest_does_not_list(repository, tmp_path_factory):
    root, manifest = repository
    server = start_server(root, tmp_path_factory,
                          ["--device", "cpu", "--strict-readiness", "false", "--model-control-mode", "explicit",
                           "--load-model", "plain", "--load-model", "unlisted", "--model-digests", str(manifest),
                           "--require-model-digests", "true"])
    try:
        wait_models_loaded(server)
        index = states(server)
        assert index["plain"][0] == "READY"
        assert index["unlisted"][0] == "UNAVAILABLE"
        assert f"model file {root / 'unlisted' / '1' / 'model.pt'} has no digest in --model-digests" in \
            index["unlisted"][1], index["unlisted"]
        assert "--require-model-digests loads only pinned files" in index["unlisted"][1]
    finally:
        assert server.stop() == 0, server.log()
