"""Where the time goes: ResNet-50 FP16 through perf_analyzer at concurrency 1, 4, 8, 16, 32, 64
and 128 over gRPC, and again over system shared memory from 16 on (short windows), against
in-process LibTorch in the same run, measured two ways: the model alone (input already on the GPU)
and the model with the host staging and copies every request needs (through Sluice's runtime:
pinned staging, host-to-device copy, outputs back, synchronisation). Per level: real rows/s
against in-process-with-copies at max_batch_size (the device's best) and at the batch size the
server formed; real and padded rows per batch; the batch cycle from the server's
sluice_batch_phase_seconds_total, split into idle, assembly into staging, execute (and within it,
from CUDA events on the instance's stream, host-to-device, forward, device-to-host), scatter into
the answers and completion; GPU utilisation from the server's own /metrics (--metrics-interval-ms
250; a diagnostic, not a gate); the server's CPU by thread group and perf_analyzer's CPU.
Preferred sizes {1, 8, 32, 64} with padding on a GPU, cuDNN benchmark off as in the traced module
that the in-process run calls (40_resnet50 compares on and off); the bundled MLP on the CPU in the
dry run, at c=1 and 4. The numbers so far are written after every level, so a run cut short keeps
them. Also reports the batch sizes warm-up chose for the bundled MLP (no preferred sizes:
sluice.auto_batch_sizes), loaded beside it. Staging ahead (sluice.stage_ahead: a full batch
assembled while the one before it runs) is on by default on a GPU; a twin of the model with it
off, loaded beside it, runs the last level again, so the run says what staging ahead is worth
on the device (the cycle's staged share and off-cycle assembly are in the table)."""
# kit-timeout: 170
import os
import re
import resource
import shutil
import threading

import floor_benchmark as fb
import kitlib

WINDOW_MS = 1000  # perf_analyzer measures three windows: about 3 s per level
CONCURRENCIES = (1, 4, 8, 16, 32, 64, 128)
SHARED_MEMORY_FROM = 16  # and beyond, a second run over system shared memory


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
        concurrencies, window_ms, seconds = CONCURRENCIES, WINDOW_MS, 1
    root = os.path.join(kitlib.WORK, "throughput")
    shutil.rmtree(root, ignore_errors=True)
    if kitlib.NO_GPU:
        kitlib.write_bundled(root, [name], "dynamic_batching { }")
    else:
        kitlib.write_resnet(root, name, dtype, sizes, "off")
        kitlib.write_bundled(root, ["mlp"], "dynamic_batching { }")
    # The twin without staging ahead: the same files, the parameter set off.
    unstaged = f"{name}_unstaged"
    shutil.copytree(os.path.join(root, name), os.path.join(root, unstaged))
    config = os.path.join(root, unstaged, "config.pbtxt")
    with open(config) as f:
        text = re.sub(r'^name:\s*"[^"]*"', f'name: "{unstaged}"', f.read(), flags=re.M)
    with open(config, "w") as f:
        f.write(text + '\nparameters { key: "sluice.stage_ahead" value { string_value: "false" } }\n')
    model_file = os.path.join(root, name, "1", "model.pt")
    both = kitlib.ceilings(model_file, row_shape, list(sizes), seconds, dtype=dtype)
    ceiling, with_copies = both["model"], both["with_copies"]
    best = with_copies[max(with_copies)]["rows_per_s"]  # the device's best: the largest batch, with copies
    kitlib.write_result("fail", "cut short after the in-process ceilings", {"model": name, "inprocess": both})

    server = kitlib.start_server(root, ["--device", kitlib.device(), "--metrics-interval-ms", "250",
                                        "--allow-client-shm=true", "--client-shm-keys=*"], timeout=90)
    levels = []
    runs = [(c, "grpc") for c in concurrencies] + [(c, "shm") for c in concurrencies if c >= SHARED_MEMORY_FROM]

    def measure(model, concurrency, transport):
        samples, stop = [], threading.Event()
        sampler = threading.Thread(target=gpu_sampler, args=(server, samples, stop), daemon=True)
        before = kitlib.model_statistics(server.url, model)
        cycle_before = kitlib.batch_cycle(kitlib.scrape(server.metrics_port), model)
        cpu_before = fb.thread_counters(server.process.pid)
        client_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        sampler.start()
        try:
            extra = ["--shared-memory", "system"] if transport == "shm" else []
            run = kitlib.perf_analyzer(server.url, model, concurrency, window_ms, kitlib.STEP_DIR, extra=extra,
                                       tag=("_shm" if transport == "shm" else "") + model[len(name):])
        finally:
            stop.set()
            sampler.join()
        client_after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu_after = fb.thread_counters(server.process.pid)
        delta = kitlib.statistics_delta(kitlib.model_statistics(server.url, model), before)
        cycle = kitlib.cycle_report(kitlib.batch_cycle(kitlib.scrape(server.metrics_port), model), cycle_before,
                                    delta["executions"])
        executed = max(delta["batch_sizes"], key=delta["batch_sizes"].get) if delta["batch_sizes"] else 1
        nearest = min(ceiling, key=lambda b: (abs(b - executed), b))
        # CPU seconds by the floor benchmark's thread groups (worker, batcher, gRPC and the rest).
        _, groups = fb.per_call_counters(cpu_before, cpu_after, 1)
        server_cpu = {group: round(counters["cpu_us"] / 1e6, 2) for group, counters in groups.items()}
        run.update({
            "transport": transport, "model": model, "stage_ahead": model == name,
            "avg_rows_per_execution": delta["inferences"] / max(delta["executions"], 1),
            "executed_batch_sizes": delta["batch_sizes"], "dominant_batch": executed,
            "queue_us_per_request": delta["queue_ns"] / max(delta["success"], 1) / 1e3,
            "compute_us_per_execution": delta["batch_compute_ns"] / max(delta["executions"], 1) / 1e3,
            "inprocess_batch": nearest, "inprocess_rows_per_s": ceiling[nearest]["rows_per_s"],
            "ratio": run["infer_per_s"] / ceiling[nearest]["rows_per_s"],
            "inprocess_with_copies_rows_per_s": with_copies[nearest]["rows_per_s"],
            "ratio_with_copies": run["infer_per_s"] / with_copies[nearest]["rows_per_s"],
            "ratio_to_best": run["infer_per_s"] / best,
            "gpu_utilization_median": kitlib.median(samples) if samples else None,
            "cycle": cycle, "server_cpu_s": server_cpu,
            "client_cpu_s": round((client_after.ru_utime - client_before.ru_utime)
                                  + (client_after.ru_stime - client_before.ru_stime), 2),
        })
        return run

    try:
        auto_sizes = kitlib.chosen_batch_sizes(server.url, "mlp")
        # The last level again on the twin without staging ahead.
        last = runs[-1]
        for model, (concurrency, transport) in [(name, r) for r in runs] + [(unstaged, last)]:
            levels.append(measure(model, concurrency, transport))
            kitlib.write_result("fail", f"cut short after concurrency {concurrency} over {transport} ({model})",
                                {"model": name, "dtype": dtype, "inprocess": both, "levels": levels})
    finally:
        code = server.stop()

    def pct(value):
        return f"{100 * value:.0f}%"

    def label(r):
        return r["transport"] + ("" if r["stage_ahead"] else ", staging ahead off")

    rows = [[r["concurrency"], label(r), round(r["infer_per_s"]), f"{r['ratio_to_best']:.2f}",
             f"{r['ratio_with_copies']:.2f}", round(r["p50_us"]), round(r["p99_us"]),
             f"{r['cycle']['real_rows_per_batch']:.1f}/{r['cycle']['padded_rows_per_batch']:.1f}",
             "n/a" if r["gpu_utilization_median"] is None else f"{r['gpu_utilization_median']:.2f}"] for r in levels]
    cycle_rows = [[r["concurrency"], label(r), round(r["cycle"]["cycle_us"])]
                  + [pct(r["cycle"][f"{phase}_share"]) for phase in kitlib.HOST_PHASES]
                  + [round(r["cycle"][f"{phase}_us"]) for phase in kitlib.DEVICE_PHASES]
                  + [pct(r["cycle"]["staged_ahead_share"])]
                  + [round(r["cycle"][f"{phase}_us"]) for phase in kitlib.OFF_CYCLE_PHASES] for r in levels]
    cpu_rows = [[r["concurrency"], label(r), r["client_cpu_s"],
                 ", ".join(f"{group} {seconds}" for group, seconds in sorted(r["server_cpu_s"].items(),
                                                                             key=lambda item: -item[1])[:6])]
                for r in levels]
    numbers = {"model": name, "dtype": dtype, "inprocess": both, "best_rows_per_s": best, "levels": levels,
               "mlp_auto_batch_sizes": auto_sizes}
    details = (kitlib.table(["concurrency", "transport", "rows/s", "of the device's best", "of in-process at the batch",
                             "p50 us", "p99 us", "real/padded rows per batch", "GPU util (median)"], rows)
               + f"\n\nThe device's best: in-process with copies at batch {max(with_copies)}, {best:.0f} rows/s."
               + "\n\nThe batch cycle (per batch; shares of the host cycle, then the device phases inside execute, us):\n\n"
               + kitlib.table(["concurrency", "transport", "cycle us"] + list(kitlib.HOST_PHASES)
                              + [f"{phase} us" for phase in kitlib.DEVICE_PHASES]
                              + ["staged ahead", "assembly ahead us", "complete behind us"], cycle_rows)
               + "\n\nCPU seconds over each level (perf_analyzer; the server by thread group):\n\n"
               + kitlib.table(["concurrency", "transport", "client", "server"], cpu_rows)
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
    if not all(r["cycle"]["cycle_us"] > 0 for r in levels):
        failures.append("a level has no batch cycle in /metrics (sluice_batch_phase_seconds_total)")
    if not kitlib.NO_GPU and not all(r["cycle"]["forward_us"] > 0 for r in levels):
        failures.append("a level has no device phases (CUDA events) in /metrics")
    if failures:
        return kitlib.gpu_outcome(False, "; ".join(failures), numbers, details)
    staged = [r for r in levels if r["stage_ahead"]]
    plateau = max(staged, key=lambda r: r["infer_per_s"])
    twin, same = levels[-1], staged[-1]
    return kitlib.gpu_outcome(True, f"{name}: " + "; ".join(
        f"c={r['concurrency']}{' shm' if r['transport'] == 'shm' else ''} {r['infer_per_s']:.0f}/s "
        f"({r['ratio_to_best']:.2f} of best, idle {pct(r['cycle']['idle_share'])})" for r in staged)
        + f"; plateau {plateau['infer_per_s']:.0f}/s = {plateau['ratio_to_best']:.2f} of the device's best"
        + f"; at c={same['concurrency']} {same['transport']} {same['infer_per_s']:.0f}/s as configured "
          f"(staging ahead on a GPU), {twin['infer_per_s']:.0f}/s with it off "
          f"({same['infer_per_s'] / max(twin['infer_per_s'], 1e-9):.2f}x)"
        + f"; mlp auto batch sizes {auto_sizes['sizes'] or 'none'}", numbers, details)


if __name__ == "__main__":
    kitlib.run_step(body)
