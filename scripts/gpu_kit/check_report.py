"""Checks a GPU proof kit report: exactly the three files, every step present and none failed.
With --no-gpu (the self-test here): the steps that need a GPU said `skipped: no GPU`, and the
steps that run on any machine passed. With --expect NAME=STATUS[:SUMMARY_PREFIX] (the budget
self-test on fake steps): those steps, and only those, with exactly that outcome.

    python check_report.py [--no-gpu] [--steps DIR] [--expect NAME=STATUS[:PREFIX] ...] OUT_DIR
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# Steps that run for real without a GPU; every other step needs one.
CPU_STEPS = {"00_loader", "10_print_env", "99_machine_after"}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-gpu", action="store_true")
    parser.add_argument("--steps", default=os.path.join(HERE, "steps"), help="the folder of steps that ran")
    parser.add_argument("--expect", action="append", default=[], help="NAME=STATUS[:SUMMARY_PREFIX]")
    parser.add_argument("out")
    args = parser.parse_args()
    problems = []
    files = sorted(os.listdir(args.out))
    if files != ["gpu-logs.tar.gz", "gpu-report.json", "gpu-report.md"]:
        problems.append(f"the report folder holds {files}, not exactly the three report files")
    with open(os.path.join(args.out, "gpu-report.json")) as f:
        report = json.load(f)
    steps = {step["name"]: step for step in report["steps"]}
    expected = {os.path.splitext(name)[0] for name in os.listdir(args.steps) if name[:1].isdigit()}
    if set(steps) != expected:
        problems.append(f"steps in the report {sorted(steps)} differ from the kit's {sorted(expected)}")
    outcomes = {}
    for spec in args.expect:
        name, _, outcome = spec.partition("=")
        status, _, prefix = outcome.partition(":")
        outcomes[name] = (status, prefix)
    for name, step in sorted(steps.items()):
        print(f"  {name:24} {step['status']:8} {step.get('seconds', '')!s:>6}  {step.get('summary', '')[:150]}")
        summary = step.get("summary", "")
        if outcomes:
            status, prefix = outcomes.get(name, ("(not expected)", ""))
            if step["status"] != status or not summary.startswith(prefix):
                problems.append(f"{name}: {step['status']}: {summary!r}, expected {status}"
                                + (f" starting {prefix!r}" if prefix else ""))
        elif step["status"] not in ("pass", "skipped"):
            problems.append(f"{name}: {step['status']}: {summary}")
        elif summary.startswith("skipped: budget"):
            problems.append(f"{name}: {summary} (the self-test's budget must fit every step's dry run)")
        elif args.no_gpu and name in CPU_STEPS and step["status"] != "pass":
            problems.append(f"{name} must pass without a GPU: {summary}")
        elif args.no_gpu and name not in CPU_STEPS and not (
                step["status"] == "skipped" and summary.startswith("skipped: no GPU")):
            problems.append(f"{name} needs a GPU but did not report `skipped: no GPU`: {summary}")
    for problem in problems:
        print("PROBLEM:", problem)
    print(f"report check: {len(steps)} steps, {len(problems)} problem(s)")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
