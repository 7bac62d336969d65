"""Every carried binary and library resolves its shared libraries into the kit, this machine's
torch (its lib dir and the nvidia/* wheels beside it) or the C and C++ runtimes, with the library
path run.sh's wrappers give the kit's binaries (and only them): a `not found` or a too-old glibc
shows here, before any other step tries to run them."""
# kit-timeout: 30
import os
import subprocess

import kitlib

SYSTEM = ("libc.so.", "libm.so.", "libpthread.so.", "libdl.so.", "librt.so.", "libutil.so.", "libresolv.so.",
          "ld-linux", "libstdc++.so.", "libgcc_s.so.", "linux-vdso.so.")


def body():
    import torch
    site = os.path.dirname(os.path.dirname(torch.__file__))
    checked, bad, places = 0, [], {"kit": 0, "torch": 0, "system": 0}
    env = {**os.environ, "LD_LIBRARY_PATH": os.environ.get("KIT_LD_LIBRARY_PATH", "")}
    files = []
    for folder in ("libexec", "lib"):  # lib/sluice: the server's bundled operator libraries
        for directory, _, names in os.walk(os.path.join(kitlib.KIT, folder)):
            files += [(folder, os.path.relpath(os.path.join(directory, name), os.path.join(kitlib.KIT, folder)))
                      for name in names]
    for folder, name in sorted(files):
        path = os.path.join(kitlib.KIT, folder, name)
        result = subprocess.run(["ldd", path], capture_output=True, text=True, timeout=20, env=env)
        text = result.stdout + result.stderr
        checked += 1
        if result.returncode != 0 and "not a dynamic executable" not in text:
            bad.append(f"{folder}/{name}: ldd exited {result.returncode}: {text.strip()[:300]}")
        for line in text.splitlines():
            line = line.strip()
            if "not found" in line:
                bad.append(f"{folder}/{name}: {line}")
                continue
            parts = line.split()
            if len(parts) < 3 or parts[1] != "=>" or not parts[2].startswith("/"):
                continue
            soname, target = parts[0], os.path.realpath(parts[2])
            if target.startswith(os.path.realpath(kitlib.KIT) + os.sep):
                places["kit"] += 1
            elif target.startswith(os.path.realpath(site) + os.sep):
                places["torch"] += 1
            elif soname.startswith(SYSTEM):
                places["system"] += 1
            else:
                bad.append(f"{folder}/{name}: {soname} resolves outside the kit and torch: {target}")
    numbers = {"files_checked": checked, "resolved": places, "problems": len(bad)}
    details = "\n".join(f"- {line}" for line in bad[:50])
    if bad:
        return "fail", f"{len(bad)} unresolved or foreign libraries in {checked} files", numbers, details
    return "pass", f"{checked} binaries and libraries resolve into the kit, torch or glibc", numbers, details


if __name__ == "__main__":
    kitlib.run_step(body)
