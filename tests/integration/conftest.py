"""Fixtures that start the real sluice-server on a free loopback port and stop it again.

Environment (set by ctest, see tests/CMakeLists.txt):
  SLUICE_BIN_DIR             build/bin with sluice-server and sluice-client
  SLUICE_PROTO_DESCRIPTORS   descriptor set of our protos
"""
import os
import subprocess
import sys
import time

import grpc
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BIN_DIR = os.environ.get("SLUICE_BIN_DIR", os.path.join(ROOT, "build", "bin"))
SERVER = os.path.join(BIN_DIR, "sluice-server")
CLIENT = os.path.join(BIN_DIR, "sluice-client")

sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))  # tests/: the harness package
from harness.repository import write_bundled  # noqa: E402,F401 (for the tests)
from harness.server import SluiceServer, free_port  # noqa: E402,F401 (free_port: for the tests)


def _built_with_asan():
    try:
        return "libasan" in subprocess.run(["ldd", SERVER], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False


# True for the AddressSanitizer build (scripts/sanitize.sh): its allocator keeps freed memory in
# a quarantine, so RSS figures say nothing about leaks there (LeakSanitizer checks those).
ASAN_BUILD = _built_with_asan()


class ServerProcess(SluiceServer):
    """The built sluice-server (SLUICE_BIN_DIR) on free loopback ports, started at once (its
    gRPC, HTTP and metrics ports in `port`, `http_port`, `metrics_port`; `url` is host:port for
    clients); wait_serving() and stop() as in harness.server."""

    def __init__(self, repository, extra_args=(), log_path=None, env=None, credentials=None, prefix=()):
        super().__init__(SERVER, repository, extra_args, log_path=log_path, env=env, credentials=credentials,
                         prefix=prefix, stop_timeout=30.0)
        self.spawn()


@pytest.fixture(scope="session")
def test_repository(tmp_path_factory):
    """The test models of make_test_repository.py, built once per checkout into
    .cache/test-models/repository (again when the script or torch changes) and copied from there."""
    import shutil
    sys.path.insert(0, os.path.join(ROOT, "models"))
    from model_cache import cached, source_key
    script = os.path.join(HERE, "make_test_repository.py")
    built = cached(os.path.join(ROOT, ".cache", "test-models"), "repository", source_key(script),
                   lambda path: subprocess.run([sys.executable, script, path], check=True))
    root = tmp_path_factory.mktemp("repository")
    shutil.copytree(built, root, dirs_exist_ok=True)
    return root


@pytest.fixture(scope="session")
def bundled_repository(tmp_path_factory):
    """The bundled models/ configs with freshly generated weights, outside the source tree."""
    return write_bundled(tmp_path_factory.mktemp("bundled"))


def wait_models_ready(server, names, timeout=60.0):
    """Waits until every model in `names` is ready (a server with --strict-readiness false is
    ready before its models are)."""
    import tritonclient.grpc as grpcclient
    client = grpcclient.InferenceServerClient(server.url)
    try:
        deadline = time.monotonic() + timeout
        while not all(client.is_model_ready(name) for name in names):
            assert time.monotonic() < deadline, f"{names} not ready after {timeout}s:\n{server.log()}"
            time.sleep(0.1)
    finally:
        client.close()


def wait_models_loaded(server, timeout=60.0):
    """Waits until no model of the repository is still loading: READY or UNAVAILABLE with its
    reason (a server with --strict-readiness false is ready before its models are)."""
    import tritonclient.grpc as grpcclient
    client = grpcclient.InferenceServerClient(server.url)
    try:
        deadline = time.monotonic() + timeout
        while True:
            index = client.get_model_repository_index(as_json=True).get("models", [])
            loading = [model["name"] for model in index if model.get("state") not in ("READY", "UNAVAILABLE")]
            if index and not loading:
                return
            assert time.monotonic() < deadline, f"{loading} still loading after {timeout}s:\n{server.log()}"
            time.sleep(0.1)
    finally:
        client.close()


def client_for(server, protocol):
    """(a tritonclient client of `server` over `protocol`, "grpc" or "http", and its module)."""
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient
    if protocol == "grpc":
        return grpcclient.InferenceServerClient(server.url), grpcclient
    return httpclient.InferenceServerClient(server.http_url), httpclient


def start_server(repository, tmp_path_factory, extra_args=(), ready=True, env=None, credentials=None):
    log = tmp_path_factory.mktemp("log") / "server.log"
    server = ServerProcess(repository, extra_args, log_path=str(log), env=env, credentials=credentials)
    try:
        server.wait_serving(ready=ready)
    except Exception:
        server.stop()
        raise
    return server


@pytest.fixture(scope="session")
def server(test_repository, tmp_path_factory):
    """The test repository served with --strict-readiness false (it holds broken models)."""
    server = start_server(test_repository, tmp_path_factory, ["--strict-readiness", "false",
                                                              "--device", "cpu"])
    wait_models_loaded(server)  # the tests read each model's final state
    yield server
    code = server.stop()
    assert code == 0, f"sluice-server did not shut down cleanly ({code}):\n{server.log()}"


@pytest.fixture(scope="session")
def bundled_server(bundled_repository, tmp_path_factory):
    # Client shared memory on: perf_analyzer --shared-memory system registers its own regions,
    # keyed "/" + the tensor's name (+ "_<stream>_<step>" for inputs): mlp's /INPUT__0_0_0, /OUTPUT__0.
    server = start_server(bundled_repository, tmp_path_factory, ["--allow-client-shm=true",
                                                                 "--client-shm-keys=/INPUT__,/OUTPUT__"])
    yield server
    assert server.stop() == 0, server.log()


@pytest.fixture()
def stub(server):
    """A raw stub from tritonclient's generated modules, for requests tritonclient would refuse."""
    from tritonclient.grpc import service_pb2_grpc
    channel = grpc.insecure_channel(server.url)
    yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


@pytest.fixture()
def triton(server):
    import tritonclient.grpc as grpcclient
    client = grpcclient.InferenceServerClient(url=server.url)
    yield client
    client.close()
