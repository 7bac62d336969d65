"""Two instances of one model on one GPU against one: ResNet-50 FP16 (preferred batch sizes
{1, 8, 32, 64} padded, cuDNN benchmark off) loaded twice in one server, once with instance_group
count 1 and once with count 2, each driven by perf_analyzer at concurrency 16 (windows of about
2 s). Reports infer/s, p50 and p99, the rows per execution the server formed, and the ratio
two/one. Pass: both models served the whole load with zero errors (perf_analyzer exited 0 and the
server counted no failed inference); the ratio is reported, not judged, since whether a second
instance helps depends on how much one instance leaves the GPU idle. CPU dry run: the bundled MLP
with count 1 and 2 on the CPU, concurrency 4, tiny windows."""
# kit-timeout: 45
import os
import re
import shutil

import kitlib

# perf_analyzer's own limit, below the step's cap (three 2 s windows take about 7 s).
PERF_ANALYZER_TIMEOUT_S = 20


def failed_inferences(url, model):
    import tritonclient.grpc as grpcclient
    client = grpcclient.InferenceServerClient(url=url)
    try:
        return client.get_inference_statistics(model, client_timeout=10).model_stats[0].inference_stats.fail.count
    finally:
        client.close()


def body():
    root = os.path.join(kitlib.WORK, "two_instances")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    if kitlib.NO_GPU:
        base, concurrency, window_ms = "mlp", 4, 300
        kitlib.write_bundled(root, ["mlp"], "dynamic_batching { }")
    else:
        arch, _, sizes, _ = kitlib.resnet_geometry()
        base, concurrency, window_ms = f"{arch}_fp16", 16, 2000
        kitlib.write_resnet(root, base, "fp16", sizes, "off")
    one, two = f"{base}_one", f"{base}_two"
    os.rename(os.path.join(root, base), os.path.join(root, one))
    with open(os.path.join(root, one, "config.pbtxt")) as f:
        config = f.read()
    with open(os.path.join(root, one, "config.pbtxt"), "w") as f:
        f.write(re.sub(r'^name:\s*"[^"]*"', f'name: "{one}"', config, flags=re.M))
    kitlib.copy_model(root, one, two, [(r"(instance_group\s*\[\s*\{[^}]*count:\s*)1\b", r"\g<1>2")])

    server = kitlib.start_server(root, ["--device", kitlib.device()], timeout=35)
    runs, failures = {}, []
    try:
        for model, instances in ((one, 1), (two, 2)):
            before = kitlib.model_statistics(server.url, model)
            failed_before = failed_inferences(server.url, model)
            run = kitlib.perf_analyzer(server.url, model, concurrency, window_ms, kitlib.STEP_DIR,
                                       timeout=PERF_ANALYZER_TIMEOUT_S)
            delta = kitlib.statistics_delta(kitlib.model_statistics(server.url, model), before)
            run.update({"instances": instances, "failed_inferences": failed_inferences(server.url, model) - failed_before,
                        "rows_per_execution": delta["inferences"] / max(delta["executions"], 1),
                        "executed_batch_sizes": delta["batch_sizes"]})
            runs[model] = run
            kitlib.write_result("fail", f"cut short after {model}", {"runs": runs, "concurrency": concurrency})
    finally:
        code = server.stop()
    log = open(server.log_path).read()
    # Warm-up runs on every instance: its line says how many the server made.
    warmed = {}
    for model in (one, two):
        match = re.search(rf"event=warmup model={model} version=1 .*instances=(\d+)", log)
        warmed[model] = int(match.group(1)) if match else None
    ratio = runs[two]["infer_per_s"] / runs[one]["infer_per_s"] if runs[one]["infer_per_s"] else float("nan")
    numbers = {"concurrency": concurrency, "window_ms": window_ms, "runs": runs, "ratio_two_over_one": ratio,
               "instances_warmed": warmed}
    for model, run in runs.items():
        if run["failed_inferences"]:
            failures.append(f"{model}: {run['failed_inferences']} failed inferences")
    for model, instances in ((one, 1), (two, 2)):
        if warmed[model] is not None and warmed[model] != instances:
            failures.append(f"{model}: the log says {warmed[model]} instance(s) warmed up, expected {instances}")
    if code != 0:
        failures.append(f"the server exited {code}")
    rows = [[model, r["instances"], "n/a" if warmed[model] is None else warmed[model], round(r["infer_per_s"]),
             round(r["p50_us"]), round(r["p99_us"]), round(r["rows_per_execution"], 1), r["failed_inferences"]]
            for model, r in runs.items()]
    details = (kitlib.table(["model", "instances", "instances warmed (log)", "infer/s", "p50 us", "p99 us",
                             "rows per execution", "failed"], rows)
               + f"\n\nRatio two instances / one: {ratio:.2f} (reported, not judged).")
    if failures:
        return kitlib.gpu_outcome(False, "; ".join(failures), numbers, details)
    return kitlib.gpu_outcome(
        True, f"{base} at concurrency {concurrency}, no errors: 1 instance {runs[one]['infer_per_s']:.0f}/s "
              f"p50 {runs[one]['p50_us'] / 1e3:.1f} ms, 2 instances {runs[two]['infer_per_s']:.0f}/s "
              f"p50 {runs[two]['p50_us'] / 1e3:.1f} ms; two/one {ratio:.2f} (reported, not judged)", numbers, details)


if __name__ == "__main__":
    kitlib.run_step(body)
