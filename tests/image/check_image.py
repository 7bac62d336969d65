"""The container image from the outside, as its users reach it (run by scripts/image_test.sh,
which builds the image and starts the container; see its header). Two parts:

  serve  every bundled model answers tritonclient over gRPC and over HTTP, equal to the same
         model file (copied out of the image) run by torch on this machine; the metrics endpoint
         counts the requests; the repository index lists every bundled model READY.
  drain  clients keep requests in flight while `docker stop -t 40` sends SIGTERM: the container
         exits 0, every request ends OK or refused (UNAVAILABLE, or gRPC's own bare CANCELLED for
         a call that reached the server after it began shutting down), none is lost or hangs.

Prints what it measured and exits non-zero with the reasons when a check fails."""
import argparse
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request

import numpy as np
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUNDLED = sorted(name for name in os.listdir(os.path.join(ROOT, "models"))
                 if os.path.isfile(os.path.join(ROOT, "models", name, "config.pbtxt")))
RNG = np.random.default_rng(2026)


def running(container):
    state = subprocess.run(["docker", "inspect", "-f", "{{.State.Running}}", container], capture_output=True, text=True)
    return state.stdout.strip() == "true"


def wait_ready(http_url, container, timeout):
    deadline = time.monotonic() + timeout
    while True:
        if container and not running(container):
            sys.exit(f"the container {container} exited before its server was ready (its log follows)")
        try:
            with urllib.request.urlopen(f"http://{http_url}/v2/health/ready", timeout=3) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            sys.exit(f"the container's server was not ready within {timeout} s")
        time.sleep(1)


def tensor_cases(models):
    """(model, inputs {name: array}, reference outputs {name: array}) for each stateless model,
    the reference computed by torch from the model file the image holds."""
    cases = []
    for name, inputs, outputs in (("mlp", {"INPUT__0": RNG.standard_normal((3, 784), dtype=np.float32)},
                                   ["OUTPUT__0"]),
                                  ("convnet", {"image": RNG.standard_normal((2, 3, 32, 32), dtype=np.float32)},
                                   ["logits"])):
        for variant in (name, name + "_aoti"):
            directory = os.path.join(models, variant, "1")
            arguments = [torch.from_numpy(array) for array in inputs.values()]
            with torch.inference_mode():
                if variant.endswith("_aoti"):
                    # The file the server takes on the CPU: model.cpu.pt2 beside model.pt2, else model.pt2.
                    package = next(os.path.join(directory, f) for f in ("model.cpu.pt2", "model.pt2")
                                   if os.path.exists(os.path.join(directory, f)))
                    result = torch._inductor.aoti_load_package(package)(*arguments)
                else:
                    result = torch.jit.load(os.path.join(directory, "model.pt")).eval()(*arguments)
            results = result if isinstance(result, (list, tuple)) else [result]
            cases.append((variant, inputs, {out: r.numpy() for out, r in zip(outputs, results)}))
    # The bundled ensemble: its three step models run here in turn, from the image's files.
    pixels = RNG.uniform(0, 255, (2, 3, 32, 32)).astype(np.float32)
    with torch.inference_mode():
        step = {name: torch.jit.load(os.path.join(models, name, "1", "model.pt")).eval()
                for name in ("image_normaliser", "convnet", "top_classes")}
        scores, classes = step["top_classes"](step["convnet"](step["image_normaliser"](torch.from_numpy(pixels))))
    cases.append(("convnet_pipeline", {"pixels": pixels}, {"scores": scores.numpy(), "classes": classes.numpy()}))
    texts = ["a plainly good answer", "", "Sluice serves models", "ünïcödé text"]
    with torch.inference_mode():
        scores, labels = torch.jit.load(os.path.join(models, "text_classifier", "1", "model.pt"))(texts)
    cases.append(("text_classifier", {"TEXT": np.array([[t.encode()] for t in texts], dtype=np.object_)},
                  {"SCORES": scores.numpy(), "LABEL": np.array([[label.encode()] for label in labels],
                                                               dtype=np.object_)}))
    return cases


def accumulator_reference(models, values):
    """What the accumulator answers for one sequence of `values`: its TorchScript run step by step
    with the control inputs the sequence batcher fills in."""
    module = torch.jit.load(os.path.join(models, "accumulator", "1", "model.pt"))
    answers = []
    for index, value in enumerate(values):
        column = lambda x: torch.tensor([[x]], dtype=torch.int32)  # noqa: E731
        with torch.inference_mode():
            out = module(column(value), column(int(index == 0)), column(int(index == len(values) - 1)),
                         column(1), torch.tensor([[99]], dtype=torch.int64))
        answers.append(int(out[0, 0]))
    return answers


def datatype(array):
    return "BYTES" if array.dtype == np.object_ else {np.float32: "FP32", np.int32: "INT32"}[array.dtype.type]


def infer(module, client, model, inputs, outputs, **kwargs):
    tensors = []
    for name, array in inputs.items():
        tensor = module.InferInput(name, list(array.shape), datatype(array))
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    result = client.infer(model, tensors, outputs=[module.InferRequestedOutput(o) for o in outputs], **kwargs)
    return {o: result.as_numpy(o) for o in outputs}


def same(got, want):
    if want.dtype == np.object_:
        return got.shape == want.shape and [bytes(x) for x in got.ravel()] == [bytes(x) for x in want.ravel()]
    return got.shape == want.shape and np.allclose(got, want, rtol=1e-4, atol=1e-5)


def serve(args):
    failures = []
    wait_ready(args.http, args.container, args.ready_timeout)
    clients = {"grpc": (grpcclient, grpcclient.InferenceServerClient(args.grpc)),
               "http": (httpclient, httpclient.InferenceServerClient(args.http))}
    index = {m.name: m.state for m in clients["grpc"][1].get_model_repository_index().models}
    print("repository index:", json.dumps(index, sort_keys=True))
    for name in BUNDLED:
        if index.get(name) != "READY":
            failures.append(f"bundled model {name} is {index.get(name, 'missing')}, not READY")
    answered = 0
    for model, inputs, want in tensor_cases(args.models):
        for protocol, (module, client) in clients.items():
            try:
                got = infer(module, client, model, inputs, list(want))
            except InferenceServerException as error:
                failures.append(f"{model} over {protocol}: {error}")
                continue
            for output, expected in want.items():
                if not same(got[output], expected):
                    failures.append(f"{model} over {protocol}: {output} differs from torch on this machine")
            answered += 1
            print(f"{model:16s} {protocol:4s} equal to torch: {all(same(got[o], w) for o, w in want.items())}")
    values = [3, -1, 40, 2]
    want = accumulator_reference(args.models, values)
    for number, (protocol, (module, client)) in enumerate(clients.items()):
        got = []
        try:
            for index_in_sequence, value in enumerate(values):
                got.append(int(infer(module, client, "accumulator", {"INPUT": np.array([[value]], dtype=np.int32)},
                                     ["OUTPUT"], sequence_id=1000 + number, sequence_start=index_in_sequence == 0,
                                     sequence_end=index_in_sequence == len(values) - 1)["OUTPUT"][0, 0]))
        except InferenceServerException as error:
            failures.append(f"accumulator over {protocol}: {error}")
        print(f"{'accumulator':16s} {protocol:4s} {got} (torch: {want})")
        if got != want:
            failures.append(f"accumulator over {protocol}: {got}, torch says {want}")
        answered += 1

    with urllib.request.urlopen(f"http://{args.metrics}/metrics", timeout=10) as answer:
        metrics = answer.read().decode()
    counted = {}
    for line in metrics.splitlines():
        if line.startswith("nv_inference_request_success{"):
            model = line.split('model="', 1)[1].split('"', 1)[0]
            counted[model] = counted.get(model, 0) + float(line.rsplit(" ", 1)[1])
    print("metrics nv_inference_request_success:", json.dumps(counted, sort_keys=True))
    for name in BUNDLED:
        if counted.get(name, 0) < 2:
            failures.append(f"metrics count {counted.get(name, 0)} successful requests for {name}, sent at least 2")
    for _, client in clients.values():
        client.close()
    print(f"answered {answered} model/protocol pairs")
    return failures


KINDS = ("ok", "refused", "lost", "hung")


def classify(code, message, sent, stop_at):
    """What became of one request: refused means the server turned it away while going down
    (UNAVAILABLE, or gRPC's bare CANCELLED for a call sent after the stop began), lost is any other
    failure, hung a client deadline."""
    if code == "OK":
        return "ok"
    if code == "DEADLINE_EXCEEDED":
        return "hung"
    if stop_at is None or sent < stop_at - 1.0:
        return "lost"  # failed under plain load, before the stop
    if code == "UNAVAILABLE" or (code == "CANCELLED" and message.strip() in ("", "CANCELLED")):
        return "refused"
    return "lost"


def drain(args):
    failures = []
    data = RNG.standard_normal((1, 784), dtype=np.float32)
    records, lock, stop = [], threading.Lock(), threading.Event()

    def run():
        client = grpcclient.InferenceServerClient(args.grpc)
        tensor = grpcclient.InferInput("INPUT__0", [1, 784], "FP32")
        tensor.set_data_from_numpy(data)
        while not stop.is_set():
            sent = time.monotonic()
            try:
                client.infer("mlp", [tensor], client_timeout=50)
                code, message = "OK", ""
            except InferenceServerException as error:
                code, message = str(error.status()).replace("StatusCode.", ""), error.message() or ""
            with lock:
                records.append((sent, time.monotonic(), code, message[:160]))
            if code != "OK":
                time.sleep(0.05)
        client.close()

    threads = [threading.Thread(target=run, daemon=True) for _ in range(args.threads)]
    for thread in threads:
        thread.start()
    time.sleep(2.0)
    stop_at = time.monotonic()
    stopped = subprocess.run(["docker", "stop", "-t", "40", args.container], capture_output=True, text=True)
    stop_s = time.monotonic() - stop_at
    time.sleep(0.3)
    stop.set()
    for thread in threads:
        thread.join(60)
    inspect = subprocess.run(["docker", "inspect", "-f", "{{.State.ExitCode}}", args.container],
                             capture_output=True, text=True)
    exit_code = inspect.stdout.strip()
    kinds = {kind: 0 for kind in KINDS}
    examples = {}
    for sent, _, code, message in records:
        kind = classify(code, message, sent, stop_at)
        kinds[kind] += 1
        if kind != "ok":
            examples.setdefault(kind, f"{code}: {message}")
    in_flight = [r for r in records if r[0] < stop_at <= r[1]]
    print(f"docker stop -t 40 under load ({args.threads} clients): {stop_s:.1f} s, exit code {exit_code}; "
          f"requests {len(records)}: {json.dumps(kinds)}; in flight at the stop {len(in_flight)}, "
          f"{sum(1 for r in in_flight if r[2] == 'OK')} of them OK; examples {json.dumps(examples)}")
    if stopped.returncode != 0:
        failures.append(f"docker stop failed: {stopped.stderr.strip()}")
    if exit_code != "0":
        failures.append(f"the container exited {exit_code!r} after docker stop, expected 0")
    if stop_s > 35:
        failures.append(f"docker stop took {stop_s:.1f} s: the server's 30 s grace ran out")
    if kinds["ok"] == 0:
        failures.append("no request was answered before the stop")
    for kind in ("lost", "hung"):
        if kinds[kind]:
            failures.append(f"{kinds[kind]} request(s) {kind}: {examples[kind]}")
    if any(thread.is_alive() for thread in threads):
        failures.append("a client was still waiting on a request a minute after the stop")
    return failures


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("part", choices=["serve", "drain"])
    parser.add_argument("--grpc", required=True, help="host:port of the container's gRPC endpoint")
    parser.add_argument("--http", help="host:port of its HTTP endpoint (serve)")
    parser.add_argument("--metrics", help="host:port of its metrics endpoint (serve)")
    parser.add_argument("--models", help="the image's /models, copied out with docker cp (serve)")
    parser.add_argument("--container", help="the container: watched while it starts (serve), stopped (drain)")
    parser.add_argument("--threads", type=int, default=8, help="clients under load (drain)")
    parser.add_argument("--ready-timeout", type=float, default=300)
    args = parser.parse_args()
    failures = serve(args) if args.part == "serve" else drain(args)
    for failure in failures:
        print("FAIL:", failure)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
