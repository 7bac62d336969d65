"""Helpers for the GPU proof kit's steps (see run.sh for the step contract).

`python kitlib.py install-wheels WHEELS_DIR SITE` installs each carried wheel whose package this
python lacks or has in a version outside the range the checks need (wheels/requirements.txt).
"""
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
import traceback
import urllib.request

KIT = os.environ.get("KIT", os.path.dirname(os.path.abspath(__file__)))
WORK = os.environ.get("WORK", "/tmp")
STEP_DIR = os.environ.get("STEP_DIR", WORK)
NO_GPU = os.environ.get("KIT_NO_GPU", "0") == "1"
# run.sh's wrappers (they give only the kit's binaries the kit's libraries and torch's).
BIN = os.environ.get("KIT_BIN", os.path.join(KIT, "bin"))
SERVER = os.path.join(BIN, "sluice-server")

# Per-datatype tolerance for outputs computed on the GPU by the server against the same module
# run by torch on the same GPU: batching and padding may pick other kernels (and TF32 in cuDNN),
# so floats are compared with a tolerance and everything else must be byte-equal.
TOLERANCE = {"FP64": (1e-9, 1e-9), "FP32": (1e-3, 1e-3), "FP16": (1e-2, 1e-2), "BF16": (2e-2, 2e-2)}


def write_result(status, summary, numbers=None, details=""):
    with open(os.path.join(STEP_DIR, "result.json"), "w") as f:
        json.dump({"status": status, "summary": summary, "numbers": numbers or {}, "details": details}, f,
                  indent=2, default=str)


def run_step(body):
    """Runs body() -> (status, summary, numbers, details); an exception is a failure with its
    traceback. In --no-gpu mode a GPU step's body does a CPU dry run: its pass is reported as
    `skipped: no GPU` (its failure stays a failure, so the dry run can catch a broken step)."""
    try:
        status, summary, numbers, details = body()
    except Exception as error:  # noqa: BLE001 - every failure becomes the step's result
        status, summary, numbers = "fail", f"{type(error).__name__}: {error}"[:500], {}
        details = "```\n" + traceback.format_exc()[-4000:] + "\n```"
    write_result(status, summary, numbers, details)
    print(f"{status}: {summary}")


def gpu_outcome(passed, summary, numbers, details):
    """The status for a GPU step's body: pass/fail on a GPU, skipped after a good CPU dry run."""
    if NO_GPU:
        if not passed:
            return "fail", "CPU dry run failed: " + summary, numbers, details
        return "skipped", "skipped: no GPU (CPU dry run of the step passed: " + summary + ")", numbers, details
    return ("pass" if passed else "fail"), summary, numbers, details


def device():
    return "cpu" if NO_GPU else "cuda"


def torch_device():
    return "cpu" if NO_GPU else "cuda:0"


def step_path(*parts):
    path = os.path.join(STEP_DIR, *parts)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return path


def start_server(repository, extra_args=(), name="server", timeout=120.0, ready=True, prefix=()):
    """A sluice-server on free loopback ports, its log in the step's folder, ready when it returns
    (the conftest ServerProcess of the integration tests, so the kit and the tests agree).
    `prefix`: a command that execs it (taskset)."""
    from conftest import ServerProcess
    server = ServerProcess(repository, list(extra_args), log_path=step_path(f"{name}.log"), prefix=prefix)
    deadline = time.monotonic() + timeout
    while True:
        try:
            server.wait_serving(timeout=2, ready=ready)
            return server
        except TimeoutError:
            log = server.log()
            # Every model has had its turn and one failed: it will never be ready.
            if "event=models_loaded all_ready=false" in log or time.monotonic() > deadline:
                server.stop()
                errors = [line for line in log.splitlines() if " error " in line or " critical " in line]
                raise RuntimeError("sluice-server did not become ready: " + " | ".join(errors[-3:])[:1500]) from None
        except Exception:
            server.stop()
            raise


def scrape(metrics_port):
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as response:
        return response.read().decode()


def metric_values(text, name, **labels):
    """Every sample of `name` whose labels include `labels`, as floats."""
    values = []
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        match = re.match(r"^(\w+)(\{[^}]*\})?\s+(\S+)", line)
        if not match or match.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
        if all(found.get(k) == str(v) for k, v in labels.items()):
            values.append(float(match.group(3)))
    return values


# The batch cycle's phases the server exports (sluice_batch_phase_seconds_total): the host phases,
# which follow each other, and the device phases inside execute.
HOST_PHASES = ("idle", "assembly", "execute", "scatter", "complete")
DEVICE_PHASES = ("to_device", "forward", "to_host")
# Work done beside the cycle (sluice.stage_ahead): a staged batch's assembly while the batch
# before it ran, and a batch's completion while the batch staged behind it ran.
OFF_CYCLE_PHASES = ("assembly_ahead", "complete_behind")


def batch_cycle(metrics_text, model):
    """{phase: seconds} of `model`'s batch cycles so far, with "real_rows" and "padding_rows"."""
    totals = {phase: sum(metric_values(metrics_text, "sluice_batch_phase_seconds_total", model=model, phase=phase))
              for phase in HOST_PHASES + DEVICE_PHASES}
    for kind in ("real", "padding"):
        totals[f"{kind}_rows"] = sum(metric_values(metrics_text, "sluice_batch_rows_total", model=model, kind=kind))
    for phase in OFF_CYCLE_PHASES:
        totals[phase] = sum(metric_values(metrics_text, "sluice_batch_phase_seconds_total", model=model, phase=phase))
    totals["staged_ahead"] = sum(metric_values(metrics_text, "sluice_batches_staged_ahead_total", model=model))
    return totals


def cycle_report(after, before, executions):
    """Per batch: us in each phase and the host phases' shares of the cycle, from two batch_cycle
    readings `executions` batches apart."""
    delta = {key: after[key] - before.get(key, 0.0) for key in after}
    batches = max(executions, 1)
    cycle = sum(delta[phase] for phase in HOST_PHASES)
    report = {"real_rows_per_batch": delta["real_rows"] / batches,
              "padded_rows_per_batch": (delta["real_rows"] + delta["padding_rows"]) / batches,
              "cycle_us": cycle / batches * 1e6}
    for phase in HOST_PHASES + DEVICE_PHASES:
        report[f"{phase}_us"] = delta[phase] / batches * 1e6
    for phase in HOST_PHASES:
        report[f"{phase}_share"] = delta[phase] / cycle if cycle > 0 else 0.0
    report["staged_ahead_share"] = delta.get("staged_ahead", 0.0) / batches
    for phase in OFF_CYCLE_PHASES:
        report[f"{phase}_us"] = delta.get(phase, 0.0) / batches * 1e6
    return report


def chosen_batch_sizes(url, model):
    """The batch sizes warm-up chose for `model` (sluice.auto_batch_sizes), from its ModelConfig
    answer: {"sizes": "1,2,4", "rows_per_second": "1:900,2:1700,..."}, empty strings when the rule
    did not apply."""
    import tritonclient.grpc as grpcclient
    client = grpcclient.InferenceServerClient(url=url)
    try:
        parameters = client.get_model_config(model).config.parameters
        return {key: parameters[f"sluice.auto_batch_sizes.{name}"].string_value
                if f"sluice.auto_batch_sizes.{name}" in parameters else ""
                for key, name in (("sizes", "chosen"), ("rows_per_second", "rows_per_second"))}
    finally:
        client.close()


def model_statistics(url, model):
    """Counts and times so far. compute_infer_ns sums over requests, as Triton's: every request
    in a batch adds the batch's time, so per execution it reads rows x the forward pass;
    batch_compute_ns (the batch statistics' sum) counts each execution once."""
    import tritonclient.grpc as grpcclient
    client = grpcclient.InferenceServerClient(url=url)
    try:
        stats = client.get_inference_statistics(model).model_stats[0]
        s = stats.inference_stats
        return {"inferences": stats.inference_count, "executions": stats.execution_count,
                "queue_ns": s.queue.ns, "compute_infer_ns": s.compute_infer.ns, "success": s.success.count,
                "batch_sizes": {b.batch_size: b.compute_infer.count for b in stats.batch_stats},
                "batch_compute_ns": sum(b.compute_infer.ns for b in stats.batch_stats)}
    finally:
        client.close()


def statistics_delta(after, before):
    delta = {k: after[k] - before[k] for k in ("inferences", "executions", "queue_ns", "compute_infer_ns", "success",
                                                  "batch_compute_ns")}
    delta["batch_sizes"] = {b: n - before["batch_sizes"].get(b, 0) for b, n in after["batch_sizes"].items()
                            if n - before["batch_sizes"].get(b, 0) > 0}
    return delta


def run_logged(args, name, timeout):
    """Runs `args` with stdout and stderr going straight to STEP_DIR/<name> (so a cap that kills
    the step keeps what the child wrote); returns (exit code, the file's text)."""
    path = step_path(name)
    with open(path, "w") as log:
        log.write(" ".join(args) + "\n")
        log.flush()
        try:
            code = subprocess.run(args, stdout=log, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            code = None
    with open(path, errors="replace") as f:
        text = f.read()
    if code is None:
        raise RuntimeError(f"{os.path.basename(args[0])} did not finish in {timeout} s: {text[-800:]}")
    return code, text


def perf_analyzer(url, model, concurrency, window_ms, workdir, shape=None, extra=(), timeout=None, tag=""):
    """One perf_analyzer run at a fixed concurrency (three windows of window_ms, any spread), as a
    dict; its output in STEP_DIR (harness.perf_analyzer runs it), named with `tag` when several
    runs share a model and concurrency."""
    from harness.perf_analyzer import run
    row = run(url, model, concurrency, os.path.join(workdir, f"pa_{model}_c{concurrency}{tag}.csv"),
              binary=os.path.join(BIN, "perf_analyzer"), interval_ms=window_ms, stability=1000, max_trials=3,
              extra=[*(["--shape", shape] if shape else []), *extra],
              log_path=step_path(f"perf_analyzer_{model}_c{concurrency}{tag}.txt"),
              timeout=timeout or max(30, window_ms * 6 // 1000))
    return {"concurrency": concurrency, "infer_per_s": float(row["Inferences/Second"]),
            "p50_us": float(row["p50 latency"]), "p99_us": float(row["p99 latency"]),
            "server_queue_us": float(row.get("Server Queue", 0) or 0),
            "server_compute_us": float(row.get("Server Compute Infer", 0) or 0)}


def inprocess(model_file, row_shape, batch_sizes, seconds, dtype="fp32", threads=0, via_runtime=False, timeout=60):
    """sluice-bench-inprocess on this step's device: {batch: {rows_per_s, p50_us, ...}}.
    via_runtime=False: the model alone, its input already where it runs (on a GPU: the input on
    the device, a synchronisation per pass). True: through Sluice's runtime as the server calls
    it, the input in pinned host staging memory, copied to the device and the outputs back to
    the host (what every real request pays besides the model)."""
    args = [os.path.join(BIN, "sluice-bench-inprocess"), "--model", model_file,
            "--row-shape", ",".join(map(str, row_shape)), "--batch-sizes", ",".join(map(str, batch_sizes)),
            "--seconds", str(seconds), "--device", device(), "--dtype", dtype, "--threads", str(threads),
            "--via-sluice-runtime", "true" if via_runtime else "false"]
    name = f"inprocess_{os.path.basename(model_file)}_{'runtime' if via_runtime else 'model'}.txt"
    code, text = run_logged(args, name, timeout)
    if code != 0:
        raise RuntimeError(f"sluice-bench-inprocess exited {code}: {text[-800:]}")
    rows = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    return {row["batch"]: row for row in rows}


def ceilings(model_file, row_shape, batch_sizes, seconds, dtype="fp32"):
    """Both in-process ceilings in one run: {"model": ..., "with_copies": ..., "copies_us":
    {batch: p50 with copies - p50 of the model alone}}."""
    alone = inprocess(model_file, row_shape, batch_sizes, seconds, dtype=dtype)
    copies = inprocess(model_file, row_shape, batch_sizes, seconds, dtype=dtype, via_runtime=True)
    return {"model": alone, "with_copies": copies,
            "copies_us": {b: round(copies[b]["p50_us"] - alone[b]["p50_us"], 1) for b in alone if b in copies}}


def timed_infer(client, model, inputs, outputs=None):
    started = time.perf_counter()
    result = client.infer(model, inputs, outputs=outputs)
    return (time.perf_counter() - started) * 1e6, result


def median(values):
    return statistics.median(values) if values else float("nan")


def table(header, rows):
    """A markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        lines.append("| " + " | ".join(str(cell) for cell in row) + " |")
    return "\n".join(lines)


def write_bundled(root, names, dynamic_batching):
    """The bundled example models `names` (src/models configs, their own dynamic_batching block
    replaced by `dynamic_batching`; weights from their generator) in the repository `root`."""
    from harness.repository import write_bundled as write
    write(root, names, dynamic_batching)


def copy_model(root, source, target, edits):
    """<root>/<target>: a copy of the model <root>/<source>, named `target`, with each
    (pattern, replacement) of `edits` applied to its config (each must match)."""
    shutil.copytree(os.path.join(root, source), os.path.join(root, target))
    path = os.path.join(root, target, "config.pbtxt")
    with open(path) as f:
        config = re.sub(r'^name:\s*"[^"]*"', f'name: "{target}"', f.read(), flags=re.M)
    for pattern, replacement in edits:
        config, count = re.subn(pattern, replacement, config)
        if count == 0:
            raise RuntimeError(f"nothing matches {pattern!r} in {path}")
    with open(path, "w") as f:
        f.write(config)


def resnet_geometry():
    """(torchvision model, image side, batch sizes, dtypes): ResNet-18 at 32x32 and two sizes in
    the CPU dry run, ResNet-50 at 224x224 on a GPU."""
    if NO_GPU:
        return "resnet18", 32, (1, 2), ("fp32",)
    return "resnet50", 224, (1, 8, 32, 64), ("fp32", "fp16")


def traced_resnet(dtype):
    """WORK/models/resnet_<dtype>.pt, traced on this step's device (made once, reused)."""
    import torchvision
    arch, side, _, _ = resnet_geometry()
    path = os.path.join(WORK, "models", f"resnet_{dtype}.pt")
    if os.path.exists(path):
        return path
    os.makedirs(os.path.dirname(path), exist_ok=True)
    import torch
    torch.manual_seed(0)
    model = getattr(torchvision.models, arch)(weights=None).eval().to(torch_device())
    example = torch.randn(1, 3, side, side, device=torch_device())
    if dtype == "fp16":
        model, example = model.half(), example.half()
    with torch.no_grad():
        traced = torch.jit.trace(model, example)
    traced.save(path)
    return path


def write_resnet(root, name, dtype, sizes, benchmark, max_queue_delay_us=0):
    """<root>/<name>: the traced ResNet (traced_resnet) with dynamic batching, padded to the
    preferred sizes `sizes`, and cuDNN benchmark mode `benchmark` (on, off or auto)."""
    _, side, _, _ = resnet_geometry()
    data_type = "TYPE_FP16" if dtype == "fp16" else "TYPE_FP32"
    delay = f" max_queue_delay_microseconds: {max_queue_delay_us}" if max_queue_delay_us else ""
    os.makedirs(os.path.join(root, name, "1"))
    shutil.copy(traced_resnet(dtype), os.path.join(root, name, "1", "model.pt"))
    with open(os.path.join(root, name, "config.pbtxt"), "w") as f:
        f.write(f"""max_batch_size: {max(sizes)}
input [ {{ name: "INPUT__0" data_type: {data_type} format: FORMAT_NCHW dims: [ 3, {side}, {side} ] }} ]
output [ {{ name: "OUTPUT__0" data_type: {data_type} dims: [ 1000 ] }} ]
instance_group [ {{ kind: KIND_GPU count: 1 }} ]
dynamic_batching {{ preferred_batch_size: [ {", ".join(map(str, sizes))} ]{delay} }}
parameters {{ key: "sluice.pad_batch_to_preferred" value {{ string_value: "true" }} }}
parameters {{ key: "sluice.cudnn_benchmark" value {{ string_value: "{benchmark}" }} }}
""")


def install_wheels(wheels_dir, site):
    """Installs each wheel of requirements.txt (name, range, file) that this python needs."""
    from importlib import metadata
    from packaging.specifiers import SpecifierSet
    needed = []
    with open(os.path.join(wheels_dir, "requirements.txt")) as f:
        for line in f:
            if not line.strip():
                continue
            name, wanted, file = line.split()
            try:
                have = metadata.version(name)
            except metadata.PackageNotFoundError:
                have = None
            install = have is None or have not in SpecifierSet(wanted)
            if install:
                needed.append(os.path.join(wheels_dir, file))
            print(f"{name}: have {have or 'none'}, need {wanted}: {'installing ' + file if install else 'kept'}")
    if needed:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--disable-pip-version-check", "--target", site, *needed], check=True)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "install-wheels":
        install_wheels(sys.argv[2], sys.argv[3])
    else:
        sys.exit("usage: kitlib.py install-wheels WHEELS_DIR SITE")
