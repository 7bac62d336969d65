"""AOTInductor packages (.pt2, platform "torch_aoti") served by the real sluice-server and called
with tritonclient: every datatype, tuple, list and dict outputs, answers equal to the package's
own Python outputs, batched answers equal to unbatched ones, a package whose smallest batch is 2,
one with its batch fixed to 1, warm-up, statistics, and bad packages that fail to load with a
clear reason while the others serve.

The packages are compiled once into .cache/aoti-test (about 40 s each on two cores) and reused
while torch and aoti_packages.py stay the same."""
import json
import os
import shutil
import subprocess
import zipfile
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
from aoti_packages import DTYPES, compiled_packages
from conftest import start_server
from tritonclient.utils import InferenceServerException

NUMPY = {"BOOL": np.bool_, "UINT8": np.uint8, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32,
         "INT64": np.int64, "FP16": np.float16, "FP32": np.float32, "FP64": np.float64}


@pytest.fixture(scope="module")
def packages():
    return compiled_packages()


def block(kind, tensors):
    return f"{kind} [" + ", ".join(
        f'{{ name: "{name}" data_type: TYPE_{dtype} dims: [ {", ".join(map(str, dims))} ] }}'
        for name, dtype, dims in tensors) + "]\n"


def write(root, name, config, package, filename="model.pt2", edit=None):
    """A model directory with `package` as version 1; `config` None: no config.pbtxt at all."""
    os.makedirs(os.path.join(root, name, "1"), exist_ok=True)
    if config is not None:
        with open(os.path.join(root, name, "config.pbtxt"), "w") as f:
            f.write('platform: "torch_aoti"\n' + config)
    target = os.path.join(root, name, "1", filename)
    if edit is None:
        shutil.copyfile(package, target)
    else:
        edit(package, target)


def with_metadata(drop_sluice=False, **changes):
    """Copies a package, changing keys of the metadata inductor and the recipe wrote (the archive's
    JSON, which is what the server reads before it loads any of the package's code);
    `drop_sluice` removes the recipe's keys, as in a package exported by hand."""

    def edit(source, target):
        with zipfile.ZipFile(source) as original, zipfile.ZipFile(target, "w") as copy:
            for item in original.infolist():
                data = original.read(item.filename)
                if item.filename.endswith("wrapper_metadata.json"):
                    metadata = {**json.loads(data), **changes}
                    if drop_sluice:
                        metadata = {k: v for k, v in metadata.items() if not k.startswith("sluice.")}
                    data = json.dumps(metadata).encode()
                copy.writestr(item, data)
    return edit


def corrupt(source, target):
    with open(source, "rb") as f:
        data = f.read()
    with open(target, "wb") as f:
        f.write(data[: len(data) // 3])


EVERY_DTYPE_IO = (block("input", [(f"INPUT__{i}", d, [4]) for i, d in enumerate(DTYPES)])
                  + block("output", [(f"OUTPUT__{i}", d, [4]) for i, d in enumerate(DTYPES)]))
LIST_IO = (block("input", [("INPUT__0", "FP32", [3])])
           + block("output", [("OUTPUT__0", "FP32", [3]), ("OUTPUT__1", "FP32", [1])]))
# Declared out of the package's order: bound by dict key.
DICT_IO = (block("input", [("values", "FP32", [4]), ("counts", "INT64", [4])])
           + block("output", [("twice", "INT64", [4]), ("total", "FP32", [4])]))
CPU = "instance_group [{ kind: KIND_CPU count: 2 }]\n"
TRITON_CALL_IO = (block("input", [("ARGS[1]", "INT64", [4]), ("ARGS[0]", "FP32", [4])])
                  + block("output", [("RESULT[twice]", "INT64", [4]), ("RESULT[total]", "FP32", [4])]))
TRITON_ORDINAL_IO = (block("input", [("INPUT__0", "FP32", [4]), ("INPUT__1", "INT64", [4])])
                     + block("output", [("OUTPUT__1", "INT64", [4]), ("OUTPUT__0", "FP32", [4])]))


@pytest.fixture(scope="module")
def repository(packages, tmp_path_factory):
    root = str(tmp_path_factory.mktemp("aoti_repository"))
    write(root, "every_dtype", "max_batch_size: 8\n" + EVERY_DTYPE_IO + CPU
          + "dynamic_batching { max_queue_delay_microseconds: 20000 }\n", packages["every_dtype"])
    # model.cpu.pt2 is what CPU instances read when it exists.
    write(root, "list_min2", "max_batch_size: 8\n" + LIST_IO + CPU + "dynamic_batching { }\n",
          packages["list_min2"], filename="model.cpu.pt2")
    write(root, "dict_fixed1", "max_batch_size: 1\n" + DICT_IO + CPU, packages["dict_fixed1"])
    # No config.pbtxt: completed from the package (inputs, outputs, max_batch_size, batching).
    write(root, "no_config", None, packages["list_min2"])
    # A config that names only the instances: the rest completed the same way.
    write(root, "partial_config", CPU, packages["list_min2"])
    # The same package as Triton 26.05+ (and AITune's repositories) name its tensors: by place in
    # the call, declared in another order than the call's.
    write(root, "call_names", "max_batch_size: 1\n" + TRITON_CALL_IO + CPU, packages["dict_fixed1"])
    write(root, "ordinal_names", "max_batch_size: 1\n" + TRITON_ORDINAL_IO + CPU, packages["dict_fixed1"])
    # Shape buckets: lengths are padded up to 4, 8 or 16 and the outputs cut back.
    write(root, "sequence", "max_batch_size: 4\n"
          + block("input", [("tokens", "FP32", [-1, 2])]) + block("output", [("OUTPUT__0", "FP32", [-1, 2])])
          + "instance_group [{ kind: KIND_CPU count: 1 }]\n"
          + 'parameters { key: "sluice.buckets" value { string_value: "seq=4,8,16" } }\n'
          + 'parameters { key: "sluice.bucket_dims" value { string_value: "tokens:0=seq, OUTPUT__0:0=seq" } }\n',
          packages["sequence"])
    # Exported by hand, without the recipe's metadata: served, checked by warm-up only.
    write(root, "undescribed", "max_batch_size: 8\n" + LIST_IO + CPU + "dynamic_batching { }\n",
          packages["list_min2"], edit=with_metadata(drop_sluice=True))
    # Bad packages: each fails to load with a reason; the models above still serve.
    write(root, "bad_corrupt", "max_batch_size: 8\n" + LIST_IO + CPU, packages["list_min2"], edit=corrupt)
    write(root, "bad_device", "max_batch_size: 8\n" + LIST_IO + CPU, packages["list_min2"],
          edit=with_metadata(AOTI_DEVICE_KEY="cuda"))
    write(root, "bad_isa", "max_batch_size: 8\n" + LIST_IO + CPU, packages["list_min2"],
          edit=with_metadata(AOTI_CPU_ISA="AMX_FP16 AVX512"))
    write(root, "bad_torch", "max_batch_size: 8\n" + LIST_IO + CPU, packages["list_min2"],
          edit=with_metadata(**{"sluice.torch_version": "2.9.0"}))
    write(root, "bad_dtype", "max_batch_size: 8\n" + LIST_IO.replace("TYPE_FP32", "TYPE_FP64", 1) + CPU,
          packages["list_min2"])
    write(root, "bad_batch", "max_batch_size: 16\n" + LIST_IO + CPU, packages["list_min2"])
    write(root, "bad_fixed1", "max_batch_size: 4\n" + DICT_IO + CPU, packages["dict_fixed1"])
    write(root, "bad_no_config", None, packages["list_min2"], edit=with_metadata(drop_sluice=True))
    write(root, "bad_missing", "max_batch_size: 8\n" + LIST_IO + CPU, packages["list_min2"],
          filename="other.pt2")
    return root


@pytest.fixture(scope="module")
def server(repository, tmp_path_factory):
    server = start_server(repository, tmp_path_factory, ["--strict-readiness", "false", "--device", "cpu"])
    yield server
    assert server.stop() == 0, server.log()


@pytest.fixture()
def client(server):
    triton = grpcclient.InferenceServerClient(url=server.url)
    yield triton
    triton.close()


def infer(client, model, arrays, outputs=None):
    inputs = []
    for name, (datatype, array) in arrays.items():
        tensor = grpcclient.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    requested = [grpcclient.InferRequestedOutput(name) for name in outputs] if outputs else None
    return client.infer(model, inputs, outputs=requested)


def every_dtype_tensors(rows, seed):
    """One torch tensor per datatype, small values that every dtype holds exactly."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 2 if dtype == torch.bool else 4, (rows, 4), generator=generator).to(dtype)
            for dtype in DTYPES.values()]


def raw(tensor):
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().tobytes()
    return tensor.numpy().tobytes()


def infer_every_dtype(client, tensors):
    """Sends raw bytes (tritonclient has no numpy bfloat16); returns the outputs as torch tensors."""
    inputs = []
    for i, (datatype, tensor) in enumerate(zip(DTYPES, tensors)):
        request_input = grpcclient.InferInput(f"INPUT__{i}", list(tensor.shape), datatype)
        request_input._raw_content = raw(tensor)
        inputs.append(request_input)
    response = client.infer("every_dtype", inputs).get_response()
    outputs = {}
    for output, data in zip(response.outputs, response.raw_output_contents):
        dtype = DTYPES[output.datatype]
        if dtype == torch.bfloat16:
            value = torch.from_numpy(np.frombuffer(data, dtype=np.int16).copy()).view(torch.bfloat16)
        else:
            value = torch.from_numpy(np.frombuffer(data, dtype=NUMPY[output.datatype]).copy())
        outputs[output.name] = value.reshape(list(output.shape))
    return [outputs[f"OUTPUT__{i}"] for i in range(len(DTYPES))]


def python_outputs(package, tensors):
    """What the package computes in Python (torch._inductor.aoti_load_package)."""
    return torch._inductor.aoti_load_package(package)(*tensors)


def test_every_datatype_equals_the_packages_own_python_outputs(client, packages):
    tensors = every_dtype_tensors(3, seed=1)
    got = infer_every_dtype(client, tensors)
    expected = python_outputs(packages["every_dtype"], tensors)
    for datatype, one, other in zip(DTYPES, got, expected):
        assert one.dtype == other.dtype and torch.equal(one, other), datatype


def test_batched_answers_equal_unbatched_ones(client, server):
    requests = [every_dtype_tensors(1, seed) for seed in range(16)]
    alone = [infer_every_dtype(client, tensors) for tensors in requests]
    with ThreadPoolExecutor(16) as pool:
        together = list(pool.map(lambda tensors: infer_every_dtype(client, tensors), requests))
    for one, other in zip(alone, together):
        assert all(torch.equal(a, b) for a, b in zip(one, other))
    stats = client.get_inference_statistics("every_dtype").model_stats[0]
    assert stats.inference_count >= 32
    assert stats.execution_count < stats.inference_count  # some requests shared a forward pass


def test_list_outputs_and_a_lone_request_padded_to_the_packages_smallest_batch(client, packages):
    x = np.arange(3, dtype=np.float32).reshape(1, 3)
    result = infer(client, "list_min2", {"INPUT__0": ("FP32", x)})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), x * 2)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), x.sum(axis=1, keepdims=True))
    x3 = np.arange(9, dtype=np.float32).reshape(3, 3)
    result = infer(client, "list_min2", {"INPUT__0": ("FP32", x3)}, outputs=["OUTPUT__1"])
    expected = python_outputs(packages["list_min2"], [torch.from_numpy(x3)])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), expected[1].numpy())
    assert result.as_numpy("OUTPUT__0") is None


def test_dict_outputs_bind_by_key_with_the_batch_fixed_to_one(client, server):
    values = np.array([[0.5, 1.5, 2.5, 3.5]], dtype=np.float32)
    counts = np.array([[1, 2, 3, 4]], dtype=np.int64)
    result = infer(client, "dict_fixed1", {"values": ("FP32", values), "counts": ("INT64", counts)})
    np.testing.assert_array_equal(result.as_numpy("total"), values + counts)
    np.testing.assert_array_equal(result.as_numpy("twice"), counts * 2)
    assert "batch fixed to 1, so requests never batch" in server.log()


def test_a_package_without_a_config_is_configured_from_itself(client, packages):
    for name in ("no_config", "partial_config"):
        config = client.get_model_config(name).config
        assert config.platform == "torch_aoti"
        assert config.max_batch_size == 8  # the exported batch Dim's upper bound
        assert config.HasField("dynamic_batching")
        assert [(i.name, list(i.dims)) for i in config.input] == [("x", [3])]
        assert [(o.name, list(o.dims)) for o in config.output] == [("OUTPUT__0", [3]), ("OUTPUT__1", [1])]
    assert client.get_model_config("partial_config").config.instance_group[0].count == 2
    x = np.arange(9, dtype=np.float32).reshape(3, 3)
    result = infer(client, "no_config", {"x": ("FP32", x)})
    expected = python_outputs(packages["list_min2"], [torch.from_numpy(x)])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), expected[0].numpy())
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), expected[1].numpy())


def test_tritons_call_and_ordinal_names_bind_unchanged(client):
    values = np.array([[0.5, 1.5, 2.5, 3.5]], dtype=np.float32)
    counts = np.array([[1, 2, 3, 4]], dtype=np.int64)
    result = infer(client, "call_names", {"ARGS[0]": ("FP32", values), "ARGS[1]": ("INT64", counts)})
    np.testing.assert_array_equal(result.as_numpy("RESULT[total]"), values + counts)
    np.testing.assert_array_equal(result.as_numpy("RESULT[twice]"), counts * 2)
    result = infer(client, "ordinal_names", {"INPUT__0": ("FP32", values), "INPUT__1": ("INT64", counts)})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), values + counts)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), counts * 2)


def test_shape_buckets_pad_and_cut_back(client, server):
    rng = np.random.default_rng(2)
    for length in (1, 3, 4, 5, 11, 16):
        tokens = rng.standard_normal((2, length, 2)).astype(np.float32)
        got = infer(client, "sequence", {"tokens": ("FP32", tokens)}).as_numpy("OUTPUT__0")
        assert got.shape == (2, length, 2)
        np.testing.assert_allclose(got, tokens * 2 + 1, rtol=1e-6)
    # Every (batch, bucket) pair was warmed before the model was ready: 4 batch sizes x 3 buckets.
    assert "event=warmup model=sequence version=1 shapes=12" in server.log()


def test_a_package_without_the_recipes_metadata_serves_lone_requests(client, server):
    x = np.arange(3, dtype=np.float32).reshape(1, 3)
    result = infer(client, "undescribed", {"INPUT__0": ("FP32", x)})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), x * 2)
    assert "model=undescribed version=1 reason=\"the package has no Sluice metadata" in server.log()


def test_bad_packages_fail_to_load_with_the_reason_and_the_others_serve(client):
    index = {m.name: m for m in client.get_model_repository_index().models}
    for name in ("every_dtype", "list_min2", "dict_fixed1", "call_names", "ordinal_names", "no_config",
                 "partial_config", "sequence", "undescribed"):
        assert index[name].state == "READY", (name, index[name].reason)
    expected = {
        "bad_corrupt": "cannot load",
        "bad_device": "compiled for cuda but this instance runs on cpu",
        "bad_isa": "CPU instruction set AMX_FP16 but this CPU lacks amx_fp16",
        "bad_torch": "compiled by torch 2.9.0 but this server runs LibTorch",
        "bad_dtype": "input 'INPUT__0' is FP64 in config.pbtxt but FP32 in the package",
        "bad_batch": "max_batch_size 16 but the package's batch dimension ends at 8",
        "bad_fixed1": "batch fixed to 1 but config.pbtxt has max_batch_size 4",
        "bad_no_config": "model.pt2 has no Sluice metadata (sluice.*), and LibTorch's loader cannot tell",
        "bad_missing": "1/model.pt2 does not exist (nor model.cpu.pt2 beside it)",
    }
    for name, reason in expected.items():
        assert index[name].state == "UNAVAILABLE", name
        assert reason in index[name].reason, (name, index[name].reason)
    with pytest.raises(InferenceServerException) as error:
        infer(client, "bad_device", {"INPUT__0": ("FP32", np.zeros((1, 3), np.float32))})
    assert "bad_device" in error.value.message()
    # Still serving.
    infer(client, "list_min2", {"INPUT__0": ("FP32", np.zeros((2, 3), np.float32))})


def test_warm_up_ran_and_the_log_says_how_packages_take_cudnn(server):
    log = server.log()
    assert "event=warmup model=every_dtype version=1" in log
    assert 'event=cudnn_benchmark model=list_min2 version=1 benchmark=off reason="AOTInductor package' in log


def test_unloading_and_reloading_leaves_no_temporary_files(repository, tmp_path_factory):
    """The loader unpacks each package into TMPDIR; unloading must remove it again."""
    tmp = tmp_path_factory.mktemp("tmpdir")
    server = start_server(repository, tmp_path_factory,
                          ["--strict-readiness", "false", "--device", "cpu", "--model-control-mode", "explicit",
                           "--load-model", "list_min2"], env={"TMPDIR": str(tmp)})
    try:
        triton = grpcclient.InferenceServerClient(url=server.url)
        loaded = sorted(os.listdir(tmp))
        for _ in range(10):
            triton.load_model("list_min2")
        assert sorted(os.listdir(tmp)) == loaded
        triton.unload_model("list_min2")
        assert os.listdir(tmp) == []
        triton.close()
    finally:
        assert server.stop() == 0, server.log()


def noexec_tmpfs(directory):
    """Mounts a noexec tmpfs at `directory` (what Docker's --tmpfs gives), or None where mounting
    is not allowed here (not root, or no CAP_SYS_ADMIN)."""
    os.makedirs(directory, exist_ok=True)
    if os.geteuid() != 0:
        return None
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "noexec,size=64m", "tmpfs", str(directory)],
                            capture_output=True, text=True)
    return directory if result.returncode == 0 else None


def test_an_unusable_temporary_directory_is_named_with_the_fix(repository, tmp_path_factory):
    """Packages unpack their shared libraries into TMPDIR and load them from there: a missing
    directory, and one mounted noexec (where dlopen fails with 'failed to map segment'), are
    refused before the load with what to change; the server keeps serving."""
    base = tmp_path_factory.mktemp("unusable")
    cases = [(base / "missing", "does not exist: create it, or set TMPDIR")]
    mounted = noexec_tmpfs(base / "noexec")
    if mounted is not None:
        cases.append((mounted, "is mounted noexec, so they cannot be loaded: mount it with exec (docker run "
                               "--tmpfs /tmp:exec"))
    try:
        for directory, reason in cases:
            server = start_server(repository, tmp_path_factory,
                                  ["--strict-readiness", "false", "--device", "cpu", "--model-control-mode", "explicit"],
                                  env={"TMPDIR": str(directory)})
            try:
                triton = grpcclient.InferenceServerClient(url=server.url)
                with pytest.raises(InferenceServerException) as error:
                    triton.load_model("list_min2")
                assert reason in error.value.message(), error.value.message()
                assert triton.is_server_live()
                triton.close()
            finally:
                assert server.stop() == 0, server.log()
    finally:
        if mounted is not None:
            subprocess.run(["umount", str(mounted)], check=False)
    if mounted is None:
        pytest.skip("a missing TMPDIR checked; mounting a noexec tmpfs is not allowed here")


def test_the_recipe_probes_batch_sizes_in_a_fresh_process_and_names_a_crash(packages, tmp_path, monkeypatch):
    """sluice_export asks a compiled package which batch sizes it accepts in a child process, as
    the server would load it: the real probe answers the range, a child killed by a signal is
    reported by the signal's name with the warning that the server would crash the same way (an
    H200 run's CUDA package did), and a child that fails otherwise by its exit code and output."""
    import sluice_export
    assert sluice_export.accepted_batches(packages["list_min2"], [torch.zeros(2, 3)], 2, 8) == [2, 8]
    assert sluice_export.accepted_batches(packages["list_min2"], [torch.zeros(2, 3)], 2, 9) == [2, 8]
    crashing = tmp_path / "crashing-python"
    crashing.write_text("#!/bin/sh\necho 'Fatal Python error: Segmentation fault'\nkill -SEGV $$\n")
    failing = tmp_path / "failing-python"
    failing.write_text("#!/bin/sh\necho 'RuntimeError: no such package'\nexit 3\n")
    for fake in (crashing, failing):
        fake.chmod(0o755)
    monkeypatch.setattr(sluice_export.sys, "executable", str(crashing))
    with pytest.raises(RuntimeError, match="killed a fresh process with SIGSEGV; the server would crash the same "
                                           "way loading it(.|\n)*Fatal Python error: Segmentation fault"):
        sluice_export.accepted_batches(packages["list_min2"], [torch.zeros(2, 3)], 2, 8)
    monkeypatch.setattr(sluice_export.sys, "executable", str(failing))
    with pytest.raises(RuntimeError, match=r"probing the compiled package's batch sizes failed \(exit 3\):\n"
                                           "RuntimeError: no such package"):
        sluice_export.accepted_batches(packages["list_min2"], [torch.zeros(2, 3)], 2, 8)
