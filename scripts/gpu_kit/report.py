"""Writes the GPU proof kit's three result files from what the steps have left so far:
gpu-report.md, gpu-report.json and gpu-logs.tar.gz (every step's folder without model files).
run.sh calls it after every step, so a run cut short still returns what finished."""
import argparse
import glob
import json
import os
import tarfile

STATUS_MARK = {"pass": "PASS", "fail": "FAIL", "skipped": "SKIPPED"}


def read_steps(work):
    steps = []
    for directory in sorted(glob.glob(os.path.join(work, "steps", "*"))):
        name = os.path.basename(directory)
        path = os.path.join(directory, "result.json")
        try:
            with open(path) as f:
                result = json.load(f)
        except (OSError, ValueError):
            result = {"status": "running", "summary": "still running (or cut off)"}
        steps.append({"name": name, **result})
    return steps


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--kit", required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--elapsed", type=int, default=0)
    args = parser.parse_args()

    with open(os.path.join(args.kit, "MANIFEST.json")) as f:
        manifest = json.load(f)
    machine = ""
    machine_path = os.path.join(args.work, "machine.txt")
    if os.path.exists(machine_path):
        with open(machine_path, errors="replace") as f:
            machine = f.read()
    wheels = ""
    if os.path.exists(os.path.join(args.work, "wheels.txt")):
        with open(os.path.join(args.work, "wheels.txt"), errors="replace") as f:
            wheels = f.read()
    steps = read_steps(args.work)
    counts = {s: sum(1 for step in steps if step["status"] == s) for s in ("pass", "fail", "skipped")}

    report = {"kit": manifest, "elapsed_s": args.elapsed, "counts": counts, "machine": machine,
              "wheels": wheels, "steps": steps}
    with open(os.path.join(args.out, "gpu-report.json"), "w") as f:
        json.dump(report, f, indent=2, default=str)

    lines = [
        "# Sluice GPU proof kit report", "",
        f"Kit built from `{manifest['commit']}` on {manifest['built']} against torch {manifest['torch']} "
        f"(CUDA {manifest['cuda']}); run took {args.elapsed} s. "
        f"Steps: {counts['pass']} passed, {counts['fail']} failed, {counts['skipped']} skipped.", "",
        "| step | status | seconds | summary |", "|---|---|---|---|",
    ]
    for step in steps:
        summary = str(step.get("summary", "")).replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {step['name']} | {STATUS_MARK.get(step['status'], step['status'])} | "
                     f"{step.get('seconds', '')} | {summary} |")
    lines += ["", "## Machine", "", "```", machine.strip(), "```", ""]
    if wheels.strip():
        lines += ["Python packages from the kit:", "", "```", wheels.strip(), "```", ""]
    for step in steps:
        lines += [f"## {step['name']}: {STATUS_MARK.get(step['status'], step['status'])}", "",
                  str(step.get("summary", "")), ""]
        if step.get("numbers"):
            lines += ["```json", json.dumps(step["numbers"], indent=1, default=str)[:6000], "```", ""]
        if step.get("details"):
            lines += [str(step["details"]), ""]
    with open(os.path.join(args.out, "gpu-report.md"), "w") as f:
        f.write("\n".join(lines))

    def small(info):
        return None if info.name.endswith((".pt", ".pt2", ".whl", ".bin")) else info

    with tarfile.open(os.path.join(args.out, "gpu-logs.tar.gz"), "w:gz") as tar:
        for name in ("machine.txt", "wheels.txt"):
            if os.path.exists(os.path.join(args.work, name)):
                tar.add(os.path.join(args.work, name), arcname=name)
        tar.add(os.path.join(args.work, "steps"), arcname="steps", filter=small)


if __name__ == "__main__":
    main()
