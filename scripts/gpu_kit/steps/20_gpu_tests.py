"""The runtime's GPU gtests (torch_backend_gpu_test: instances on the GPU, streams, pinned staging,
outputs against torch, cuDNN decisions). The `gpu`-labelled integration tests
(tests/integration/test_gpu.py) are not run again here: the kit's own steps prove the same with
numbers (10 print-env, 30 outputs against torch, 60 cuDNN per model, 70 memory cycles, 80 the .pt2
package), and the test command runs that file on machines with a GPU."""
# kit-timeout: 60
import json
import os

import kitlib


def body():
    report = kitlib.step_path("gtest.json")
    code, text = kitlib.run_logged([os.path.join(kitlib.BIN, "torch_backend_gpu_test"), f"--gtest_output=json:{report}"],
                                   "gtest.log", timeout=50)
    if not os.path.exists(report):
        raise RuntimeError(f"torch_backend_gpu_test exited {code} without a report:\n{text[-1500:]}")
    with open(report) as f:
        data = json.load(f)
    cases = [case for suite in data["testsuites"] for case in suite["testsuite"]]
    failed = [case["name"] for case in cases if case.get("failures")]
    skipped = [case["name"] for case in cases if case.get("result") == "SKIPPED"]
    numbers = {"tests": len(cases), "failed": failed, "skipped": len(skipped), "exit_code": code}
    details = "" if not failed else "gtest output (tail):\n\n```\n" + text[-2500:] + "\n```"
    if failed:
        return "fail", f"{len(failed)} GPU gtest(s) failed: {', '.join(failed)[:300]}", numbers, details
    if not cases:
        return "fail", "no GPU gtest ran", numbers, details
    if kitlib.NO_GPU or len(skipped) == len(cases):
        status = "skipped" if len(skipped) == len(cases) else "fail"
        why = "skipped: no GPU" if kitlib.NO_GPU else "every GPU gtest skipped on a GPU machine"
        return status, f"{why} ({len(cases)} gtests load and skip)", numbers, details
    if skipped:
        return "fail", f"{len(skipped)} of {len(cases)} GPU gtests skipped on a GPU machine", numbers, details
    return "pass", f"{len(cases)} GPU gtests passed on the GPU", numbers, details


if __name__ == "__main__":
    kitlib.run_step(body)
