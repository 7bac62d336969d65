"""What orchestration needs from the server, proven on 127.0.0.1:
  - graceful drain on SIGTERM under load (readiness first, nothing accepted is lost, exit 0);
  - a real L7 load balancer (nginx grpc_pass with upstream keepalive) in front of 3 replicas:
    load spreads; draining one loses nothing when the balancer follows readiness (the test plays
    the endpoints controller: when the replica reports NOT_SERVING it reloads nginx without it,
    as ingress-nginx does when Kubernetes removes the endpoint); killing one loses at most what
    it held;
  - --grpc-max-connection-age-ms behind an L4 proxy (nginx stream): one long-lived pick_first
    channel lands on one replica without it, and spreads with it."""
import getpass
import os
import shutil
import signal
import subprocess
import threading
import time

import grpc
import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
from conftest import ServerProcess, free_port
from grpc_health.v1 import health_pb2, health_pb2_grpc
from torch import nn
from tritonclient.utils import InferenceServerException

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
STREAM_MODULE = "/usr/lib/nginx/modules/ngx_stream_module.so"


class Work(nn.Module):
    """OUTPUT__0 = INPUT__0 * 2 after about 5 ms of work on one thread."""

    def forward(self, INPUT__0: torch.Tensor) -> torch.Tensor:
        w = torch.full([64, 64], 0.01)
        x = INPUT__0
        for _ in range(60):
            x = torch.tanh(x @ w) + 0.5
        return INPUT__0 * 2.0 + x * 0.0


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    root = tmp_path_factory.mktemp("orchestration")
    os.makedirs(root / "work" / "1")
    (root / "work" / "config.pbtxt").write_text(
        'max_batch_size: 8\n'
        'input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 64 ] } ]\n'
        'output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 64 ] } ]\n'
        'instance_group [ { kind: KIND_CPU count: 1 } ]\n'
        'dynamic_batching { }\n'
        'parameters { key: "INTRA_OP_THREAD_COUNT" value { string_value: "1" } }\n')
    torch.jit.script(Work()).save(str(root / "work" / "1" / "model.pt"))
    return root


def start_replicas(repository, tmp_path, count, extra=()):
    replicas = [ServerProcess(repository, ["--device", "cpu", *extra],
                              log_path=str(tmp_path / f"replica{i}.log")) for i in range(count)]
    try:
        for replica in replicas:
            replica.wait_serving()
    except Exception:
        for replica in replicas:
            replica.stop()
        raise
    return replicas


def infer(client, value):
    data = np.full((1, 64), value, dtype=np.float32)
    inputs = [grpcclient.InferInput("INPUT__0", [1, 64], "FP32")]
    inputs[0].set_data_from_numpy(data)
    result = client.infer("work", inputs, client_timeout=30)
    assert np.allclose(result.as_numpy("OUTPUT__0"), value * 2.0)


def succeeded(replica):
    """Requests this replica answered successfully (its own statistics)."""
    client = grpcclient.InferenceServerClient(replica.url)
    try:
        stats = client.get_inference_statistics("work", as_json=True)["model_stats"]
        return sum(int(s["inference_stats"]["success"].get("count", 0)) for s in stats)
    finally:
        client.close()


class Load:
    """`clients` threads sending requests through `url` until stopped; counts outcomes."""

    def __init__(self, url, clients=4):
        self.url = url
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self.ok = 0
        self.failures = []  # (time, status, message)
        self.threads = [threading.Thread(target=self._run, args=(i,)) for i in range(clients)]
        for thread in self.threads:
            thread.start()

    def _run(self, i):
        client = grpcclient.InferenceServerClient(self.url)
        value = 0.0
        while not self.stop_event.is_set():
            value += 1.0
            try:
                infer(client, value)
                with self.lock:
                    self.ok += 1
            except InferenceServerException as error:
                with self.lock:
                    self.failures.append((time.monotonic(), error.status(), error.message()))
                time.sleep(0.01)
        client.close()

    def stop(self):
        self.stop_event.set()
        for thread in self.threads:
            thread.join()


class Nginx:
    """nginx in the foreground with its master process (so that it can reload its config)."""

    def __init__(self, directory, config):
        self.directory = directory
        os.makedirs(directory / "logs", exist_ok=True)
        (directory / "nginx.conf").write_text(config)
        self.process = subprocess.Popen([NGINX, "-p", str(directory), "-c", str(directory / "nginx.conf"),
                                         "-e", str(directory / "logs" / "error.log")],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        time.sleep(0.5)
        assert self.process.poll() is None, (directory / "logs" / "error.log").read_text()

    def reload(self, config):
        """New config; the old worker finishes what it holds (SIGHUP, as nginx -s reload)."""
        (self.directory / "nginx.conf").write_text(config)
        self.process.send_signal(signal.SIGHUP)
        time.sleep(0.5)

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=30)


def prologue(directory):
    """What both nginx configs start with: foreground, this user, one worker."""
    return (f"daemon off;\nuser {getpass.getuser()};\nworker_processes 1;\npid {directory}/nginx.pid;\n"
            "events { worker_connections 1024; }\n")


def l7_config(directory, port, replicas):
    servers = "\n".join(f"    server {r.url} max_fails=1 fail_timeout=2s;" for r in replicas)
    return prologue(directory) + f"""
http {{
  access_log off;
  client_body_temp_path {directory}/body;
  upstream sluice {{
{servers}
    keepalive 32;
  }}
  server {{
    listen 127.0.0.1:{port} http2;
    location / {{
      grpc_pass grpc://sluice;
      grpc_read_timeout 60s;
      # A replica that is draining or gone refuses the connection or the stream: try the next.
      grpc_next_upstream error timeout non_idempotent;
      grpc_next_upstream_tries 3;
    }}
  }}
}}
"""


def l4_nginx(directory, port, replicas):
    servers = "\n".join(f"    server {r.url};" for r in replicas)
    return Nginx(directory, f"load_module {STREAM_MODULE};\n" + prologue(directory) + f"""
stream {{
  upstream sluice {{
{servers}
  }}
  server {{
    listen 127.0.0.1:{port};
    proxy_pass sluice;
  }}
}}
""")


def health(url, service):
    channel = grpc.insecure_channel(url)
    try:
        return health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=1).status
    except grpc.RpcError:
        return None
    finally:
        channel.close()


def test_drain_on_sigterm_loses_nothing_accepted(repository, tmp_path):
    (server,) = start_replicas(repository, tmp_path, 1,
                               ["--shutdown-delay-seconds", "1", "--shutdown-grace-seconds", "20"])
    load = Load(server.url, clients=4)
    # A burst queued behind the running batch when the signal lands: every one must be answered.
    burst_client = grpcclient.InferenceServerClient(server.url)
    burst = []
    burst_done = threading.Event()

    def on_answer(result, error):
        burst.append(error)
        if len(burst) == 32:
            burst_done.set()
    try:
        time.sleep(1.0)
        for i in range(32):
            inputs = [grpcclient.InferInput("INPUT__0", [1, 64], "FP32")]
            inputs[0].set_data_from_numpy(np.full((1, 64), float(i), dtype=np.float32))
            burst_client.async_infer("work", inputs, on_answer, client_timeout=30)
        sent = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        # The signal is taken asynchronously: on a loaded machine the first check can reach the
        # server before its main thread has woken from sigwait. Readiness must turn within 1 s.
        ready_after = health(server.url, "ready")
        while ready_after != health_pb2.HealthCheckResponse.NOT_SERVING and time.monotonic() - sent < 1.0:
            time.sleep(0.01)
            ready_after = health(server.url, "ready")
        not_ready_seen = time.monotonic() - sent
        live_after = health(server.url, "live")
        time.sleep(0.5)
        ok_in_delay = load.ok
        time.sleep(0.4)
        served_during_delay = load.ok - ok_in_delay
        assert burst_done.wait(30)
        code = server.process.wait(timeout=30)
        stopped = time.monotonic() - sent
    finally:
        load.stop()
        burst_client.close()
        server.stop()
    log = server.log()
    assert code == 0, log
    assert ready_after == health_pb2.HealthCheckResponse.NOT_SERVING, log
    assert live_after == health_pb2.HealthCheckResponse.SERVING
    assert not_ready_seen < 1.0
    assert served_during_delay > 0, "new calls must be served during --shutdown-delay-seconds"
    assert burst == [None] * 32, burst
    # After the delay new calls are refused, and none fails after being accepted. Refused calls
    # get UNAVAILABLE (connection refused, GOAWAY), or CANCELLED for the few that reached the
    # server's transport but no handler as the shutdown began (gRPC core's behaviour,
    # grpc/grpc#41785; a client that sent them before it saw the GOAWAY cannot tell). The log
    # (debug level) names every request a handler accepted and did not answer with success.
    for _, status, message in load.failures:
        assert status in ("StatusCode.UNAVAILABLE", "StatusCode.CANCELLED"), (status, message)
        assert "did not run" not in message, message
    assert "event=infer_failed" not in log and "event=request_rejected" not in log
    assert stopped < 1 + 20 + 5
    print(f"drain: not ready after {not_ready_seen * 1000:.0f} ms; {served_during_delay} served in the "
          f"delay; 32/32 queued answered; exit 0 after {stopped:.1f} s; {load.ok} ok, "
          f"{len(load.failures)} refused after the delay")


def test_l7_nginx_spreads_load_and_survives_drain_and_kill(repository, tmp_path):
    replicas = start_replicas(repository, tmp_path, 3, ["--shutdown-delay-seconds", "2"])
    port = free_port()
    directory = tmp_path / "nginx-l7"
    nginx = Nginx(directory, l7_config(directory, port, replicas))
    url = f"127.0.0.1:{port}"
    try:
        load = Load(url, clients=6)
        time.sleep(2.0)
        spread = [succeeded(r) for r in replicas]
        assert all(count > 0 for count in spread), spread

        # Drain replica 0 mid-load: it turns NOT_SERVING at once and keeps serving for its
        # delay; the balancer, following readiness, drops it in that time. Zero failures.
        before = load.ok
        replicas[0].process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 2
        while health(replicas[0].url, "ready") == health_pb2.HealthCheckResponse.SERVING:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        nginx.reload(l7_config(directory, port, replicas[1:]))
        assert replicas[0].process.wait(timeout=30) == 0, replicas[0].log()
        time.sleep(1.0)
        drain_failures = list(load.failures)
        assert drain_failures == [], drain_failures
        assert load.ok > before

        # Kill replica 1 mid-load: what it held fails, nothing else; the rest keep serving.
        error_log = directory / "logs" / "error.log"
        logged_before = len(error_log.read_text().splitlines())
        replicas[1].process.send_signal(signal.SIGKILL)
        replicas[1].process.wait(timeout=30)
        killed_at = time.monotonic()
        time.sleep(2.0)
        after_kill = load.ok
        time.sleep(1.0)
        load.stop()
        kill_failures = [f for f in load.failures if f[0] >= killed_at - 0.5]
        # What the replica held: the calls nginx had sent it and lost with the connection, from
        # nginx's own error log. Each client has one call in flight at most.
        errors = error_log.read_text().splitlines()[logged_before:]
        held = [line for line in errors if "while reading response header from upstream" in line]
        assert held and all(f"grpc://{replicas[1].url}" in line for line in held), held
        assert 0 < len(kill_failures) <= len(held) <= 6, (kill_failures, held)
        assert load.ok > after_kill, "replica 2 must keep serving"
        late = [f for f in kill_failures if f[0] > killed_at + 1.0]
        assert late == [], late
    finally:
        load.stop()
        nginx.stop()
        for replica in replicas:
            replica.stop()
    print(f"L7: spread {spread}; drain: 0 failed; kill: {len(kill_failures)} failed, the killed replica "
          f"held {len(held)} (nginx error log); "
          f"{load.ok} ok in all")


def pick_first_calls(url, seconds):
    """One long-lived channel (tritonclient's default pick_first), calls for `seconds`."""
    client = grpcclient.InferenceServerClient(url)
    failures = 0
    deadline = time.monotonic() + seconds
    value = 0.0
    while time.monotonic() < deadline:
        value += 1.0
        try:
            infer(client, value)
        except InferenceServerException:
            failures += 1
        time.sleep(0.005)
    client.close()
    return failures


def test_max_connection_age_spreads_one_channel_behind_an_l4_proxy(repository, tmp_path):
    results = {}
    for flag in ("off", "on"):
        extra = ["--grpc-max-connection-age-ms", "300", "--grpc-max-connection-age-grace-ms", "5000"] \
            if flag == "on" else []
        (tmp_path / flag).mkdir()
        replicas = start_replicas(repository, tmp_path / flag, 3, extra)
        port = free_port()
        nginx = l4_nginx(tmp_path / f"nginx-l4-{flag}", port, replicas)
        try:
            failures = pick_first_calls(f"127.0.0.1:{port}", 3.0)
            results[flag] = ([succeeded(r) for r in replicas], failures)
        finally:
            nginx.stop()
            for replica in replicas:
                replica.stop()
    off, off_failures = results["off"]
    on, on_failures = results["on"]
    print(f"L4, one pick_first channel: without max age {off}, with 300 ms max age {on}; "
          f"failures {off_failures}/{on_failures}")
    assert off_failures == 0 and on_failures == 0
    assert sorted(count > 0 for count in off) == [False, False, True], off
    assert sum(count > 0 for count in on) >= 2, on
