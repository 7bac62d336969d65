"""Fixtures that start the real sluice-server on a free loopback port and stop it again.

Environment (set by ctest, see tests/CMakeLists.txt):
  SLUICE_BIN_DIR             build/bin with sluice-server and sluice-client
  SLUICE_PROTO_DESCRIPTORS   descriptor set of our protos
"""
import os
import signal
import socket
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


def _built_with_asan():
    try:
        return "libasan" in subprocess.run(["ldd", SERVER], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False


# True for the AddressSanitizer build (scripts/sanitize.sh): its allocator keeps freed memory in
# a quarantine, so RSS figures say nothing about leaks there (LeakSanitizer checks those).
ASAN_BUILD = _built_with_asan()


def free_port():
    """A port the OS says is free on loopback (bound, then released for the server to take)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """One sluice-server process; `url` is host:port for clients."""

    def __init__(self, repository, extra_args=(), log_path=None, env=None, credentials=None, prefix=()):
        """`prefix`: a command that execs the server (taskset), so that the pid stays the server's."""
        self.credentials = credentials  # grpc.ChannelCredentials for a TLS server, else None
        self.log_path = log_path
        self._repository, self._extra_args, self._env = str(repository), list(extra_args), env
        self._prefix = list(prefix)
        self._log = subprocess.DEVNULL
        self._spawns_left = 3
        self._spawn()

    def _spawn(self):
        """Starts the process on ports the OS calls free. Between that and the server's bind
        another process's outgoing connection (or the server's own metrics endpoint on port 0)
        can take the port; wait_serving then starts it again on new ports (with a log to tell)."""
        self._spawns_left -= 1
        self.port = free_port()
        self.metrics_port = free_port()
        self.http_port = free_port()
        self.url = f"127.0.0.1:{self.port}"
        self.http_url = f"127.0.0.1:{self.http_port}"
        self._log = open(self.log_path, "w") if self.log_path else subprocess.DEVNULL
        self.args = [*self._prefix, SERVER, "--model-repository", self._repository, "--grpc-address", "127.0.0.1",
                     "--grpc-port", str(self.port), "--metrics-address", "127.0.0.1",
                     "--metrics-port", str(self.metrics_port), "--http-address", "127.0.0.1",
                     "--http-port", str(self.http_port), "--log-level", "debug", *self._extra_args]
        self.process = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT,
                                        env={**os.environ, **(self._env or {})})

    def _lost_port_race(self):
        if self.process.poll() is None or self._spawns_left == 0 or not self.log_path:
            return False
        log = self.log()
        return "cannot listen on" in log or "cannot serve metrics on" in log

    def log(self):
        if not self.log_path:
            return ""
        with open(self.log_path) as f:
            return f.read()

    def wait_serving(self, timeout=60.0, ready=True):
        """Waits until ServerLive answers (and ServerReady is true when `ready`)."""
        from tritonclient.grpc import service_pb2, service_pb2_grpc
        deadline = time.monotonic() + timeout
        channel = (grpc.secure_channel(self.url, self.credentials) if self.credentials
                   else grpc.insecure_channel(self.url))
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        try:
            while time.monotonic() < deadline:
                if self._lost_port_race():
                    self._log.close()
                    self._spawn()
                    channel.close()
                    channel = (grpc.secure_channel(self.url, self.credentials) if self.credentials
                               else grpc.insecure_channel(self.url))
                    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
                if self.process.poll() is not None:
                    raise RuntimeError(f"sluice-server exited with {self.process.returncode}:\n{self.log()}")
                try:
                    stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=1)
                    if not ready or stub.ServerReady(service_pb2.ServerReadyRequest(), timeout=1).ready:
                        return
                except grpc.RpcError:
                    pass
                time.sleep(0.1)
        finally:
            channel.close()
        raise TimeoutError(f"sluice-server not serving after {timeout}s:\n{self.log()}")

    def stop(self, timeout=30.0):
        """SIGTERM, then the exit code (0 for a clean shutdown)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._log is not subprocess.DEVNULL:
            self._log.close()
        return self.process.returncode


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


def write_bundled(root, names=None):
    """The bundled models/ configs `names` (default: all) with freshly generated weights in `root`."""
    import shutil
    names = names or [name for name in os.listdir(os.path.join(ROOT, "models"))
                      if os.path.exists(os.path.join(ROOT, "models", name, "config.pbtxt"))]
    for name in names:
        os.makedirs(root / name)
        shutil.copy(os.path.join(ROOT, "models", name, "config.pbtxt"), root / name / "config.pbtxt")
    subprocess.run([sys.executable, os.path.join(ROOT, "models", "generate_models.py"),
                    "--repository", str(root), "--models", *names], check=True, stdout=subprocess.DEVNULL)
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
    yield server
    code = server.stop()
    assert code == 0, f"sluice-server did not shut down cleanly ({code}):\n{server.log()}"


@pytest.fixture(scope="session")
def bundled_server(bundled_repository, tmp_path_factory):
    # Client shared memory on: perf_analyzer --shared-memory system registers its own regions.
    server = start_server(bundled_repository, tmp_path_factory, ["--allow-client-shm=true"])
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
