"""HTTP/REST inference on the GPU: the bundled MLP with dynamic batching served on --device cuda,
asked over the KServe v2 REST API (POST /v2/models/mlp/infer) from a few threads at once, half the
requests in JSON (data as a flat list) and half in Triton's binary tensor extension (a JSON header
of Inference-Header-Content-Length bytes, the input's binary_data_size parameter, the output asked
for with binary_data and read back from after the header). Every answer is compared with the same
model.pt run by torch on the same device, within the FP32 tolerance. Then a malformed body must get
400 and the next request must still be answered. Pass: every answer within tolerance, the 400, and
serving after it. Reports requests, p50 and p99 per encoding, and rows per execution (batching
across HTTP requests). CPU dry run: the same on the CPU with fewer requests. The client is urllib
(tritonclient.http needs geventhttpclient, which a bare GPU machine may lack)."""
# kit-timeout: 45
import concurrent.futures
import json
import os
import shutil
import time
import urllib.error
import urllib.request

import numpy as np
import torch

import kitlib

FEATURES = 784
REQUEST_TIMEOUT_S = 10  # per HTTP request, well inside the step's cap


def post(port, body, headers):
    """(status, response headers, body bytes) of one POST to the mlp's infer endpoint."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/mlp/infer", data=body, method="POST",
                                     headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def infer_json(port, data):
    body = json.dumps({"inputs": [{"name": "INPUT__0", "shape": list(data.shape), "datatype": "FP32",
                                   "data": data.ravel().tolist()}],
                       "outputs": [{"name": "OUTPUT__0"}]}).encode()
    status, _, answer = post(port, body, {"Content-Type": "application/json"})
    if status != 200:
        raise RuntimeError(f"HTTP {status}: {answer[:300]!r}")
    output = json.loads(answer)["outputs"][0]
    return np.asarray(output["data"], dtype=np.float32).reshape(output["shape"])


def infer_binary(port, data):
    payload = np.ascontiguousarray(data, dtype=np.float32).tobytes()
    header = json.dumps({"inputs": [{"name": "INPUT__0", "shape": list(data.shape), "datatype": "FP32",
                                     "parameters": {"binary_data_size": len(payload)}}],
                         "outputs": [{"name": "OUTPUT__0", "parameters": {"binary_data": True}}]}).encode()
    status, headers, answer = post(port, header + payload, {
        "Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(header))})
    if status != 200:
        raise RuntimeError(f"HTTP {status}: {answer[:300]!r}")
    length = int(headers["Inference-Header-Content-Length"])
    output = json.loads(answer[:length])["outputs"][0]
    size = output["parameters"]["binary_data_size"]
    if len(answer) - length != size:
        raise RuntimeError(f"binary_data_size {size} but {len(answer) - length} bytes follow the header")
    return np.frombuffer(answer[length:], dtype=np.float32).reshape(output["shape"])


ENCODINGS = {"json": infer_json, "binary": infer_binary}


def body():
    root = os.path.join(kitlib.WORK, "http_gpu")
    shutil.rmtree(root, ignore_errors=True)
    kitlib.write_bundled(root, ["mlp"], "dynamic_batching { }")
    threads, per_encoding = (2, 12) if kitlib.NO_GPU else (6, 120)
    rng = np.random.default_rng(5)
    jobs = [(encoding, rng.standard_normal((1 + i % 2, FEATURES)).astype(np.float32))
            for i in range(per_encoding) for encoding in ENCODINGS]
    numbers, failures = {"device": kitlib.device(), "threads": threads, "requests": len(jobs)}, []

    server = kitlib.start_server(root, ["--device", kitlib.device()], timeout=30)
    try:
        before = kitlib.model_statistics(server.url, "mlp")

        def one(job):
            encoding, data = job
            started = time.perf_counter()
            try:
                return ENCODINGS[encoding](server.http_port, data), (time.perf_counter() - started) * 1e6, None
            except Exception as error:  # noqa: BLE001 - each request's failure is counted, not raised
                return None, (time.perf_counter() - started) * 1e6, f"{type(error).__name__}: {error}"[:300]

        started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            results = list(pool.map(one, jobs))
        numbers["load_s"] = round(time.monotonic() - started, 3)
        delta = kitlib.statistics_delta(kitlib.model_statistics(server.url, "mlp"), before)
        numbers["rows_per_execution"] = delta["inferences"] / max(delta["executions"], 1)
        numbers["executed_batch_sizes"] = delta["batch_sizes"]
        kitlib.write_result("fail", "cut short after the load", numbers)

        malformed_status, _, malformed_answer = post(server.http_port, b'{"inputs": [',
                                                     {"Content-Type": "application/json"})
        numbers["malformed"] = {"status": malformed_status, "answer": malformed_answer[:300].decode(errors="replace")}
        after = {}
        for encoding, infer in ENCODINGS.items():
            data = rng.standard_normal((1, FEATURES)).astype(np.float32)
            try:
                after[encoding] = (data, infer(server.http_port, data), None)
            except Exception as error:  # noqa: BLE001
                after[encoding] = (data, None, f"{type(error).__name__}: {error}"[:300])
        kitlib.write_result("fail", "cut short after the malformed request", numbers)
    finally:
        code = server.stop()

    model = torch.jit.load(os.path.join(root, "mlp", "1", "model.pt"), map_location=kitlib.torch_device()).eval()
    rtol, atol = kitlib.TOLERANCE["FP32"]

    def check(what, data, got, error):
        if error is not None:
            return f"{what}: {error}"
        with torch.inference_mode():
            want = model(torch.from_numpy(data).to(kitlib.torch_device())).cpu().numpy()
        if got.shape != want.shape:
            return f"{what}: shape {got.shape} != {want.shape}"
        if not np.allclose(got, want, rtol=rtol, atol=atol):
            return f"{what}: max abs difference {np.max(np.abs(got - want)):.3g}"
        return None

    latencies = {encoding: [] for encoding in ENCODINGS}
    with open(kitlib.step_path("requests.csv"), "w") as f:
        f.write("index,encoding,rows,latency_us,problem\n")
        for index, ((encoding, data), (got, latency, error)) in enumerate(zip(jobs, results)):
            problem = check(f"{encoding} request {index}", data, got, error)
            if problem:
                failures.append(problem)
            else:
                latencies[encoding].append(latency)
            f.write(f"{index},{encoding},{data.shape[0]},{latency:.0f},{(problem or '').replace(',', ';')}\n")
    if malformed_status != 400:
        failures.append(f"malformed body answered {malformed_status}, expected 400: {numbers['malformed']['answer']}")
    for encoding, (data, got, error) in after.items():
        problem = check(f"{encoding} request after the malformed one", data, got, error)
        if problem:
            failures.append(problem)
    if code != 0:
        failures.append(f"the server exited {code}")

    def percentile(values, q):
        return float(np.percentile(values, q)) if values else float("nan")

    numbers["per_encoding"] = {encoding: {"answered_ok": len(values), "p50_us": percentile(values, 50),
                                          "p99_us": percentile(values, 99)} for encoding, values in latencies.items()}
    numbers["failures"] = failures[:20]
    rows = [[encoding, sum(1 for job in jobs if job[0] == encoding), s["answered_ok"], round(s["p50_us"]),
             round(s["p99_us"])] for encoding, s in numbers["per_encoding"].items()]
    details = (kitlib.table(["encoding", "requests", "answers within tolerance", "p50 us", "p99 us"], rows)
               + f"\n\n{threads} threads, {numbers['rows_per_execution']:.2f} rows per execution "
                 f"(executed batch sizes {numbers['executed_batch_sizes']}); malformed body: HTTP {malformed_status}.")
    if failures:
        return kitlib.gpu_outcome(False, f"{len(failures)} problem(s): {failures[0]}"[:400], numbers, details)
    p50 = numbers["per_encoding"]
    return kitlib.gpu_outcome(
        True, f"{len(jobs)} REST requests from {threads} threads equal torch on {kitlib.torch_device()} "
              f"(JSON p50 {p50['json']['p50_us'] / 1e3:.2f} ms, binary p50 {p50['binary']['p50_us'] / 1e3:.2f} ms, "
              f"{numbers['rows_per_execution']:.2f} rows per execution); a malformed body got 400 and both encodings "
              "were answered after it", numbers, details)


if __name__ == "__main__":
    kitlib.run_step(body)
