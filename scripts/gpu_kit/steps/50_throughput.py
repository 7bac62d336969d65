"""Throughput at concurrency 1, 8 and 64 (each held at least 10 s) through perf_analyzer, against
in-process LibTorch (sluice-bench-inprocess) at the batch size the server formed, in the same run,
measured two ways: the model alone (input already on the GPU) and the model with the host staging
and copies every request needs (through Sluice's runtime: pinned staging, host-to-device copy,
outputs back, synchronisation); the copies are reported on their own. The ratios, GPU utilisation from the server's own /metrics (--metrics-interval-ms 250), and queue
against compute time from ModelStatistics. ResNet-50 FP16 with preferred sizes {1, 8, 32, 64} and
padding on a GPU, cuDNN benchmark off as in the traced module that the in-process run calls
(40_resnet50 compares on and off); the bundled MLP on the CPU in the dry run. The numbers so far
are written after every level, so a run cut short keeps them. Also reports the batch sizes warm-up
chose for the bundled MLP (no preferred sizes: sluice.auto_batch_sizes), loaded beside it."""
# kit-timeout: 110
import os
import shutil
import threading

import kitlib

WINDOW_MS = 3400  # perf_analyzer measures three windows: about 10 s per concurrency


def gpu_sampler(server, samples, stop):
    while not stop.wait(0.5):
        try:
            values = kitlib.metric_values(kitlib.scrape(server.metrics_port), "sluice_gpu_utilization_ratio")
        except OSError:
            continue
        if values:
            samples.append(max(values))


def body():
    if kitlib.NO_GPU:
        name, dtype, row_shape, sizes = "mlp", "fp32", [784], (1, 2, 4)
        concurrencies, window_ms, seconds = (1, 4), 300, 0.2
    else:
        arch, side, sizes, _ = kitlib.resnet_geometry()
        name, dtype, row_shape = f"{arch}_fp16", "fp16", [3, side, side]
        concurrencies, window_ms, seconds = (1, 8, 64), WINDOW_MS, 1
    root = os.path.join(kitlib.WORK, "throughput")
    shutil.rmtree(root, ignore_errors=True)
    if kitlib.NO_GPU:
        kitlib.write_bundled(root, [name], "dynamic_batching { }")
    else:
        kitlib.write_resnet(root, name, dtype, sizes, "off")
        kitlib.write_bundled(root, ["mlp"], "dynamic_batching { }")
    model_file = os.path.join(root, name, "1", "model.pt")
    both = kitlib.ceilings(model_file, row_shape, list(sizes), seconds, dtype=dtype)
    ceiling, with_copies = both["model"], both["with_copies"]
    kitlib.write_result("fail", "cut short after the in-process ceilings", {"model": name, "inprocess": both})

    server = kitlib.start_server(root, ["--device", kitlib.device(), "--metrics-interval-ms", "250"], timeout=90)
    levels = []
    try:
        auto_sizes = kitlib.chosen_batch_sizes(server.url, "mlp")
        for concurrency in concurrencies:
            samples, stop = [], threading.Event()
            sampler = threading.Thread(target=gpu_sampler, args=(server, samples, stop), daemon=True)
            before = kitlib.model_statistics(server.url, name)
            sampler.start()
            try:
                run = kitlib.perf_analyzer(server.url, name, concurrency, window_ms, kitlib.STEP_DIR)
            finally:
                stop.set()
                sampler.join()
            delta = kitlib.statistics_delta(kitlib.model_statistics(server.url, name), before)
            executed = max(delta["batch_sizes"], key=delta["batch_sizes"].get) if delta["batch_sizes"] else 1
            nearest = min(ceiling, key=lambda b: (abs(b - executed), b))
            run.update({
                "avg_rows_per_execution": delta["inferences"] / max(delta["executions"], 1),
                "executed_batch_sizes": delta["batch_sizes"], "dominant_batch": executed,
                "queue_us_per_request": delta["queue_ns"] / max(delta["success"], 1) / 1e3,
                "compute_us_per_execution": delta["batch_compute_ns"] / max(delta["executions"], 1) / 1e3,
                "inprocess_batch": nearest, "inprocess_rows_per_s": ceiling[nearest]["rows_per_s"],
                "ratio": run["infer_per_s"] / ceiling[nearest]["rows_per_s"],
                "inprocess_with_copies_rows_per_s": with_copies[nearest]["rows_per_s"],
                "ratio_with_copies": run["infer_per_s"] / with_copies[nearest]["rows_per_s"],
                "gpu_utilization_median": kitlib.median(samples) if samples else None,
            })
            levels.append(run)
            kitlib.write_result("fail", f"cut short after concurrency {concurrency}",
                                {"model": name, "dtype": dtype, "inprocess": both, "levels": levels})
    finally:
        code = server.stop()
    rows = [[r["concurrency"], round(r["infer_per_s"]), round(r["p50_us"]), round(r["avg_rows_per_execution"], 1),
             r["dominant_batch"], round(r["inprocess_rows_per_s"]), f"{r['ratio']:.2f}",
             round(r["inprocess_with_copies_rows_per_s"]), f"{r['ratio_with_copies']:.2f}",
             "n/a" if r["gpu_utilization_median"] is None else f"{r['gpu_utilization_median']:.2f}",
             round(r["queue_us_per_request"]), round(r["compute_us_per_execution"])] for r in levels]
    numbers = {"model": name, "dtype": dtype, "inprocess": both, "levels": levels,
               "mlp_auto_batch_sizes": auto_sizes}
    details = (kitlib.table(["concurrency", "infer/s", "p50 us", "rows per execution", "executed batch",
                             "model alone rows/s at it", "ratio", "with copies rows/s", "ratio with copies",
                             "GPU util (median)", "queue us/request", "compute us/execution"], rows)
               + "\n\nIn-process LibTorch, model alone: " + ", ".join(
                   f"batch {b}: {r['rows_per_s']:.0f} rows/s, p50 {r['p50_us']:.0f} us" for b, r in ceiling.items())
               + "\n\nWith host staging and copies (Sluice's runtime): " + ", ".join(
                   f"batch {b}: {r['rows_per_s']:.0f} rows/s, p50 {r['p50_us']:.0f} us" for b, r in with_copies.items())
               + "\n\nThe copies per pass (p50 with copies - p50 alone, us): " + ", ".join(
                   f"batch {b}: {v}" for b, v in both["copies_us"].items())
               + f"\n\nBatch sizes warm-up chose for the bundled MLP (sluice.auto_batch_sizes): "
                 f"{auto_sizes['sizes'] or 'none (the rule did not apply)'}; rows/s per size: "
                 f"{auto_sizes['rows_per_second'] or 'n/a'}")
    failures = []
    if code != 0:
        failures.append(f"the server exited {code}")
    if not kitlib.NO_GPU and not any(r["gpu_utilization_median"] for r in levels):
        failures.append("no GPU utilisation in /metrics")
    if failures:
        return kitlib.gpu_outcome(False, "; ".join(failures), numbers, details)
    return kitlib.gpu_outcome(True, f"{name}: " + "; ".join(
        f"c={r['concurrency']} {r['infer_per_s']:.0f}/s ratio {r['ratio']:.2f} ({r['ratio_with_copies']:.2f} with copies)"
        for r in levels)
        + f"; mlp auto batch sizes {auto_sizes['sizes'] or 'none'}", numbers, details)


if __name__ == "__main__":
    kitlib.run_step(body)
