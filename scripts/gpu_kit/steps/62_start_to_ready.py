"""Start to ready, as a `docker run --gpus all` user meets it: the time from starting the
sluice-server process to gRPC ServerLive, and to ServerReady with the model ready, for ResNet-50
FP16 with cuDNN benchmark mode on and preferred batch sizes {1, 8, 32, 64} padded, so that
warm-up runs (and cudnnFind times) every shape before ready. Also the first answer after ready,
and the warm-up and load times from the server's log (event=warmup ... warmup_ms=N,
event=model_ready ... load_ms=N). Pass: ready within the container image's HEALTHCHECK start
period (docker/Dockerfile, --start-period), which is when `docker ps` starts counting failed
health checks. The CPU dry run does the same with ResNet-18 at 32x32 and batch sizes {1, 2}."""
# kit-timeout: 45
import os
import re
import shutil
import time

import numpy as np

import kitlib
from harness.server import lost_port_race

# The image's HEALTHCHECK start period when its Dockerfile is not at hand (the kit carries no
# docker/ folder): docker/Dockerfile says --start-period=120s.
DEFAULT_START_PERIOD_S = 120.0
CAP_S = 45  # the kit-timeout above
# How long the server may take to be ready: below the cap, less what writing the model took and
# 7 s for the first answer and the stop, so that a slow start is reported by the step, not cut
# off by the cap.
READY_DEADLINE_S = 38.0
POLL_S = 0.05


def start_period():
    """(seconds, where it came from): the Dockerfile's HEALTHCHECK --start-period, if found."""
    here = os.path.dirname(os.path.abspath(kitlib.__file__))
    for path in (os.path.join(kitlib.KIT, "src", "docker", "Dockerfile"),
                 os.path.join(here, "..", "..", "docker", "Dockerfile")):
        if not os.path.exists(path):
            continue
        with open(path) as f:
            match = re.search(r"HEALTHCHECK[^\n]*--start-period=(\d+(?:\.\d+)?)(ms|s|m)?", f.read())
        if match:
            scale = {"ms": 1e-3, "s": 1.0, "m": 60.0, None: 1.0}[match.group(2)]
            return float(match.group(1)) * scale, os.path.normpath(path)
    return DEFAULT_START_PERIOD_S, "docker/Dockerfile's --start-period=120s (hard-coded: no Dockerfile in the kit)"


def timed_start(root, model, deadline_s):
    """Starts the server and polls it: {live_s, ready_s} from process start (None if not reached).
    A server that lost the port race (another process took its port) is started again, once."""
    import grpc
    from conftest import ServerProcess
    from tritonclient.grpc import service_pb2, service_pb2_grpc
    for attempt in range(2):
        started = time.monotonic()
        server = ServerProcess(root, ["--device", kitlib.device()], log_path=kitlib.step_path("server.log"))
        channel = grpc.insecure_channel(server.url)
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        times = {"live_s": None, "ready_s": None}
        try:
            while time.monotonic() - started < deadline_s and server.process.poll() is None:
                try:
                    if times["live_s"] is None:
                        stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=1)
                        times["live_s"] = time.monotonic() - started
                    if (stub.ServerReady(service_pb2.ServerReadyRequest(), timeout=1).ready
                            and stub.ModelReady(service_pb2.ModelReadyRequest(name=model), timeout=1).ready):
                        times["ready_s"] = time.monotonic() - started
                        return server, times
                except grpc.RpcError:
                    pass
                time.sleep(POLL_S)
        finally:
            channel.close()
        log = server.log()
        if server.process.poll() is not None and attempt == 0 and lost_port_race(log):
            server.stop()
            continue
        return server, times
    raise AssertionError("unreachable")


def body():
    import tritonclient.grpc as grpcclient
    step_started = time.monotonic()
    arch, side, sizes, _ = kitlib.resnet_geometry()
    name = f"{arch}_fp16" if not kitlib.NO_GPU else f"{arch}_fp32"
    dtype = "fp32" if kitlib.NO_GPU else "fp16"
    root = os.path.join(kitlib.WORK, "start_to_ready")
    shutil.rmtree(root, ignore_errors=True)
    kitlib.write_resnet(root, name, dtype, sizes, "on")
    period, period_source = start_period()
    numbers = {"model": name, "dtype": dtype, "batch_sizes": list(sizes), "cudnn_benchmark": "on",
               "start_period_s": period, "start_period_source": period_source,
               "model_written_s": round(time.monotonic() - step_started, 2)}
    kitlib.write_result("fail", "cut short while starting the server", numbers)

    deadline = min(READY_DEADLINE_S, CAP_S - 7 - (time.monotonic() - step_started))
    server, times = timed_start(root, name, deadline)
    numbers.update({key: None if value is None else round(value, 3) for key, value in times.items()})
    kitlib.write_result("fail", "cut short after the start", numbers)
    first_answer_ms = None
    exited_early = server.process.poll()
    try:
        if times["ready_s"] is not None:
            client = grpcclient.InferenceServerClient(url=server.url)
            data = np.random.default_rng(0).standard_normal((1, 3, side, side)).astype(
                np.float16 if dtype == "fp16" else np.float32)
            tensor = grpcclient.InferInput("INPUT__0", list(data.shape), "FP16" if dtype == "fp16" else "FP32")
            tensor.set_data_from_numpy(data)
            started = time.perf_counter()
            client.infer(name, [tensor], client_timeout=10)
            first_answer_ms = (time.perf_counter() - started) * 1e3
            client.close()
    finally:
        code = server.stop(timeout=10)
    log = server.log()
    warmup = re.search(rf"event=warmup model={name} version=1 .*warmup_ms=(\d+)", log)
    loaded = re.search(rf"event=model_ready model={name} version=1 .*load_ms=(\d+)", log)
    benchmark = re.search(rf"event=cudnn_benchmark model={name} version=1 .*", log)
    numbers.update({"first_answer_ms": None if first_answer_ms is None else round(first_answer_ms, 1),
                    "warmup_ms": int(warmup.group(1)) if warmup else None,
                    "load_ms": int(loaded.group(1)) if loaded else None,
                    "warmup_line": warmup.group(0) if warmup else None,
                    "cudnn_benchmark_line": benchmark.group(0) if benchmark else None,
                    "exit_code": code})
    rows = [["process start to live (gRPC ServerLive)", fmt(numbers["live_s"], "s")],
            ["process start to ready (ServerReady and ModelReady)", fmt(numbers["ready_s"], "s")],
            ["model load, warm-up included (load_ms)", fmt(numbers["load_ms"], "ms")],
            ["warm-up of every shape (warmup_ms)", fmt(numbers["warmup_ms"], "ms")],
            ["first answer after ready", fmt(numbers["first_answer_ms"], "ms")],
            ["HEALTHCHECK start period", f"{period:g} s ({period_source})"]]
    details = (kitlib.table(["what", "time"], rows) + "\n\nLog lines:\n\n```\n"
               + "\n".join(line for line in (numbers["cudnn_benchmark_line"], numbers["warmup_line"]) if line)
               + "\n```")
    failures = []
    if times["ready_s"] is None:
        failures.append(f"not ready {deadline:.0f} s after start (the step's own limit, below its cap; "
                        f"the start period is {period:g} s)"
                        + ("" if exited_early is None else f"; the server had exited {exited_early}"))
    elif times["ready_s"] > period:
        failures.append(f"ready after {times['ready_s']:.1f} s, past the {period:g} s start period")
    if warmup is None:
        failures.append("no event=warmup line in the log")
    if code != 0:
        failures.append(f"the server exited {code}")
    if failures:
        return kitlib.gpu_outcome(False, "; ".join(failures)[:400], numbers, details)
    return kitlib.gpu_outcome(
        True, f"{name} (batch sizes {{{', '.join(map(str, sizes))}}}, cuDNN benchmark on): live {times['live_s']:.1f} s, "
              f"ready {times['ready_s']:.1f} s after start (warm-up {numbers['warmup_ms']} ms, first answer "
              f"{first_answer_ms:.0f} ms) against a {period:g} s start period", numbers, details)


def fmt(value, unit):
    return "n/a" if value is None else f"{value:g} {unit}"


if __name__ == "__main__":
    kitlib.run_step(body)
