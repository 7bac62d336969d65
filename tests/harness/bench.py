"""What the benchmark scripts share: the bundled models they drive, pinning server and client to
different CPUs, keeping those CPUs out of idle, a repository of bundled models with or without dynamic batching, a server
started for a benchmark, a model's request and execution counts, and writing the JSON report."""
import contextlib
import json
import os
import shutil
import signal

from harness.repository import ROOT, write_bundled  # noqa: F401 (ROOT: for the scripts)
from harness.server import SluiceServer

MODELS = {
    # name: (row shape, max_batch_size) of the bundled models the benchmarks drive
    "mlp": ([784], 64),
    "convnet": ([3, 32, 32], 32),
}


def write_json(path, report):
    """`report` as indented JSON at `path` (its folder made if missing)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(report, f, indent=2)
    print(f"\nwrote {path}")


def pinning(enabled):
    """((server prefix, client prefix), note): taskset onto two different CPUs, or nothing (and
    why, in the note)."""
    cpus = sorted(os.sched_getaffinity(0))
    if not enabled:
        return ((), ()), "off (--no-pin)"
    if len(cpus) < 2 or shutil.which("taskset") is None:
        return ((), ()), f"off ({len(cpus)} CPU(s), taskset {'found' if shutil.which('taskset') else 'missing'})"
    return ((("taskset", "-c", str(cpus[0])), ("taskset", "-c", str(cpus[1]))),
            f"server on CPU {cpus[0]}, client on CPU {cpus[1]}")


@contextlib.contextmanager
def awake(enabled, cpus=None):
    """Keeps `cpus` (default: every CPU this process may use) out of idle while the block runs:
    one loop per CPU at SCHED_IDLE, the lowest class, calling sched_yield() without pause. On a
    virtual machine whose host is busy, a CPU that goes idle is slow to wake: the bare gRPC echo
    at concurrency 1 measured 1,700 us there against 130 us with the CPUs kept awake, and that
    wake-up, not the server, then decides every latency measured.

    The loop yields rather than spins because a thread that wakes on its CPU must get it at once,
    whatever its policy. On Linux 6.18 a `SCHED_BATCH` thread (sluice-server's gRPC threads, see
    --model-threads-first) that wakes on a CPU where a SCHED_IDLE loop spins in user space waited
    for the next scheduler tick: the MLP's c=1 p50 was 3,972 us with a spinning loop, 274 us with
    this one, 310 us with none (2026-12-05). A loop that enters the kernel on every turn hands the
    CPU over there. (A ping-pong between two bare processes, over a pipe or loopback TCP, did not
    show the delay; sluice-server's gRPC poller did, 3.6 to 4.0 ms of scheduling delay per request
    in `perf sched timehist`, the tick of this kernel's HZ=250.)

    Yields a note for the report."""
    cpus = sorted(os.sched_getaffinity(0)) if cpus is None else cpus
    if not enabled or not hasattr(os, "SCHED_IDLE"):
        yield "off"
        return
    children = []
    try:
        for cpu in cpus:
            pid = os.fork()
            if pid == 0:  # the loop: nothing but yielding, killed by the parent
                try:
                    os.sched_setaffinity(0, {cpu})
                    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
                    while True:
                        os.sched_yield()
                finally:
                    os._exit(0)
            children.append(pid)
        yield f"CPUs {', '.join(map(str, cpus))} kept awake (a SCHED_IDLE sched_yield() loop each)"
    finally:
        for pid in children:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def make_repository(directory, batching, names):
    """The bundled models `names` in the new repository `directory`, with dynamic batching (its
    defaults) or without."""
    os.makedirs(directory)
    write_bundled(directory, names, "dynamic_batching { }" if batching else None)


def model_stats(url, model):
    """`model`'s ModelStatistics message (tritonclient's gRPC client, one call)."""
    import tritonclient.grpc as grpcclient
    client = grpcclient.InferenceServerClient(url=url)
    try:
        return client.get_inference_statistics(model).model_stats[0]
    finally:
        client.close()


def statistics(url, model):
    """(inference count, execution count) of `model` from the server's statistics."""
    stats = model_stats(url, model)
    return stats.inference_count, stats.execution_count


def batch_executions(stats):
    """{batch size: executions so far} of a ModelStatistics message (model_stats: its batch_stats,
    compute_infer's count): two readings' difference is the distribution of the batches a window
    formed."""
    return {int(b.batch_size): int(b.compute_infer.count) for b in stats.batch_stats}


def executions_between(before, after):
    """{batch size: executions} formed between two batch_executions() readings (sizes with none
    left out)."""
    return {size: count - before.get(size, 0) for size, count in sorted(after.items())
            if count - before.get(size, 0) > 0}


def start_server(bin_dir, repository, extra_args=(), prefix=(), log_level="warn", timeout=60, metrics_port=0):
    """Starts sluice-server on `repository` (behind `prefix`, e.g. taskset; its log in
    `repository`.log; its HTTP endpoint on a port it picks, which the log names; its metrics on
    `metrics_port`, harness.server's) and returns its harness.server.SluiceServer once it is ready
    (a lost port race starts it again). metrics_port=FREE: the caller reads server.metrics_text()."""
    server = SluiceServer(os.path.join(bin_dir, "sluice-server"), repository, extra_args,
                          log_path=repository + ".log", prefix=prefix, log_level=log_level,
                          metrics_port=metrics_port, http_port=0)
    server.start(timeout)
    return server


def serve(bin_dir, repository, extra_args=(), prefix=(), log_level="warn", timeout=60):
    """start_server's server as (process, url)."""
    server = start_server(bin_dir, repository, extra_args, prefix, log_level, timeout)
    return server.process, server.url
