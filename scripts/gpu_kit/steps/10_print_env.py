"""`sluice-server --print-env` verbatim, then again with CUDA_VISIBLE_DEVICES= (it must say that
no GPU is visible). On a GPU machine the first must find every GPU usable and no problem."""
# kit-timeout: 45
import os
import re
import subprocess

import kitlib


def print_env(extra_env=None):
    env = {**os.environ, **(extra_env or {})}
    result = subprocess.run([kitlib.SERVER, "--print-env"], capture_output=True, text=True, timeout=20, env=env)
    return result.returncode, result.stdout + result.stderr


def body():
    rc, text = print_env()
    rc_hidden, hidden = print_env({"CUDA_VISIBLE_DEVICES": ""})
    fields = dict(re.findall(r"^(libtorch|cuda_built_with|cuda_runtime|nvidia_driver|cudnn_compiled|cudnn_loaded|"
                             r"result): (.*)$", text, re.M))
    gpus = re.findall(r"^gpu \d+: (.*)$", text, re.M)
    problems = re.findall(r"^problem: (.*)$", text, re.M)
    numbers = {**fields, "gpus": gpus, "problems": problems, "exit_code": rc, "hidden_exit_code": rc_hidden}
    details = (f"`sluice-server --print-env` (exit {rc}):\n\n```\n{text.strip()}\n```\n\n"
               f"`CUDA_VISIBLE_DEVICES= sluice-server --print-env` (exit {rc_hidden}):\n\n```\n{hidden.strip()}\n```")
    failures = []
    if rc != 0 or rc_hidden != 0:
        failures.append(f"--print-env exited {rc} / {rc_hidden}")
    if "result: no usable GPU" not in hidden:
        failures.append("with CUDA_VISIBLE_DEVICES= it did not say `result: no usable GPU`")
    if not kitlib.NO_GPU:
        usable = re.search(r"^result: (\d+) GPU\(s\) usable", text, re.M)
        if not usable or int(usable.group(1)) < 1:
            failures.append(f"no usable GPU reported: {fields.get('result')}")
        if problems:
            failures.append(f"{len(problems)} problem line(s): {problems[0]}")
        if not re.search(r"no CUDA GPU is visible", hidden):
            failures.append("with CUDA_VISIBLE_DEVICES= it did not name the cause (no CUDA GPU is visible)")
    summary = "; ".join(failures) if failures else (
        f"{fields.get('result')}; driver {fields.get('nvidia_driver', 'none')}, cuDNN {fields.get('cudnn_loaded')}; "
        "hidden GPUs reported as no usable GPU")
    return ("fail" if failures else "pass"), summary, numbers, details


if __name__ == "__main__":
    kitlib.run_step(body)
