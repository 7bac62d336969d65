"""Start-up, readiness rules and shutdown of the real sluice-server process."""
import signal
import subprocess

import grpc
import pytest
import torch
import tritonclient.grpc as grpcclient
from conftest import SERVER, ServerProcess, start_server
from grpc_health.v1 import health_pb2, health_pb2_grpc

HAS_GPU = torch.cuda.is_available()


def health_status(url, service):
    with grpc.insecure_channel(url) as channel:
        return health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=5).status


def test_strict_readiness_broken_model_makes_server_not_ready_but_live(test_repository, tmp_path_factory):
    server = start_server(test_repository, tmp_path_factory, ["--device", "cpu"], ready=False)
    try:
        client = grpcclient.InferenceServerClient(url=server.url)
        # Wait for loading to finish: the good models become ready one after another.
        import time
        deadline = time.monotonic() + 60
        while not client.is_model_ready("versioned") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert client.is_server_live()
        assert not client.is_server_ready()
        assert health_status(server.url, "live") == health_pb2.HealthCheckResponse.SERVING
        assert health_status(server.url, "ready") == health_pb2.HealthCheckResponse.NOT_SERVING
        assert health_status(server.url, "") == health_pb2.HealthCheckResponse.NOT_SERVING
        assert client.is_model_ready("dtype_fp32")  # the good models serve all the same
        client.close()
    finally:
        assert server.stop() == 0, server.log()


def test_strict_readiness_all_good_models_ready(bundled_server):
    client = grpcclient.InferenceServerClient(url=bundled_server.url)
    assert client.is_server_ready()
    assert health_status(bundled_server.url, "") == health_pb2.HealthCheckResponse.SERVING
    client.close()


def test_missing_repository_fails_at_start(tmp_path):
    result = subprocess.run([SERVER, "--model-repository", str(tmp_path / "absent"), "--grpc-port", "0", "--http-port", "0"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "is not a directory (check --model-repository)" in result.stdout + result.stderr


def test_bad_flag_value_is_refused():
    result = subprocess.run([SERVER, "--device", "tpu"], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "--device" in result.stdout + result.stderr


def test_help_documents_every_flag():
    result = subprocess.run([SERVER, "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    for flag in ("--model-repository", "--grpc-port", "--metrics-port", "--strict-readiness",
                 "--grpc-max-message-bytes", "--device", "--log-level", "--allow-metrics",
                 "--metrics-address", "--metrics-interval-ms", "--cudnn-benchmark", "--cudnn-deterministic",
                 "--allow-tf32", "--warmup", "--print-env", "--model-control-mode", "--load-model",
                 "--repository-poll-secs", "--shutdown-delay-seconds", "--shutdown-grace-seconds",
                 "--grpc-max-connection-age-ms", "--grpc-max-connection-age-grace-ms",
                 "--grpc-max-connection-idle-ms", "--grpc-keepalive-time", "--grpc-keepalive-timeout",
                 "--grpc-keepalive-permit-without-calls", "--grpc-http2-max-pings-without-data",
                 "--grpc-http2-min-recv-ping-interval-without-data", "--grpc-http2-max-ping-strikes"):
        assert flag in result.stdout, flag


@pytest.mark.skipif(HAS_GPU, reason="this machine has a GPU; the failure path needs none")
def test_device_cuda_without_gpu_fails_at_start(bundled_repository):
    result = subprocess.run([SERVER, "--model-repository", str(bundled_repository), "--grpc-port", "0", "--http-port", "0",
                             "--device", "cuda"], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "no CUDA GPU is usable" in result.stdout + result.stderr


def test_device_auto_falls_back_to_cpu_with_warning(bundled_server):
    log = bundled_server.log()
    if HAS_GPU:
        assert "device=cuda:0" in log
    else:
        assert "event=device_fallback model=mlp" in log
        assert "event=model_ready model=mlp version=1 device=cpu" in log
    assert "event=runtime sluice=" in log and "libtorch=2.11.0" in log


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_clean_shutdown_on_signal(bundled_repository, tmp_path, sig):
    server = ServerProcess(bundled_repository, log_path=str(tmp_path / "log"))
    server.wait_serving()
    server.process.send_signal(sig)
    assert server.process.wait(timeout=30) == 0
    assert "event=stopped" in server.log()


def test_port_in_use_fails_with_clear_message(bundled_server, bundled_repository):
    result = subprocess.run([SERVER, "--model-repository", str(bundled_repository),
                             "--grpc-address", "127.0.0.1", "--grpc-port", str(bundled_server.port),
                             "--metrics-port", "0"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "cannot listen on" in result.stdout + result.stderr
