"""Triton's perf_analyzer as the benchmarks run it: one copy of finding it, its measurement flags
and reading the CSV it writes."""
import csv
import os
import shutil
import subprocess

from harness.repository import ROOT


# Short time windows that accept any spread: for runs that check that perf_analyzer works against
# the server, not how fast it is. (Count windows last about a second each whatever the count, so
# a two-level run took 6 s for 0.3 s of requests; 500 ms windows take 3.5 s and still hold
# hundreds of requests of a bundled model on a loaded host.)
SMOKE_WINDOW_MS = 500
SMOKE_WINDOWS = ["--measurement-mode", "time_windows", "--measurement-interval", str(SMOKE_WINDOW_MS),
                 "--stability-percentage", "1000"]
# perf_analyzer still wants three windows within that spread of each other; a window of 4 MiB
# answers at concurrency 16 on a loaded host can come up nearly empty, so a smoke run may take
# more than three windows to find three that agree (it failed once at three).
SMOKE_MAX_TRIALS = 10


def path():
    """perf_analyzer from the PATH, else the one scripts/setup.sh puts in .venv/bin."""
    found = shutil.which("perf_analyzer") or os.path.join(ROOT, ".venv", "bin", "perf_analyzer")
    if not os.path.exists(found):
        raise RuntimeError("perf_analyzer not found on PATH or in .venv/bin (scripts/setup.sh installs it)")
    return found


def run(url, model, concurrency, out_csv, *, smoke=False, protocol=("-i", "grpc"), asynchronous=True,
        interval_ms=2000, stability=50, max_trials=5, prefix=(), extra=(), binary=None, log_path=None,
        timeout=300):
    """One perf_analyzer run at batch 1 and `concurrency`; the first row of its CSV (a dict of
    perf_analyzer's columns: "Inferences/Second", "p50 latency", ... in us). A measured run takes
    windows of `interval_ms` until two are within `stability` percent (at most `max_trials`); a
    smoke run (it checks the script, its numbers mean nothing) takes windows of SMOKE_WINDOW_MS
    (three, or up to SMOKE_MAX_TRIALS) and accepts a wide spread. `asynchronous`: one client
    thread for every concurrent request (--async) instead of a thread each. `extra`: more
    perf_analyzer flags (--shape ...); `binary`: a perf_analyzer other than path()'s; `log_path`:
    its command line and output go to that file as it runs (a caller killed meanwhile keeps them). RuntimeError with perf_analyzer's output
    when it fails or runs over `timeout` seconds."""
    args = [*prefix, binary or path(), "-m", model, "-u", url, *protocol, "-b", "1",
            "--concurrency-range", str(concurrency), "-f", out_csv,
            "--max-trials", str(max(max_trials, SMOKE_MAX_TRIALS) if smoke else max_trials)]
    if asynchronous:
        args.append("--async")
    if smoke:
        args += SMOKE_WINDOWS
    else:
        args += ["--measurement-interval", str(interval_ms), "--stability-percentage", str(stability)]
    args += list(extra)
    what = f"for {model} {' '.join(protocol)} at concurrency {concurrency}"
    log = open(log_path, "w+") if log_path else None
    try:
        if log:
            log.write(" ".join(args) + "\n")
            log.flush()
        try:
            result = subprocess.run(args, stdout=log or subprocess.PIPE, stderr=subprocess.STDOUT if log else subprocess.PIPE,
                                    text=True, timeout=timeout)
        except subprocess.TimeoutExpired as expired:
            raise RuntimeError(f"perf_analyzer did not finish in {timeout} s {what}:\n{_output(log, expired.stdout, expired.stderr)}") from None
        if result.returncode != 0 or not os.path.exists(out_csv):
            raise RuntimeError(f"perf_analyzer failed {what} (exit {result.returncode}):\n{_output(log, result.stdout, result.stderr)}")
    finally:
        if log:
            log.close()
    with open(out_csv) as f:
        return next(csv.DictReader(f))


def _output(log, stdout, stderr):
    """The end of what perf_analyzer wrote: its log file's, or the captured streams'."""
    if log:
        log.flush()
        log.seek(0)
        return log.read()[-6000:]
    decode = (lambda text: text.decode(errors="replace") if isinstance(text, bytes) else text or "")
    return f"{decode(stdout)[-3000:]}\n{decode(stderr)[-3000:]}"
