"""The `gpu`-labelled tests: the runtime's GPU gtests (torch_backend_gpu_test) and the GPU
integration tests (tests/integration/test_gpu.py: bundled models on --device cuda against torch,
per-model cuDNN benchmark with warm-up on every GPU instance, --print-env). Its load/unload cycle
test is left to the 50_memory_cycles step, which measures the same with numbers, and its .pt2
test to 35_aoti_package, which compiles and serves the same package under its own time cap."""
# kit-timeout: 90
import json
import os
import subprocess
import xml.etree.ElementTree as ElementTree

import kitlib


def gtests():
    report = kitlib.step_path("gtest.json")
    result = subprocess.run([os.path.join(kitlib.BIN, "torch_backend_gpu_test"), f"--gtest_output=json:{report}"],
                            capture_output=True, text=True, timeout=60)
    with open(kitlib.step_path("gtest.log"), "w") as f:
        f.write(result.stdout + result.stderr)
    if not os.path.exists(report):
        raise RuntimeError(f"torch_backend_gpu_test exited {result.returncode} without a report:\n"
                           f"{(result.stdout + result.stderr)[-1500:]}")
    with open(report) as f:
        data = json.load(f)
    cases = [case for suite in data["testsuites"] for case in suite["testsuite"]]
    failed = [case["name"] for case in cases if case.get("failures")]
    skipped = [case["name"] for case in cases if case.get("result") == "SKIPPED"]
    return {"tests": len(cases), "failed": failed, "skipped": len(skipped), "exit_code": result.returncode}


def pytests():
    junit = kitlib.step_path("pytest.xml")
    source = os.path.join(kitlib.KIT, "src", "tests", "integration")
    result = subprocess.run([os.environ.get("KIT_PYTHON", "python3"), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             f"--junitxml={junit}", "-k", "not load_unload_cycles and not aoti", "--basetemp", kitlib.step_path("pytest-tmp", "x")[:-2],
                             os.path.join(source, "test_gpu.py")],
                            capture_output=True, text=True, timeout=240, cwd=source,
                            # The GPU machine's many pytest plugins: none is needed, any could break.
                            env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})
    with open(kitlib.step_path("pytest.log"), "w") as f:
        f.write(result.stdout + result.stderr)
    if not os.path.exists(junit):
        raise RuntimeError(f"pytest exited {result.returncode} without a report:\n{(result.stdout + result.stderr)[-1500:]}")
    suite = ElementTree.parse(junit).getroot()
    suite = suite.find("testsuite") if suite.tag == "testsuites" else suite
    cases = suite.findall("testcase")
    failed = [case.get("name") for case in cases if case.find("failure") is not None or case.find("error") is not None]
    skipped = [case.get("name") for case in cases if case.find("skipped") is not None]
    return {"tests": len(cases), "failed": failed, "skipped": len(skipped), "exit_code": result.returncode,
            "tail": (result.stdout + result.stderr)[-2500:] if failed else ""}


def body():
    g, p = gtests(), pytests()
    numbers = {"gtest": {k: v for k, v in g.items()}, "pytest": {k: v for k, v in p.items() if k != "tail"}}
    details = ""
    if p["failed"]:
        details = "pytest output (tail):\n\n```\n" + p["tail"] + "\n```"
    failed = g["failed"] + p["failed"]
    if failed:
        return "fail", f"{len(failed)} GPU test(s) failed: {', '.join(failed)[:300]}", numbers, details
    total, skipped = g["tests"] + p["tests"], g["skipped"] + p["skipped"]
    if total == 0:
        return "fail", "no GPU test ran", numbers, details
    if kitlib.NO_GPU or skipped == total:
        status = "skipped" if skipped == total else "fail"
        why = "skipped: no GPU" if kitlib.NO_GPU else "every GPU test skipped on a GPU machine"
        return status, f"{why} ({g['tests']} gtests and {p['tests']} pytest tests load and skip)", numbers, details
    if skipped:
        return "fail", f"{skipped} of {total} GPU tests skipped on a GPU machine", numbers, details
    return "pass", f"{g['tests']} gtests and {p['tests']} integration tests passed on the GPU", numbers, details


if __name__ == "__main__":
    kitlib.run_step(body)
