"""A real sluice-server on free loopback ports, for tests, benchmarks and the GPU kit: the one copy
of choosing ports, starting it again when it lost a port race, waiting until it serves, and
stopping it.

    server = SluiceServer("build/bin/sluice-server", "models", ["--device", "cpu"], log_path="s.log")
    with server:                       # start(): serving (and ready) when it returns
        stub_or_client(server.url)     # host:port of gRPC; server.http_url, server.metrics_port
    # stopped: SIGTERM, then SIGKILL after `stop_timeout`; server.process.returncode
"""
import os
import signal
import socket
import subprocess
import time

FREE = "free"  # a port option: pick one the OS calls free now, on 127.0.0.1


def free_port():
    """A port the OS says is free on loopback (bound, then released for the server to take)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metric_value(text, series):
    """The value of one series in a Prometheus exposition (`series` exactly as exposed:
    'name{label="x",...}' or a bare name), or None when it is absent."""
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def lost_port_race(log):
    """Whether a server's log (its text) says its port was taken between free_port() and its bind
    (another process's outgoing connection, or its own metrics endpoint on port 0, can get the
    port the OS just called free): worth new ports, not a failure."""
    return "cannot listen on" in log or "cannot serve metrics on" in log


class SluiceServer:
    """One sluice-server process. `metrics_port` and `http_port`: FREE (a free port on 127.0.0.1,
    in `metrics_port` / `http_port` / `http_url`), 0 (the server picks one; its log names it) or
    None (no flag: the server's default; for HTTP, pass --allow-http false in `extra_args` or
    run a binary without HTTP). `prefix`: a command that execs the server (taskset, valgrind), so
    that the pid stays the server's. `credentials`: grpc.ChannelCredentials for a TLS server.
    `new_session`: its own process group (a Ctrl-C at the terminal reaches only the caller)."""

    def __init__(self, binary, repository, extra_args=(), *, log_path=None, env=None, credentials=None,
                 prefix=(), log_level="debug", metrics_port=FREE, http_port=FREE, new_session=False,
                 attempts=3, stop_timeout=60.0):
        self.binary, self.repository = binary, str(repository)
        self.extra_args, self.prefix = list(extra_args), list(prefix)
        self.log_path, self.credentials, self.log_level = log_path, credentials, log_level
        self._env, self._new_session = env, new_session
        self._metrics_option, self._http_option = metrics_port, http_port
        self._spawns_left = attempts
        self.stop_timeout = stop_timeout
        self._log = subprocess.DEVNULL
        self.process = None
        self.ready_s = None  # seconds from the (last) spawn to serving, once wait_serving returned

    @staticmethod
    def _port(option):
        return free_port() if option == FREE else option

    def spawn(self):
        """Starts the process on ports the OS calls free now (it does not wait)."""
        self._spawns_left -= 1
        self.port = free_port()
        self.metrics_port = self._port(self._metrics_option)
        self.http_port = self._port(self._http_option)
        self.url = f"127.0.0.1:{self.port}"
        self.http_url = f"127.0.0.1:{self.http_port}" if self._http_option == FREE else None
        ports = ["--grpc-address", "127.0.0.1", "--grpc-port", str(self.port)]
        for name, option, port in (("metrics", self._metrics_option, self.metrics_port),
                                   ("http", self._http_option, self.http_port)):
            if option == FREE:
                ports += [f"--{name}-address", "127.0.0.1", f"--{name}-port", str(port)]
            elif option is not None:
                ports += [f"--{name}-port", str(port)]
        self.args = [*self.prefix, self.binary, "--model-repository", self.repository, *ports,
                     "--log-level", self.log_level, *self.extra_args]
        self._log = open(self.log_path, "w") if self.log_path else subprocess.DEVNULL
        self._spawned_at = time.monotonic()
        self.process = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT,
                                        env={**os.environ, **(self._env or {})},
                                        start_new_session=self._new_session)
        return self

    def log(self):
        """The server's log so far ("" without a log file)."""
        if not self.log_path:
            return ""
        try:
            with open(self.log_path) as f:
                return f.read()
        except OSError:
            return ""

    def metrics_text(self, timeout=10):
        """The Prometheus exposition of the server's metrics endpoint now."""
        import urllib.request
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=timeout) as response:
            assert response.status == 200
            return response.read().decode()

    def _channel(self):
        import grpc
        return (grpc.secure_channel(self.url, self.credentials) if self.credentials
                else grpc.insecure_channel(self.url))

    def _lost_port_race(self):
        return (self.process.poll() is not None and self._spawns_left > 0 and bool(self.log_path)
                and lost_port_race(self.log()))

    def wait_serving(self, timeout=60.0, ready=True):
        """Waits until ServerLive answers (and ServerReady is true when `ready`); a server that lost
        a port race is started again on new ports. RuntimeError when it exits, TimeoutError after
        `timeout` seconds; either way the process is left as it is (stop() it)."""
        import grpc
        from tritonclient.grpc import service_pb2, service_pb2_grpc
        deadline = time.monotonic() + timeout
        channel = self._channel()
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        try:
            while time.monotonic() < deadline:
                if self._lost_port_race():
                    self._close_log()
                    self.spawn()
                    channel.close()
                    channel = self._channel()
                    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
                if self.process.poll() is not None:
                    raise RuntimeError(f"{' '.join(self.args)}\nexited with {self.process.returncode}; its log "
                                       f"({self.log_path}):\n{self.log()}")
                try:
                    stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=1)
                    if not ready or stub.ServerReady(service_pb2.ServerReadyRequest(), timeout=1).ready:
                        self.ready_s = time.monotonic() - self._spawned_at
                        return self
                except grpc.RpcError:
                    pass
                time.sleep(0.1)
        finally:
            channel.close()
        raise TimeoutError(f"{' '.join(self.args)}\nnot serving after {timeout:.0f} s; its log "
                           f"({self.log_path}):\n{self.log()}")

    def start(self, timeout=60.0, ready=True):
        """spawn() and wait_serving(); stopped again when it does not serve."""
        if self.process is None:
            self.spawn()
        try:
            return self.wait_serving(timeout, ready)
        except BaseException:
            self.stop()
            raise

    def stop(self, timeout=None):
        """SIGTERM, SIGKILL after `timeout` (default `stop_timeout`) seconds, then the exit code
        (0 for a clean shutdown; None when it never started)."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=self.stop_timeout if timeout is None else timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._close_log()
        return self.process.returncode

    def _close_log(self):
        if self._log is not subprocess.DEVNULL and not self._log.closed:
            self._log.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False
