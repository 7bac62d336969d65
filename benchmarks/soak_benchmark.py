#!/usr/bin/env python3
"""Soak: steady mixed traffic for a long time; the server's memory must stop growing once warm.

    .venv/bin/python benchmarks/soak_benchmark.py [--minutes 10] [--smoke] [--json out.json]

Not part of the test command (which runs --smoke, a few seconds, to keep the script working).
The server serves the bundled mlp and convnet with dynamic batching. Four client threads send,
for --minutes:
  - valid requests of 1-4 rows to either model (most of the traffic),
  - every 20th request with a wrong shape (must be INVALID_ARGUMENT),
  - every 25th request with a 1 ms deadline (DEADLINE_EXCEEDED, or an answer),
  - every 50th call a ModelStatistics and a ModelMetadata call,
and one thread loads nothing but RepositoryIndex every second. Any other outcome counts as an
unexpected error. RSS is sampled every second. The first tenth of the run (at least 60 s) is
warm-up; the baseline is the median RSS of its last 10 s, the end the median of the last 10 s.
Target: end within 5% of the baseline, no unexpected error, the server exits 0 on SIGTERM.
"""
import argparse
import os
import random
import statistics
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from harness.bench import MODELS, ROOT, make_repository, serve, write_json  # noqa: E402
from harness.process import rss_bytes  # noqa: E402

TARGET_GROWTH = 0.05


def client_loop(url, seed, stop, counts, lock):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException
    rng = random.Random(seed)
    client = grpcclient.InferenceServerClient(url)
    input_names = {name: client.get_model_metadata(name).inputs[0].name for name in MODELS}
    n = 0

    def count(key):
        with lock:
            counts[key] = counts.get(key, 0) + 1

    while not stop.is_set():
        n += 1
        name = rng.choice(sorted(MODELS))
        shape, _ = MODELS[name]
        rows = rng.randint(1, 4)
        bad = n % 20 == 0
        data = np.random.default_rng(n).random((rows, *shape), dtype=np.float32)
        if bad:
            data = data[..., :-1]
        inputs = [grpcclient.InferInput(input_names[name], list(data.shape), "FP32")]
        inputs[0].set_data_from_numpy(data)
        short = n % 25 == 0  # a 1 ms deadline
        try:
            client.infer(name, inputs, client_timeout=0.001 if short else None)
            count("ok")
        except InferenceServerException as error:
            status = error.status()
            if bad and status == "StatusCode.INVALID_ARGUMENT":
                count("invalid_argument")
            elif short and status == "StatusCode.DEADLINE_EXCEEDED":
                count("deadline_exceeded")
            else:
                count(f"unexpected {status}: {error.message()[:80]}")
        if n % 50 == 0:
            client.get_inference_statistics(name)
            client.get_model_metadata(name)
            count("metadata")
    client.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--bin-dir", default=os.path.join(ROOT, "build", "bin"))
    parser.add_argument("--json", default=os.path.join(ROOT, "build", "soak_benchmark.json"))
    args = parser.parse_args()
    seconds = 6.0 if args.smoke else args.minutes * 60
    warmup = 2.0 if args.smoke else max(60.0, seconds / 10)
    window = 1.0 if args.smoke else 10.0
    import tritonclient.grpc as grpcclient
    with tempfile.TemporaryDirectory() as directory:
        repository = os.path.join(directory, "repository")
        make_repository(repository, batching=True, names=sorted(MODELS))
        process, url = serve(args.bin_dir, repository, ["--device", "cpu"])
        stop = threading.Event()
        counts, lock = {}, threading.Lock()
        threads = [threading.Thread(target=client_loop, args=(url, seed, stop, counts, lock)) for seed in range(4)]
        samples = []  # (seconds since start, rss)
        started = time.monotonic()
        for thread in threads:
            thread.start()
        index_client = grpcclient.InferenceServerClient(url)
        try:
            while time.monotonic() - started < seconds:
                time.sleep(1.0 if not args.smoke else 0.25)
                samples.append((time.monotonic() - started, rss_bytes(process.pid)))
                index_client.get_model_repository_index()
        finally:
            stop.set()
            for thread in threads:
                thread.join()
            index_client.close()
            process.terminate()
            exit_code = process.wait(timeout=60)
    baseline = statistics.median(r for t, r in samples if warmup - window <= t <= warmup)
    end = statistics.median(r for t, r in samples if t >= samples[-1][0] - window)
    peak = max(r for _, r in samples)
    growth = end / baseline - 1
    unexpected = {k: v for k, v in counts.items() if k.startswith("unexpected")}
    mib = 2 ** 20
    print(f"\nsoak: {seconds / 60:.1f} min, warm-up {warmup:.0f} s, 4 clients")
    print(f"{'requests ok':>14} {'invalid':>8} {'deadline':>9} {'unexpected':>11}")
    print(f"{counts.get('ok', 0):14} {counts.get('invalid_argument', 0):8} {counts.get('deadline_exceeded', 0):9} "
          f"{sum(unexpected.values()):11}")
    print(f"{'RSS MiB':>14} {'baseline':>9} {'end':>8} {'peak':>8} {'growth':>8} {'target':>8}")
    print(f"{'':>14} {baseline / mib:9.1f} {end / mib:8.1f} {peak / mib:8.1f} {growth * 100:7.2f}% "
          f"{TARGET_GROWTH * 100:7.0f}%")
    for key, value in unexpected.items():
        print(f"  {value} x {key}")
    print(f"exit code on SIGTERM: {exit_code}")
    write_json(args.json, {
        "smoke": args.smoke, "seconds": seconds, "warmup_seconds": warmup, "counts": counts,
        "rss_baseline_mib": baseline / mib, "rss_end_mib": end / mib, "rss_peak_mib": peak / mib,
        "growth": growth, "target_growth": TARGET_GROWTH, "exit_code": exit_code,
        "met": growth < TARGET_GROWTH and not unexpected and exit_code == 0,
        "rss_samples_mib": [(round(t, 1), round(r / mib, 2)) for t, r in samples],
    })
    if exit_code != 0 or unexpected:
        sys.exit(1)


if __name__ == "__main__":
    main()
