#!/usr/bin/env python3
""".pt2 against TorchScript: the bundled MLP (784-512-512-10) and conv net as TorchScript files
(models/mlp, models/convnet) and as CPU AOTInductor packages (models/mlp_aoti,
models/convnet_aoti), the same weights, side by side in one run.

    .venv/bin/python benchmarks/aoti_benchmark.py [--smoke] [--json out.json] [--no-pin]

1. In process: sluice-bench-inprocess calls each file directly (torch::jit::Module::forward, or
   AOTIModelPackageLoader::run with the package's input check on), one thread, batch 2 and a
   large batch (32 for the MLP, 8 for the conv net: convnet_aoti's max_batch_size): rows/s and
   p50. (Batch 2: a package's dynamic batch starts at 2.)
2. Through the server: one sluice-server serving all four (--device cpu, one CPU instance each,
   dynamic batching as bundled): each version's load time (warm-up included, from the log), the
   first request's latency after ready, then perf_analyzer at concurrency 1 and 32: inferences/s
   and p50. Server and perf_analyzer are pinned to different CPUs (--no-pin: not).
3. Ratios .pt2 / TorchScript for each number.

Prints a table and writes JSON. --smoke runs a tiny version on the MLP pair only (the test
command runs it so the script keeps working); its numbers mean nothing.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from harness.bench import serve, write_json  # noqa: E402
from harness import perf_analyzer  # noqa: E402
from request_path_benchmark import pinning  # noqa: E402

# name -> (format, input name, row shape, package or file)
MODELS = {
    "mlp": ("torchscript", "INPUT__0", [784], "model.pt"),
    "mlp_aoti": ("pt2", "INPUT__0", [784], "model.cpu.pt2"),
    "convnet": ("torchscript", "image", [3, 32, 32], "model.pt"),
    "convnet_aoti": ("pt2", "image", [3, 32, 32], "model.cpu.pt2"),
}
# The large in-process batch of each pair: within both formats' max_batch_size (convnet_aoti's is 8).
BIG = {"mlp": 32, "mlp_aoti": 32, "convnet": 8, "convnet_aoti": 8}
PAIRS = [("mlp", "mlp_aoti"), ("convnet", "convnet_aoti")]


def make_repository(directory):
    os.makedirs(directory)
    for name in MODELS:
        os.makedirs(os.path.join(directory, name))
        with open(os.path.join(ROOT, "models", name, "config.pbtxt")) as f:
            # One CPU instance each, whatever the bundled config asks for.
            config = re.sub(r"kind: KIND_\w+", "kind: KIND_CPU", f.read())
        with open(os.path.join(directory, name, "config.pbtxt"), "w") as f:
            f.write(config)
    subprocess.run([sys.executable, os.path.join(ROOT, "models", "generate_models.py"), "--repository", directory,
                    "--models", *MODELS], check=True, stdout=subprocess.DEVNULL)


def inprocess(bin_dir, repository, smoke, pin):
    results = {}
    for name, (_, _, row_shape, filename) in MODELS.items():
        if smoke and name.startswith("convnet"):
            continue
        out = subprocess.run(
            [*pin, os.path.join(bin_dir, "sluice-bench-inprocess"), "--model",
             os.path.join(repository, name, "1", filename), "--row-shape", ",".join(map(str, row_shape)),
             "--batch-sizes", f"2,{BIG[name]}", "--seconds", "0.05" if smoke else "2", "--threads", "1",
             "--warmup", "3" if smoke else "20"],
            check=True, capture_output=True, text=True).stdout
        results[name] = {row["batch"]: row for row in map(json.loads, out.splitlines())}
    return results


def first_request_ms(url, name):
    import numpy as np
    import tritonclient.grpc as grpcclient
    _, input_name, row_shape, _ = MODELS[name]
    client = grpcclient.InferenceServerClient(url=url)
    try:
        data = np.random.default_rng(0).random((1, *row_shape), dtype=np.float32)
        tensor = grpcclient.InferInput(input_name, list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        started = time.perf_counter()
        client.infer(name, [tensor])
        return (time.perf_counter() - started) * 1e3
    finally:
        client.close()


def through_server(url, name, concurrency, smoke, workdir, pin):
    row = perf_analyzer.run(url, name, concurrency, os.path.join(workdir, f"{name}_{concurrency}.csv"),
                            smoke=smoke, interval_ms=3000, prefix=pin)
    return {"infer_per_s": float(row["Inferences/Second"]), "p50_us": float(row["p50 latency"])}


def ratio(a, b):
    return round(a / b, 3) if b else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny run: checks the script, numbers mean nothing")
    parser.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    parser.add_argument("--json", default=os.path.join(ROOT, "build", "aoti_benchmark.json"))
    parser.add_argument("--no-pin", action="store_true", help="do not pin server and client to different CPUs")
    args = parser.parse_args()
    (server_pin, client_pin), pin_note = pinning(not args.no_pin)
    workdir = tempfile.mkdtemp(prefix="sluice-aoti-bench-")
    try:
        repository = os.path.join(workdir, "repository")
        make_repository(repository)
        report = {"smoke": args.smoke, "pinning": pin_note, "inprocess": inprocess(args.bin_dir, repository,
                                                                                   args.smoke, server_pin)}
        started = time.monotonic()
        process, url = serve(args.bin_dir, repository, ["--device", "cpu"], prefix=server_pin, log_level="info",
                             timeout=120)
        ready_s = time.monotonic() - started
        try:
            log = open(repository + ".log").read()
            report["server"] = {"ready_s": round(ready_s, 2)}
            for name in MODELS:
                if args.smoke and name.startswith("convnet"):
                    continue  # the smoke run checks the script on one pair
                load = re.search(rf"event=model_ready model={name} version=1 .*?load_ms=(\d+)", log)
                entry = {"load_ms": int(load.group(1)) if load else None, "first_request_ms": first_request_ms(url, name)}
                for concurrency in (1, 32):
                    entry[f"c{concurrency}"] = through_server(url, name, concurrency, args.smoke, workdir, client_pin)
                report["server"][name] = entry
        finally:
            process.terminate()
            process.wait(timeout=60)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    rows = []
    report["ratios_pt2_over_torchscript"] = {}
    for torchscript, pt2 in PAIRS[:1] if args.smoke else PAIRS:
        ts_in, pt_in = report["inprocess"][torchscript], report["inprocess"][pt2]
        ts_srv, pt_srv = report["server"][torchscript], report["server"][pt2]
        numbers = {
            "inprocess_b2_rows_per_s": (ts_in[2]["rows_per_s"], pt_in[2]["rows_per_s"]),
            "inprocess_b2_p50_us": (ts_in[2]["p50_us"], pt_in[2]["p50_us"]),
            "inprocess_big_rows_per_s": (ts_in[BIG[torchscript]]["rows_per_s"], pt_in[BIG[pt2]]["rows_per_s"]),
            "load_ms": (ts_srv["load_ms"], pt_srv["load_ms"]),
            "first_request_ms": (ts_srv["first_request_ms"], pt_srv["first_request_ms"]),
            "server_c1_infer_per_s": (ts_srv["c1"]["infer_per_s"], pt_srv["c1"]["infer_per_s"]),
            "server_c1_p50_us": (ts_srv["c1"]["p50_us"], pt_srv["c1"]["p50_us"]),
            "server_c32_infer_per_s": (ts_srv["c32"]["infer_per_s"], pt_srv["c32"]["infer_per_s"]),
            "server_c32_p50_us": (ts_srv["c32"]["p50_us"], pt_srv["c32"]["p50_us"]),
        }
        report["ratios_pt2_over_torchscript"][torchscript] = {key: ratio(b, a) for key, (a, b) in numbers.items()
                                                              if a is not None and b is not None}
        for key, (a, b) in numbers.items():
            rows.append((torchscript, key, a, b, ratio(b, a) if a is not None and b is not None else None))
    print(f"pinning: {pin_note}{'   (smoke: numbers mean nothing)' if args.smoke else ''}")
    print(f"{'model':<9} {'number':<26} {'TorchScript':>12} {'.pt2':>12} {'.pt2/TS':>8}")
    for model, key, a, b, r in rows:
        fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
        print(f"{model:<9} {key:<26} {fmt(a):>12} {fmt(b):>12} {'-' if r is None else f'{r:.2f}':>8}")
    write_json(args.json, report)


if __name__ == "__main__":
    main()
