"""Instructions counted by valgrind's callgrind in a running server, window by window: the server
starts under `command(out_prefix)` with instrumentation off; `window(pid, out_prefix, run)` switches
it on, zeroes the counters, calls run(), dumps and switches it off again, and returns the
instructions every thread executed meanwhile. One copy for the benchmarks that count."""
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
