"""A file cache for generated models, keyed by the torch version and the sources they come from,
usable without importing torch: a test or benchmark that asks for a model already built copies it
in a few milliseconds instead of importing torch (about 2.5 s on two cores) to build it again.

    key = source_key("models/bundled_models.py")
    path = cached(".cache/models", "mlp.pt", key, lambda path: build(path))
"""
import fcntl
import hashlib
import os


def torch_version() -> str:
    """torch.__version__ (local tag included: +cu130, +cpu), read from torch/version.py without
    importing torch; imported where that file is not there or not as expected."""
    import importlib.util
    import re
    spec = importlib.util.find_spec("torch")
    for directory in (spec.submodule_search_locations or []) if spec else []:
        try:
            with open(os.path.join(directory, "version.py")) as file:
                found = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", file.read(), re.M)
        except OSError:
            continue
        if found:
            return found.group(1)
    import torch
    return torch.__version__


def source_key(*files: str) -> str:
    """The torch version and the SHA-256 of `files`: what cached() compares."""
    digest = hashlib.sha256()
    for name in files:
        with open(name, "rb") as file:
            digest.update(file.read())
    return f"torch {torch_version()} source {digest.hexdigest()}\n"


def cached(cache: str, file_name: str, key: str, build) -> str:
    """<cache>/<file_name> (a file or a directory), built by build(path) first when it is missing
    or was built for another `key` (a <file_name>.stamp beside it records the key). Concurrent
    callers (test suites running in parallel) wait for one another instead of building twice; a
    build that fails leaves the cache as it was. Callers copy what they get and never change it."""
    import shutil
    os.makedirs(cache, exist_ok=True)
    path = os.path.join(cache, file_name)
    with open(os.path.join(cache, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(path) and os.path.exists(path + ".stamp"):
            with open(path + ".stamp") as file:
                if file.read() == key:
                    return path
        stem, extension = os.path.splitext(file_name)
        partial = os.path.join(cache, f"{stem}.partial{extension}")
        if os.path.isdir(partial):
            shutil.rmtree(partial)  # a directory an interrupted build left
        build(partial)
        if os.path.isdir(path):
            shutil.rmtree(path)
        os.replace(partial, path)
        with open(path + ".stamp", "w") as file:
            file.write(key)
    return path
