"""A CUDA device-side assert, end to end: a TorchScript model that looks a row up in a table by an
index taken from the request (`table[INDEX]`), beside a healthy model in the same server. A valid
index answers; INDEX=10**6 makes the indexing kernel fail its bounds assert on the GPU, which
leaves the CUDA context unusable for the rest of the process. Pass (on a GPU): that request fails
with INTERNAL and a message naming the CUDA (device-side) assert; the server then reports not live
over gRPC (ServerLive false) and HTTP (/v2/health/live not 200) with the reason in its log
(event=fatal_device_error); a request to the healthy model fails with an error within its client
timeout instead of hanging; and a new server process on the same repository becomes ready and
answers the healthy model and a valid lookup correctly. The old process's exit code is reported,
not judged (its context is poisoned). CPU dry run: out of range is an ordinary error on the CPU
(torch's RuntimeError "index ... is out of bounds"), so the request must fail with INTERNAL while
the server stays live and the healthy model keeps serving; the restart part is the same."""
# kit-timeout: 45
import os
import re
import shutil
import time
import urllib.error
import urllib.request

import numpy as np
import torch

import kitlib

ROWS, WIDTH = 16, 4
BAD_INDEX = 10**6
GOOD_INDEX = 3
# Every call has a client deadline well inside the step's 45 s cap: a hang reads as DEADLINE_EXCEEDED.
CALL_TIMEOUT_S = 8
GRACE_S = 3  # --shutdown-grace-seconds: the poisoned server gets this long to finish its calls


class Lookup(torch.nn.Module):
    """Row INDEX of a fixed table: an index past the table fails the kernel's bounds check."""

    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.arange(ROWS * WIDTH, dtype=torch.float32).reshape(ROWS, WIDTH))

    def forward(self, INDEX: torch.Tensor) -> torch.Tensor:
        return self.table[INDEX]


class Healthy(torch.nn.Module):
    def forward(self, INPUT__0: torch.Tensor) -> torch.Tensor:
        return INPUT__0 * 2.0 + 1.0


LOOKUP_CONFIG = f"""max_batch_size: 0
input [ {{ name: "INDEX" data_type: TYPE_INT64 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 1, {WIDTH} ] }} ]
instance_group [ {{ kind: KIND_GPU count: 1 }} ]
"""
HEALTHY_CONFIG = f"""max_batch_size: 8
input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ {WIDTH} ] }} ]
output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ {WIDTH} ] }} ]
instance_group [ {{ kind: KIND_GPU count: 1 }} ]
dynamic_batching {{ }}
"""


def outcome(call):
    """(code, message) of one call: "OK" and the answer's text, or the gRPC code and message."""
    from tritonclient.utils import InferenceServerException
    try:
        return "OK", call()
    except InferenceServerException as error:
        return str(error.status()).replace("StatusCode.", ""), error.message() or ""


def lookup(client, index):
    import tritonclient.grpc as grpcclient
    tensor = grpcclient.InferInput("INDEX", [1], "INT64")
    tensor.set_data_from_numpy(np.array([index], dtype=np.int64))
    answer = client.infer("lookup", [tensor], client_timeout=CALL_TIMEOUT_S).as_numpy("OUTPUT__0")
    return answer.tolist()


def healthy(client):
    import tritonclient.grpc as grpcclient
    data = np.arange(WIDTH, dtype=np.float32).reshape(1, WIDTH)
    tensor = grpcclient.InferInput("INPUT__0", [1, WIDTH], "FP32")
    tensor.set_data_from_numpy(data)
    answer = client.infer("healthy", [tensor], client_timeout=CALL_TIMEOUT_S).as_numpy("OUTPUT__0")
    return answer.tolist()


def http_live(server):
    """The HTTP status of GET /v2/health/live (or the connection error's text)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/v2/health/live",
                                    timeout=CALL_TIMEOUT_S) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError as error:
        return f"{type(error).__name__}: {error}"


def grpc_live(client, wait_for=None, within_s=0.0):
    """ServerLive, polled for up to `within_s` until it equals `wait_for` (the fatal error is
    recorded by the worker that saw it, which may answer the request first)."""
    from tritonclient.utils import InferenceServerException
    deadline = time.monotonic() + within_s
    while True:
        try:
            live = client.is_server_live(client_timeout=CALL_TIMEOUT_S)
        except InferenceServerException as error:
            live = f"error: {error.message()}"
        if live == wait_for or wait_for is None or time.monotonic() >= deadline:
            return live
        time.sleep(0.05)


def gist(message, markers):
    """The line of a (multi-line, TorchScript traceback) message that says what went wrong."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    for line in lines:
        if any(marker in line for marker in markers):
            return line[:160]
    return (lines[-1] if lines else "")[:160]


def body():
    import tritonclient.grpc as grpcclient
    from repository_helpers import write
    root = os.path.join(kitlib.WORK, "device_assert")
    shutil.rmtree(root, ignore_errors=True)
    write(root, "lookup", LOOKUP_CONFIG, torch.jit.script(Lookup()))
    write(root, "healthy", HEALTHY_CONFIG, torch.jit.script(Healthy()))
    want_row = [[float(GOOD_INDEX * WIDTH + i) for i in range(WIDTH)]]
    want_healthy = [[2.0 * i + 1.0 for i in range(WIDTH)]]
    # What a failed bounds check looks like: a device-side assert on the GPU (sticky, the server
    # is no longer live), an ordinary RuntimeError on the CPU (the server keeps serving).
    if kitlib.NO_GPU:
        bad_markers, live_after = ("out of bounds",), True
    else:
        bad_markers, live_after = ("device-side assert", "cudaErrorAssert", "CUDA error"), False
    args = ["--device", kitlib.device(), "--shutdown-grace-seconds", str(GRACE_S)]
    seen, failures = {}, []

    def record(key, value):
        seen[key] = value
        kitlib.write_result("fail", f"cut short after {key}", {"outcomes": seen, "failures": failures})

    server = kitlib.start_server(root, args, timeout=15)
    try:
        client = grpcclient.InferenceServerClient(url=server.url)
        record("lookup_valid_before", outcome(lambda: lookup(client, GOOD_INDEX)))
        record("healthy_before", outcome(lambda: healthy(client)))
        started = time.monotonic()
        record("lookup_out_of_range", outcome(lambda: lookup(client, BAD_INDEX)))
        seen["lookup_out_of_range_s"] = round(time.monotonic() - started, 3)
        record("grpc_live_after", grpc_live(client, wait_for=live_after, within_s=5))
        record("http_live_after", http_live(server))
        started = time.monotonic()
        record("healthy_after", outcome(lambda: healthy(client)))
        seen["healthy_after_s"] = round(time.monotonic() - started, 3)
        record("lookup_valid_after", outcome(lambda: lookup(client, GOOD_INDEX)))
        client.close()
    finally:
        stop_started = time.monotonic()
        first_exit = server.stop(timeout=GRACE_S + 10)
        seen["first_server_exit_code"] = first_exit
        seen["first_server_stop_s"] = round(time.monotonic() - stop_started, 2)
    log = server.log()
    fatal = re.search(r".*event=fatal_device_error model=(\w+) .*", log)
    record("fatal_log_line", fatal.group(0).strip() if fatal else None)

    # The restart: a new process on the same repository.
    started = time.monotonic()
    restarted = kitlib.start_server(root, args, name="server_restarted", timeout=15)
    try:
        seen["restart_ready_s"] = round(time.monotonic() - started, 2)
        client = grpcclient.InferenceServerClient(url=restarted.url)
        record("restarted_live", grpc_live(client))
        record("restarted_healthy", outcome(lambda: healthy(client)))
        record("restarted_lookup_valid", outcome(lambda: lookup(client, GOOD_INDEX)))
        client.close()
    finally:
        seen["restarted_exit_code"] = restarted.stop(timeout=GRACE_S + 10)

    # Judged against the expectations for this device.
    code, message = seen["lookup_out_of_range"]
    if code != "INTERNAL" or not any(marker in message for marker in bad_markers):
        failures.append(f"out-of-range lookup answered {code} {message[:200]!r}; expected INTERNAL naming "
                        f"{' or '.join(bad_markers)}")
    if seen["grpc_live_after"] is not live_after:
        failures.append(f"ServerLive after the failure is {seen['grpc_live_after']}, expected {live_after}")
    http_status = seen["http_live_after"]
    if (http_status == 200) != live_after or not isinstance(http_status, int):
        failures.append(f"/v2/health/live answered {http_status}, expected "
                        f"{'200' if live_after else 'a not-live status (400)'}")
    healthy_code = seen["healthy_after"][0]
    if live_after:
        if seen["healthy_after"] != ("OK", want_healthy):
            failures.append(f"healthy model after the failure: {seen['healthy_after']}")
        if seen["lookup_valid_after"] != ("OK", want_row):
            failures.append(f"valid lookup after the failure: {seen['lookup_valid_after']}")
        if fatal:
            failures.append(f"the log reports a fatal device error on the CPU: {fatal.group(0)[:200]}")
    else:
        if healthy_code in ("OK", "DEADLINE_EXCEEDED"):
            failures.append(f"healthy model after the assert answered {healthy_code} (expected a clean error: the "
                            "context is poisoned)" if healthy_code == "OK" else
                            f"healthy model after the assert hung past its {CALL_TIMEOUT_S} s client timeout")
        if not fatal:
            failures.append("no event=fatal_device_error line in the log")
    for key in ("lookup_valid_before", "restarted_lookup_valid"):
        if seen[key] != ("OK", want_row):
            failures.append(f"{key}: {seen[key]}")
    for key in ("healthy_before", "restarted_healthy"):
        if seen[key] != ("OK", want_healthy):
            failures.append(f"{key}: {seen[key]}")
    if seen["restarted_live"] is not True:
        failures.append(f"the restarted server is not live: {seen['restarted_live']}")
    if seen["restarted_exit_code"] != 0:
        failures.append(f"the restarted server exited {seen['restarted_exit_code']}")
    if kitlib.NO_GPU and seen["first_server_exit_code"] != 0:
        failures.append(f"the first server exited {seen['first_server_exit_code']}")

    numbers = {"outcomes": seen, "failures": failures, "device": kitlib.device()}
    rows = []
    for key, value in seen.items():
        if isinstance(value, tuple):
            rows.append([key, value[0], gist(str(value[1]), bad_markers)])
        else:
            rows.append([key, "", str(value)[:160].replace("\n", " ")])
    details = kitlib.table(["check", "code", "answer or value"], rows)
    if failures:
        return kitlib.gpu_outcome(False, "; ".join(failures)[:400], numbers, details)
    if kitlib.NO_GPU:
        summary = (f"out-of-range index answered INTERNAL ({gist(message, bad_markers)[:80]}), the server stayed "
                   "live and served both models; a new process served them after a restart (ready in "
                   f"{seen['restart_ready_s']} s)")
    else:
        summary = (f"device-side assert answered INTERNAL in {seen['lookup_out_of_range_s']} s; not live over gRPC "
                   f"and HTTP ({http_status}) with event=fatal_device_error; the healthy model then answered "
                   f"{healthy_code} in {seen['healthy_after_s']} s; the poisoned process exited "
                   f"{seen['first_server_exit_code']} in {seen['first_server_stop_s']} s (not judged); a new process "
                   f"was ready in {seen['restart_ready_s']} s and answered both models correctly")
    return kitlib.gpu_outcome(True, summary, numbers, details)


if __name__ == "__main__":
    kitlib.run_step(body)
