#!/usr/bin/env python3
"""Cold start: how the first request at each shape compares with the steady state, with the
server's warm-up on and off, on the bundled MLP and conv net.

    .venv/bin/python benchmarks/cold_start_benchmark.py [--smoke] [--json out.json] [--device cpu|cuda]

For each model and mode (--warmup true / false) a fresh server is started; the time until it is
ready is recorded; then one request at each batch size (the first request of that shape), then
`--requests` more at each batch size back to back, whose median is the steady-state p50, then
`--idle-requests` at each batch size each after `--idle-s` of silence, whose median is the idle
p50: what any request pays after the server sat idle (CPU caches refilled, threads woken), which is
what a first request also pays on top of its shape's cold start. Each figure is the median over
`--starts` fresh servers. Latency is measured by
the client (tritonclient, one request at a time, after the channel is open). On the CPU the
TorchScript profiling executor's first runs make the difference; on a GPU, cuDNN's algorithm
search too. Target: with warm-up on, the first request at every shape within 1.5x of the
steady-state p50.

Prints a table and writes JSON. --smoke runs a tiny version (the test command runs it so the
script keeps working); its numbers mean nothing.
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from harness.bench import MODELS, ROOT, make_repository, serve, write_json  # noqa: E402

TARGET_FIRST_OVER_P50 = 1.5


def measure(url, model, row_shape, batch_sizes, requests, idle_requests, idle_s):
    import tritonclient.grpc as grpcclient
    client = grpcclient.InferenceServerClient(url=url)
    client.get_model_metadata(model)  # opens the channel: no connection set-up in any latency
    rng = np.random.default_rng(0)
    inputs = {}
    for batch in batch_sizes:
        data = rng.random((batch, *row_shape), dtype=np.float32)
        name = "INPUT__0" if model == "mlp" else "image"
        tensor = grpcclient.InferInput(name, list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        inputs[batch] = tensor

    # One Infer call to a model that does not exist: the client's and the server's Infer path run
    # once (an error, before any model), so that the first measured request is the model's
    # first, not the RPC path's.
    try:
        client.infer("__cold_start_probe__", [inputs[batch_sizes[0]]])
    except Exception:  # noqa: BLE001 - NOT_FOUND is the point
        pass

    def timed(batch):
        started = time.perf_counter()
        client.infer(model, [inputs[batch]])
        return (time.perf_counter() - started) * 1e6

    def after_idle(batch):
        time.sleep(idle_s)
        return timed(batch)

    first = {batch: timed(batch) for batch in batch_sizes}
    steady = {batch: statistics.median(timed(batch) for _ in range(requests)) for batch in batch_sizes}
    idle = {batch: statistics.median(after_idle(batch) for _ in range(idle_requests)) for batch in batch_sizes}
    client.close()
    return first, steady, idle


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    parser.add_argument("--json", default=os.path.join(ROOT, "build", "cold_start_benchmark.json"))
    parser.add_argument("--smoke", action="store_true", help="a tiny run that only checks the script works")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--requests", type=int, default=30, help="requests per shape for the steady state")
    parser.add_argument("--idle-requests", type=int, default=5, help="requests per shape after silence")
    parser.add_argument("--idle-s", type=float, default=0.3, help="silence before each idle request")
    parser.add_argument("--starts", type=int, default=3,
                        help="fresh servers per model and mode; each figure is the median over them")
    args = parser.parse_args()
    names = ["mlp"] if args.smoke else list(MODELS)
    requests = 3 if args.smoke else args.requests
    idle_requests, idle_s = (1, 0.05) if args.smoke else (args.idle_requests, args.idle_s)
    starts = 1 if args.smoke else args.starts

    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        repository = os.path.join(workdir, "models")
        make_repository(repository, batching=False, names=names)
        for name in names:
            row_shape, max_batch = MODELS[name]
            batch_sizes = [1, 2] if args.smoke else [b for b in (1, 2, 4, 8, 16, 32, 64) if b <= max_batch]
            for warmup in (True, False):
                runs = []
                for _ in range(starts):
                    started = time.monotonic()
                    process, url = serve(args.bin_dir, repository,
                                         ["--device", args.device, "--warmup", "true" if warmup else "false"])
                    ready_s = time.monotonic() - started
                    try:
                        runs.append((ready_s, *measure(url, name, row_shape, batch_sizes, requests,
                                                       idle_requests, idle_s)))
                    finally:
                        process.terminate()
                        process.wait(timeout=30)
                ready_s = statistics.median(run[0] for run in runs)
                first, steady, idle = ({b: statistics.median(run[i][b] for run in runs) for b in batch_sizes}
                                       for i in (1, 2, 3))
                ratios = {b: first[b] / steady[b] for b in batch_sizes}
                idle_ratios = {b: first[b] / idle[b] for b in batch_sizes}
                rows.append({
                    "model": name, "warmup": warmup, "device": args.device, "time_to_ready_s": ready_s,
                    "shapes": [{"batch": b, "first_us": first[b], "steady_p50_us": steady[b],
                                "idle_p50_us": idle[b], "first_over_p50": ratios[b],
                                "first_over_idle_p50": idle_ratios[b]} for b in batch_sizes],
                    "worst_first_over_p50": max(ratios.values()),
                    "median_first_over_p50": statistics.median(ratios.values()),
                    "worst_first_over_idle_p50": max(idle_ratios.values()),
                    "target_met": max(ratios.values()) <= TARGET_FIRST_OVER_P50,
                })

    print(f"\nCold start ({args.device}): first request at each shape vs the steady-state p50 "
          f"(target with warm-up: <= {TARGET_FIRST_OVER_P50}x at every shape)")
    print(f"{'model':8} {'warmup':6} {'ready s':>8} {'batch':>5} {'first us':>10} {'p50 us':>9} "
          f"{'idle p50':>9} {'first/p50':>9} {'first/idle':>10}")
    for row in rows:
        for shape in row["shapes"]:
            print(f"{row['model']:8} {('on' if row['warmup'] else 'off'):6} {row['time_to_ready_s']:8.2f} "
                  f"{shape['batch']:5d} {shape['first_us']:10.0f} {shape['steady_p50_us']:9.0f} "
                  f"{shape['idle_p50_us']:9.0f} {shape['first_over_p50']:9.2f} {shape['first_over_idle_p50']:10.2f}")
        print(f"{'':8} {'':6} {'':8} worst first/p50 {row['worst_first_over_p50']:.2f} "
              f"({'met' if row['target_met'] else 'not met'} for the target), "
              f"worst first/idle p50 {row['worst_first_over_idle_p50']:.2f}")
    result = {"benchmark": "cold_start", "smoke": args.smoke, "target_first_over_p50": TARGET_FIRST_OVER_P50,
              "rows": rows}
    write_json(args.json, result)


if __name__ == "__main__":
    main()
