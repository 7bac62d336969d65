"""Instructions counted by valgrind's callgrind in a running server, window by window: the server
starts under `command(out_prefix)` with instrumentation off; `window(pid, out_prefix, run)` switches
it on, zeroes the counters, calls run(), dumps and switches it off again, and returns the
instructions every thread executed meanwhile. One copy for the benchmarks that count;
count_requests() is the whole measurement the cost benchmarks share."""
import glob
import os
import re
import subprocess
import time


def command(out_prefix, *extra):
    """The valgrind prefix: callgrind, instrumentation off until a window starts, dumps written to
    `<out_prefix>.<pid>` and `<out_prefix>.<pid>.<n>` (one per explicit dump)."""
    return ["valgrind", "--tool=callgrind", "--instr-atstart=no", *extra, f"--callgrind-out-file={out_prefix}.%p"]


def control(*args):
    """callgrind_control with `args`; RuntimeError with its output when it fails."""
    result = subprocess.run(["callgrind_control", *args], capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        raise RuntimeError(f"callgrind_control {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")


def dumped_instructions(prefix):
    """(Ir, files) of the explicit dumps `<prefix>.<n>` (and `<prefix>.<n>-NN`, one per thread with
    --separate-threads=yes, summed). The `summary:` line is callgrind's own total (the `totals:`
    line, the sum of the cost lines written, differs by a few hundred)."""
    paths = sorted(p for p in glob.glob(prefix + ".*") if re.fullmatch(r"\d+(-\d+)?", p[len(prefix) + 1:]))
    if not paths:
        raise RuntimeError(f"no callgrind dump {prefix}.<n> (files: {glob.glob(prefix + '*')})")
    total = 0
    for path in paths:
        found = {}
        with open(path) as f:
            for line in f:
                if line.startswith(("summary:", "totals:")):
                    key, value = line.split()[:2]
                    found[key] = int(value)
        if not found:
            raise RuntimeError(f"no summary or totals in {path}")
        total += found.get("summary:", found.get("totals:"))
    return total, len(paths)


def window(pid, out_prefix, run):
    """Counts what process `pid` (started under command(out_prefix)) executes while run() runs:
    {"instructions", "dump_files", "seconds"}."""
    pid = str(pid)
    for path in glob.glob(f"{out_prefix}.{pid}.*"):
        os.remove(path)  # earlier windows' dumps
    control("-i", "on", pid)
    control("-z", pid)
    started = time.monotonic()
    run()
    seconds = time.monotonic() - started
    control("-d", pid)
    control("-i", "off", pid)
    instructions, files = dumped_instructions(f"{out_prefix}.{pid}")
    return {"instructions": instructions, "dump_files": files, "seconds": seconds}


def cost_arguments(doc, name):
    """The arguments every cost benchmark takes (--bin-dir, --json, --smoke, --requests, --warm),
    for `name`_benchmark.json; add its own, then parse. The benchmark exits with a clear message
    when valgrind is missing (require_valgrind)."""
    import argparse
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin-dir", default=os.path.join(root, "build", "bin"))
    parser.add_argument("--json", default=os.path.join(root, "build", f"{name}_benchmark.json"))
    parser.add_argument("--smoke", action="store_true", help="a tiny run that only checks the script works")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--warm", type=int, default=30)
    return parser


def require_valgrind():
    import shutil
    import sys
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        sys.exit("valgrind is missing (scripts/setup.sh installs it)")


def count_requests(binary, repository, args, dump, requests, warm, send, settle=0.0, valgrind=True):
    """Starts sluice-server `binary` on `repository` with `args` under callgrind (dumps at
    `dump`.<pid>), calls send() `warm` times, then counts what the server executes over `requests`
    more calls and `settle` seconds after them (for work a request leaves behind, such as a
    background export). window()'s dict plus "requests" and "instructions_per_request".
    `valgrind` False: the same steps without valgrind (a smoke run of a script; nothing counted,
    the instructions are 0)."""
    from harness.server import SluiceServer
    server = SluiceServer(binary, repository, args, log_path=dump + ".log", log_level="warn", metrics_port=0,
                          http_port=None, prefix=command(dump) if valgrind else ())
    try:
        server.start(timeout=600)
        for _ in range(warm):
            send(server.url)

        def run():
            for _ in range(requests):
                send(server.url)
            time.sleep(settle)

        if valgrind:
            counted = window(server.process.pid, dump, run)
        else:
            started = time.monotonic()
            run()
            counted = {"instructions": 0, "dump_files": 0, "seconds": time.monotonic() - started}
    finally:
        server.stop(timeout=120)
    counted.update(requests=requests, instructions_per_request=counted["instructions"] / requests)
    return counted


class MlpRows:
    """send(url) for count_requests: one single-row request to the bundled MLP ("mlp") over gRPC,
    with one tritonclient per server URL; close() closes them."""

    @staticmethod
    def write_repository(directory):
        """The bundled MLP alone in the new repository `directory` (returned), without dynamic
        batching and with one forward-pass thread: OpenMP workers spinning under valgrind count as
        noise."""
        from harness.bench import make_repository
        make_repository(directory, batching=False, names=["mlp"])
        with open(os.path.join(directory, "mlp", "config.pbtxt"), "a") as f:
            f.write('\nparameters { key: "INTRA_OP_THREAD_COUNT" value { string_value: "1" } }\n')
        return directory

    def __init__(self):
        import numpy as np
        self.data = np.random.default_rng(0).random((1, 784), dtype=np.float32)
        self.clients = {}

    def send(self, url):
        import tritonclient.grpc as grpcclient
        if url not in self.clients:
            self.clients[url] = grpcclient.InferenceServerClient(url=url)
        tensor = grpcclient.InferInput("INPUT__0", [1, 784], "FP32")
        tensor.set_data_from_numpy(self.data)
        self.clients[url].infer("mlp", [tensor])

    def close(self):
        for client in self.clients.values():
            client.close()
        self.clients = {}
