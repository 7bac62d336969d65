"""Batching to a latency target (issue 34) on this machine's GPU: benchmarks/latency_target_benchmark.py's
comparison for the bundled conv net served on the GPU, in one server: a (no delay), b (the best of two
fixed delays at 1x), c (sluice.latency_target_us), under open-loop Poisson load at 0.5x, 1x and 3x the
model's closed-loop capacity measured first, with the benchmark's client-side target of 3 x (in-process
batch-1 p50 on the GPU + the bare gRPC echo's c=1 p50). One repetition and short windows (the CPU
benchmark takes medians of three): goodput, answered p50/p99 and refusals per variant and load, and
issue 34's verdicts. On a machine with 6 CPUs or more the server gets 4 of them and the client a
fifth, all kept out of idle (harness.bench.awake): as on a GPU host, gRPC's threads, the batcher and
the worker that launches the kernels do not share one CPU (on the CPU machines they must, and the
time a request waits there to be read is what kept c's p99 over the target, docs/guide/performance.md);
with fewer, server and client on one CPU each. The echo and the in-process reference that set the
target run on the server's first CPU either way.
The CPU dry run: the benchmark's smoke mode (the MLP at 1x, tiny windows) on the CPU."""
# kit-timeout: 170
import os
import shutil

import kitlib
import latency_target_benchmark as lt
from harness.bench import awake, pinning

LOADS = (0.5, 1.0, 3.0)
SERVER_CPUS = 4


def placement(cpus):
    """(prefixes for the echo/in-process references and the client, the server's own prefix or
    None, the CPUs to keep awake, a note) for the CPUs this process may use (sorted)."""
    if len(cpus) >= SERVER_CPUS + 2 and shutil.which("taskset"):
        server = cpus[:SERVER_CPUS]
        client = cpus[SERVER_CPUS]
        prefixes = (("taskset", "-c", str(server[0])), ("taskset", "-c", str(client)))
        server_prefix = ("taskset", "-c", ",".join(map(str, server)))
        note = (f"server on CPUs {','.join(map(str, server))}, client on CPU {client} (the echo and in-process "
                f"references on CPU {server[0]})")
        return prefixes, server_prefix, server + [client], note
    prefixes, note = pinning(True)
    return prefixes, None, cpus[:2], note


def body():
    work = os.path.join(kitlib.WORK, "latency_target")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    prefixes, server_prefix, pinned, pin_note = placement(sorted(os.sched_getaffinity(0)))
    name = "mlp" if kitlib.NO_GPU else "convnet"
    with awake(not kitlib.NO_GPU, pinned) as awake_note:
        if kitlib.NO_GPU:
            model = lt.measure_model(name, kitlib.BIN, prefixes, work, True, server_prefix=server_prefix)
        else:
            model = lt.measure_model(name, kitlib.BIN, prefixes, work, False, seconds=1.5, warmup=0.5, reps=1,
                                     loads=LOADS, delay_shares=(1 / 8, 1 / 4), device=kitlib.device(),
                                     inprocess_seconds=0.2, server_prefix=server_prefix)
    for figures in model["loads"].values():
        figures.pop("raw", None)  # the medians of one repetition are the windows themselves
    numbers = {"pinning": pin_note, "awake": awake_note, name: model}
    rows = [[share, variant, round(f["goodput_per_s"]), round(f["answered_p50_us"]), round(f["answered_p99_us"]),
             round(f["refused"]), round(f["ok"]), verdict] for share, variant, f, verdict in lt.rows(model)]
    details = kitlib.table(["load", "variant", "goodput/s", "answered p50 us", "answered p99 us", "refused", "ok",
                            "c vs best(a, b)"], rows)
    details += (f"\n\n{name} on {kitlib.device()}: client-side target {model['target_us']} us (in-process batch-1 "
                f"{model['inprocess_batch1_p50_us']:.0f} us, echo c=1 {model['echo_c1_p50_us']:.0f} us), c's "
                f"sluice.latency_target_us {model['server_target_us']}, capacity {model['capacity_per_s']:.0f}/s, b's "
                f"delay {model['delay_chosen_us']} us. Pinning: {pin_note}; {awake_note}.")
    ratios = "/".join(f"{figures['c_goodput_ratio']:.2f}" for figures in model["loads"].values())
    summary = (f"{name} on {kitlib.device()}, target {model['target_us']} us, capacity {model['capacity_per_s']:.0f}/s: "
               f"c's goodput over the best of a and b at {'/'.join(model['loads'])}x load: {ratios}")
    return kitlib.gpu_outcome(True, summary, numbers, details)


if __name__ == "__main__":
    kitlib.run_step(body)
