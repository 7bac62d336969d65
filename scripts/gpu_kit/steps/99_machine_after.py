"""The machine after the run, so that a later reader can tell the kit's figures from the machine's
state: GPU processes and memory left behind (a server a step failed to stop), ECC error counters,
retired pages and remapped rows, clocks and throttle reasons, persistence and compute mode, and
where libcuda and libnvidia-ml were loaded from (by torch in this process). Xid events live in the
kernel log, which a container rarely may read: it is tried and said so when it cannot. Runs on any
machine (without nvidia-smi it says so and passes) and always, whatever the budget: its cap is held
back from the start."""
# kit-timeout: 20
# kit-always
import os
import shutil
import subprocess

import kitlib

QUERIES = {
    "processes": ["--query-compute-apps=pid,process_name,used_memory", "--format=csv"],
    "memory_and_modes": ["--query-gpu=index,uuid,memory.used,memory.total,persistence_mode,compute_mode,"
                         "ecc.errors.uncorrected.volatile.total,ecc.errors.corrected.volatile.total,"
                         "clocks.sm,clocks.max.sm,clocks.mem,clocks_throttle_reasons.active,temperature.gpu,"
                         "power.draw", "--format=csv"],
    "ecc_and_pages": ["-q", "-d", "ECC,PAGE_RETIREMENT,ROW_REMAPPER"],
    "clocks": ["-q", "-d", "CLOCK,PERFORMANCE"],
}


def run(args, name):
    try:
        code, text = kitlib.run_logged(args, name, timeout=5)
    except RuntimeError as error:
        return f"(failed: {error})"
    return text.split("\n", 1)[1] if code == 0 else f"(exit {code}) " + text


def loaded_from():
    """Where this process's dynamic loader found libcuda and libnvidia-ml (torch loads libcuda;
    NVML is opened here the way the server opens it)."""
    found = {}
    try:
        import ctypes
        import torch
        if torch.cuda.is_available():
            torch.cuda.init()
        try:
            ctypes.CDLL("libnvidia-ml.so.1")
        except OSError as error:
            found["libnvidia-ml"] = f"not loadable: {error}"
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1] if len(line.split()) >= 6 else ""
                for library in ("libcuda.so", "libnvidia-ml.so"):
                    if os.path.basename(path).startswith(library):
                        found.setdefault(library.split(".")[0], os.path.realpath(path))
    except Exception as error:  # noqa: BLE001 - a report, never a failure of the step
        found["error"] = str(error)
    return found


def body():
    if shutil.which("nvidia-smi") is None:
        libraries = loaded_from()
        details = "nvidia-smi not found on PATH: nothing to record about a GPU.\n\nLibraries: " + str(libraries)
        return "pass", "no nvidia-smi on this machine: no GPU state to record", {"libraries": libraries}, details
    sections = {key: run(["nvidia-smi", *args], f"nvidia-smi_{key}.txt") for key, args in QUERIES.items()}
    try:
        xid = subprocess.run(["dmesg", "--level=err,warn"], capture_output=True, text=True, timeout=5)
        lines = [line for line in xid.stdout.splitlines() if "Xid" in line or "NVRM" in line]
        sections["xid"] = "\n".join(lines[-30:]) if xid.returncode == 0 else f"dmesg not readable: {xid.stderr.strip()}"
    except (OSError, subprocess.SubprocessError) as error:
        sections["xid"] = f"dmesg not runnable: {error}"
    processes = [line for line in sections["processes"].splitlines()[1:] if line.strip()]
    libraries = loaded_from()  # after the queries: this process's own context is not a leftover
    numbers = {"leftover_gpu_processes": processes, "libraries": libraries,
               "memory_and_modes": sections["memory_and_modes"].strip()}
    details = "\n\n".join(f"{key}:\n\n```\n{text.strip()[:4000]}\n```" for key, text in sections.items())
    details += f"\n\nLibraries: {libraries}"
    summary = (f"{len(processes)} GPU process(es) left; " + sections["memory_and_modes"].strip().splitlines()[-1][:200]
               if sections["memory_and_modes"].strip() else f"{len(processes)} GPU process(es) left")
    # Our own servers still holding the GPU after their steps is the kit's (or the server's) bug.
    ours = [p for p in processes if "sluice" in p or "perf_analyzer" in p]
    if ours:
        return "fail", f"Sluice processes still on the GPU after the run: {ours}"[:400], numbers, details
    return "pass", summary, numbers, details


if __name__ == "__main__":
    kitlib.run_step(body)
