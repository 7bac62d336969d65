"""The generated-model cache (models/model_cache.py) and models/generate_models.py over it: a model
is built once per key, built again when its key changes, a failed build leaves the cache as it
was, concurrent callers build once, and a run of generate_models.py that finds every model cached
copies them without importing torch."""
import multiprocessing
import os
import subprocess
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "models"))
import model_cache  # noqa: E402


def writer(text, calls):
    def build(path):
        calls.append(path)
        with open(path, "w") as f:
            f.write(text)
    return build


def test_a_file_is_built_once_per_key_and_again_for_another_key(tmp_path):
    calls = []
    first = model_cache.cached(str(tmp_path), "m.pt", "key 1\n", writer("one", calls))
    again = model_cache.cached(str(tmp_path), "m.pt", "key 1\n", writer("two", calls))
    assert first == again == str(tmp_path / "m.pt")
    assert len(calls) == 1 and open(first).read() == "one"
    # The partial file is built beside the cached one, then replaces it.
    assert calls[0] == str(tmp_path / "m.partial.pt")
    rebuilt = model_cache.cached(str(tmp_path), "m.pt", "key 2\n", writer("three", calls))
    assert len(calls) == 2 and open(rebuilt).read() == "three"
    assert open(rebuilt + ".stamp").read() == "key 2\n"


def test_a_failed_build_leaves_the_cache_as_it_was(tmp_path):
    model_cache.cached(str(tmp_path), "m.pt", "key 1\n", writer("one", []))

    def fails(path):
        with open(path, "w") as f:
            f.write("half")
        raise RuntimeError("export failed")

    with pytest.raises(RuntimeError, match="export failed"):
        model_cache.cached(str(tmp_path), "m.pt", "key 2\n", fails)
    assert open(tmp_path / "m.pt").read() == "one"
    assert open(tmp_path / "m.pt.stamp").read() == "key 1\n"
    # The next call with the new key builds (it is not taken as cached).
    calls = []
    model_cache.cached(str(tmp_path), "m.pt", "key 2\n", writer("two", calls))
    assert len(calls) == 1 and open(tmp_path / "m.pt").read() == "two"


def test_a_directory_is_replaced_whole_when_its_key_changes(tmp_path):
    def tree(names):
        def build(path):
            os.makedirs(path)
            for name in names:
                open(os.path.join(path, name), "w").close()
        return build

    model_cache.cached(str(tmp_path), "repository", "key 1\n", tree(["a", "b"]))
    # A directory an interrupted build left behind does not break the next build.
    os.makedirs(tmp_path / "repository.partial" / "stale")
    built = model_cache.cached(str(tmp_path), "repository", "key 2\n", tree(["c"]))
    assert sorted(os.listdir(built)) == ["c"]


def build_slowly(cache, log):
    import time

    def build(path):
        with open(log, "a") as f:
            f.write("built\n")
        time.sleep(0.5)  # both callers are inside cached() while this builds
        with open(path, "w") as f:
            f.write("model")
    model_cache.cached(cache, "m.pt", "key\n", build)


def test_concurrent_callers_build_once(tmp_path):
    log = str(tmp_path / "builds.log")
    context = multiprocessing.get_context("fork")
    callers = [context.Process(target=build_slowly, args=(str(tmp_path / "cache"), log)) for _ in range(2)]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join(timeout=60)
        assert caller.exitcode == 0
    assert open(log).read() == "built\n"
    assert open(tmp_path / "cache" / "m.pt").read() == "model"


def test_the_key_names_the_torch_version_without_importing_torch(tmp_path):
    source = tmp_path / "source.py"
    source.write_text("x = 1\n")
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import model_cache; "
            "print(model_cache.source_key(sys.argv[2]), end=''); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, os.path.join(ROOT, "models"), str(source)],
                         capture_output=True, text=True, check=True).stdout
    import torch
    assert out.startswith(f"torch {torch.__version__} source ")
    assert out.endswith("\nFalse\n"), out
    source.write_text("x = 2\n")
    assert model_cache.source_key(str(source)) != out.split("\n")[0] + "\n"


def test_generate_models_copies_cached_models_without_importing_torch(tmp_path):
    script = os.path.join(ROOT, "models", "generate_models.py")
    names = ["mlp", "accumulator"]
    # The first run may build them (into the checkout's .cache/models); the second must not
    # import torch, and both write the same bytes.
    subprocess.run([sys.executable, script, "--repository", str(tmp_path / "first"), "--models", *names],
                   check=True, capture_output=True)
    code = ("import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__'); "
            "print('torch imported' if 'torch' in sys.modules else 'torch not imported')")
    out = subprocess.run([sys.executable, "-c", code, script, "--repository", str(tmp_path / "second"),
                          "--models", *names], capture_output=True, text=True, check=True).stdout
    assert out.strip().endswith("torch not imported"), out
    for name in names:
        first = (tmp_path / "first" / name / "1" / "model.pt").read_bytes()
        assert first == (tmp_path / "second" / name / "1" / "model.pt").read_bytes()
    # The copy is a model torch loads, with the bundled MLP's shape.
    import torch
    mlp = torch.jit.load(str(tmp_path / "second" / "mlp" / "1" / "model.pt"))
    assert mlp(torch.zeros(2, 784)).shape == (2, 10)
