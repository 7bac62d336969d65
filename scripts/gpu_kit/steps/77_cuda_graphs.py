"""CUDA graphs (optimization { cuda { graphs: true } }, issue 33) against eager runs of the same
model in one server: ResNet-50 FP16 (preferred sizes {1, 8, 32, 64} padded, cuDNN benchmark off)
and the bundled MLP. The eager ResNet-50 and MLP serve a steady load from another thread while
the graph models load (their warm-up captures every shape, in thread-local capture mode), then:
the same inputs at batch 1, 8 and 32 answered by both (equal within FP16's tolerance), and
perf_analyzer at concurrency 1 and 8 on each (infer/s, p50, the server's compute per request),
the shapes captured and their capture time from the log. Pass: the graph models load while the
others serve without an error, at least one ResNet-50 shape runs as a graph, and every answer
equals the eager one; the speed-up is reported, not judged. CPU dry run: ResNet-18 and the MLP on
the CPU, where the option is accepted and ignored with one log line per model."""
# kit-timeout: 75
import os
import re
import shutil
import threading

import numpy as np

import kitlib

GRAPHS = "optimization { cuda { graphs: true } }\n"


def graph_copy(root, source, target):
    """<root>/<target>: <root>/<source> under another name, with CUDA graphs on."""
    shutil.copytree(os.path.join(root, source), os.path.join(root, target))
    path = os.path.join(root, target, "config.pbtxt")
    with open(path) as f:
        config = f.read()
    config = re.sub(r'^name:\s*"[^"]*"', f'name: "{target}"', config, flags=re.M)
    with open(path, "w") as f:
        f.write(config + GRAPHS)


def background_load(url, model, stop, counts):
    """Requests to `model` one after another until `stop`; counts answers and errors."""
    import tritonclient.grpc as grpcclient
    client = grpcclient.InferenceServerClient(url=url)
    data = np.random.default_rng(1).random((1, 784), dtype=np.float32)
    tensor = grpcclient.InferInput("INPUT__0", [1, 784], "FP32")
    tensor.set_data_from_numpy(data)
    while not stop.is_set():
        try:
            client.infer(model, [tensor], client_timeout=20)
            counts["ok"] += 1
        except Exception as error:  # noqa: BLE001 - counted and reported
            counts["errors"] += 1
            counts["first_error"] = counts.get("first_error") or str(error)[:300]
    client.close()


def body():
    import tritonclient.grpc as grpcclient
    arch, side, sizes, _ = kitlib.resnet_geometry()
    dtype = "fp32" if kitlib.NO_GPU else "fp16"
    root = os.path.join(kitlib.WORK, "cuda_graphs")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    eager = f"{arch}_{dtype}"
    kitlib.write_resnet(root, eager, dtype, sizes, "off")
    kitlib.write_bundled(root, ["mlp"], "dynamic_batching { }")
    pairs = [(eager, f"{eager}_graphs"), ("mlp", "mlp_graphs")]
    for source, target in pairs:
        graph_copy(root, source, target)
    server = kitlib.start_server(root, ["--device", kitlib.device(), "--model-control-mode", "explicit",
                                        "--load-model", eager, "--load-model", "mlp"], timeout=90)
    failures, answers, runs = [], [], []
    counts = {"ok": 0, "errors": 0}
    try:
        client = grpcclient.InferenceServerClient(url=server.url)
        stop = threading.Event()
        loader = threading.Thread(target=background_load, args=(server.url, "mlp", stop, counts), daemon=True)
        loader.start()
        try:
            for _, target in pairs:
                client.load_model(target, client_timeout=120)
        finally:
            stop.set()
            loader.join(timeout=30)
        if counts["errors"]:
            failures.append(f"the MLP answered {counts['errors']} errors while the graph models loaded: "
                            f"{counts.get('first_error')}")
        rng = np.random.default_rng(7)
        np_dtype = np.float16 if dtype == "fp16" else np.float32
        rtol, atol = kitlib.TOLERANCE["FP16" if dtype == "fp16" else "FP32"]
        for model, shape, name in [(eager, (3, side, side), "FP16" if dtype == "fp16" else "FP32"),
                                   ("mlp", (784,), "FP32")]:
            for batch in [b for b in (1, 8, 32) if b <= max(sizes) or model == "mlp"]:
                data = rng.standard_normal((batch, *shape)).astype(np_dtype if model == eager else np.float32)
                got = {}
                for which in (model, f"{model}_graphs"):
                    tensor = grpcclient.InferInput("INPUT__0", list(data.shape), name)
                    tensor.set_data_from_numpy(data)
                    # Twice: the first may be a shape's capture pass (answered eagerly); the second replays.
                    for _ in range(2):
                        got[which] = client.infer(which, [tensor], client_timeout=60).as_numpy("OUTPUT__0")
                a, b = got[model].astype(np.float64), got[f"{model}_graphs"].astype(np.float64)
                difference = float(np.max(np.abs(a - b))) if a.shape == b.shape else float("inf")
                equal = a.shape == b.shape and np.allclose(a, b, rtol=rtol, atol=atol)
                answers.append([model, batch, f"{difference:.3g}", "yes" if equal else "NO"])
                if not equal:
                    failures.append(f"{model} batch {batch}: graphs differ from eager by {difference:.3g}")
        client.close()
        window_ms = 300 if kitlib.NO_GPU else 1000
        for model in (eager, f"{eager}_graphs", "mlp", "mlp_graphs"):
            for concurrency in (1, 8):
                before = kitlib.model_statistics(server.url, model)
                run = kitlib.perf_analyzer(server.url, model, concurrency, window_ms, kitlib.STEP_DIR, timeout=30)
                delta = kitlib.statistics_delta(kitlib.model_statistics(server.url, model), before)
                run.update({"model": model, "compute_us_per_execution":
                            delta["batch_compute_ns"] / max(delta["executions"], 1) / 1e3})
                runs.append(run)
                kitlib.write_result("fail", f"cut short after {model} c={concurrency}", {"runs": runs})
    finally:
        code = server.stop()
    if code != 0:
        failures.append(f"the server exited {code}")
    log = open(server.log_path).read()
    captured = {}
    for match in re.finditer(r"event=cuda_graph_captured model=(\w+) shape=\"([^\"]*)\" capture_us=(\d+)", log):
        captured.setdefault(match.group(1), []).append((match.group(2), int(match.group(3))))
    failed = re.findall(r"event=cuda_graph_failed model=(\w+) shape=\"([^\"]*)\" reason=\"([^\"]*)\"", log)
    turned_off = re.findall(r"event=cuda_graphs_off model=(\w+) reason=\"([^\"]*)\"", log)
    ignored = re.findall(r"optimization\.cuda\.graphs is ignored: the instance runs on the CPU", log)
    if kitlib.NO_GPU:
        if not ignored:
            failures.append("no log line says the CPU ignores optimization.cuda.graphs")
    elif not captured.get(f"{eager}_graphs"):
        failures.append(f"no shape of {eager}_graphs was captured: failed {failed[:3]}, off {turned_off[:1]}")
    by = {(r["model"], r["concurrency"]): r for r in runs}
    speedups = {}
    for model in (eager, "mlp"):
        for concurrency in (1, 8):
            plain, graphs = by.get((model, concurrency)), by.get((f"{model}_graphs", concurrency))
            if plain and graphs:
                speedups[f"{model}@c{concurrency}"] = {
                    "p50_eager_over_graphs": round(plain["p50_us"] / max(graphs["p50_us"], 1e-9), 2),
                    "throughput_graphs_over_eager": round(graphs["infer_per_s"] / max(plain["infer_per_s"], 1e-9), 2)}
    numbers = {"dtype": dtype, "sizes": list(sizes), "background": counts, "answers": answers, "runs": runs,
               "captured": {m: [{"shape": s, "capture_us": us} for s, us in v] for m, v in captured.items()},
               "failed": [list(f) for f in failed], "turned_off": [list(t) for t in turned_off],
               "speedups": speedups}
    details = (kitlib.table(["model", "batch", "largest difference", "equal"], answers) + "\n\n"
               + kitlib.table(["model", "concurrency", "infer/s", "p50 us", "server compute us/execution"],
                              [[r["model"], r["concurrency"], round(r["infer_per_s"]), round(r["p50_us"]),
                                round(r["compute_us_per_execution"])] for r in runs])
               + "\n\nCaptured: " + "; ".join(f"{m}: {len(v)} shapes, {sum(us for _, us in v) / 1e3:.0f} ms"
                                               for m, v in captured.items())
               + ("\n\nNot captured: " + "; ".join(f"{m} {s}: {r}" for m, s, r in failed[:8]) if failed else "")
               + ("\n\nTurned off: " + "; ".join(f"{m}: {r}" for m, r in turned_off) if turned_off else ""))
    summary = (f"{eager}: " + ", ".join(f"{k} p50 eager/graphs {v['p50_eager_over_graphs']}x, throughput "
                                        f"{v['throughput_graphs_over_eager']}x" for k, v in speedups.items())
               + f"; captured {sum(len(v) for v in captured.values())} shapes; {len(failed)} not capturable")
    if failures:
        return kitlib.gpu_outcome(False, "; ".join(failures)[:400], numbers, details)
    return kitlib.gpu_outcome(True, summary[:400], numbers, details)


if __name__ == "__main__":
    kitlib.run_step(body)
