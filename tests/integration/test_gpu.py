"""GPU end to end: the bundled models on --device cuda give the torch reference. Skipped without a
usable CUDA GPU (ctest label `gpu`)."""
import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
from conftest import start_server, write_bundled

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no usable CUDA GPU")


class Big(torch.nn.Module):
    """256 MiB of weights."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(8192, 8192) * 0.01, requires_grad=False)

    def forward(self, INPUT__0: torch.Tensor) -> torch.Tensor:
        return INPUT__0 @ self.weight


def test_bundled_models_on_cuda_match_torch(tmp_path_factory):
    # The TorchScript models only: the CPU packages (mlp_aoti, convnet_aoti) would be compiled
    # first, and the .pt2 test below covers packages on the GPU.
    bundled_repository = write_bundled(tmp_path_factory.mktemp("bundled"), ["mlp", "convnet"])
    server = start_server(bundled_repository, tmp_path_factory, ["--device", "cuda"])
    try:
        assert "device=cuda:0" in server.log()
        client = grpcclient.InferenceServerClient(url=server.url)
        image = np.random.default_rng(0).random((4, 3, 32, 32), dtype=np.float32)
        inp = grpcclient.InferInput("image", list(image.shape), "FP32")
        inp.set_data_from_numpy(image)
        got = client.infer("convnet", [inp]).as_numpy("logits")
        model = torch.jit.load(str(bundled_repository / "convnet" / "1" / "model.pt")).cuda()
        with torch.inference_mode():
            want = model(torch.from_numpy(image).cuda()).cpu().numpy()
        # The server runs the conv net with cuDNN benchmark on (32 fixed shapes), the reference
        # with it off: other algorithms, TF32 in both.
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)
        client.close()
    finally:
        assert server.stop() == 0


def test_cudnn_benchmark_per_model_and_warm_up_on_every_gpu_instance(tmp_path_factory):
    """A fixed-shape conv model has benchmark mode measured (off against on) and a variable-shape
    one is off, in one process; every (instance, shape) pair of the fixed one is warmed on the
    GPU."""
    import re
    from repository_helpers import traced_convs_module, warmed_pairs, write
    root = str(tmp_path_factory.mktemp("gpu_benchmark_repository"))
    module = traced_convs_module()
    write(root, "fixed", """
max_batch_size: 4
input [ { name: "image" data_type: TYPE_FP32 dims: [ 3, 8, 8 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 2 ] } ]
dynamic_batching { preferred_batch_size: [ 2 ] }
parameters { key: "sluice.pad_batch_to_preferred" value { string_value: "true" } }
instance_group [ { kind: KIND_GPU count: 2 } ]
""", module)
    write(root, "variable", """
max_batch_size: 4
input [ { name: "image" data_type: TYPE_FP32 dims: [ 3, -1, -1 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 2 ] } ]
instance_group [ { kind: KIND_GPU count: 1 } ]
""", module)
    server = start_server(root, tmp_path_factory, ["--device", "cuda"])
    try:
        log = server.log()
        # Fixed shapes under the auto rule: the mode is timed off against on, and kept only
        # where it is 5 % faster; either answer is right, the measurement must be there.
        assert re.search(r'event=cudnn_benchmark model=fixed version=1 benchmark=(on|off) '
                         r'reason="measured: on [\d.]+x as fast as off over 2 of 2 shapes .* '
                         r'convolutions=2 rewritten=2', log), log
        for b in (2, 4):
            assert re.search(rf'event=cudnn_benchmark_measured model=fixed version=1 '
                             rf'shape="batch={b} image\[{b},3,8,8\]" off_us=[\d.]+ on_us=[\d.]+', log), log
        assert re.search(r"event=cudnn_benchmark model=variable version=1 benchmark=off .* convolutions=2 rewritten=2", log), log
        assert warmed_pairs(log, "fixed") == {
            (instance, f"batch={b} image[{b},3,8,8]") for instance in (0, 1) for b in (2, 4)}
        assert warmed_pairs(log, "variable") == set()
        client = grpcclient.InferenceServerClient(url=server.url)
        for name, shape in (("fixed", (3, 3, 8, 8)), ("variable", (1, 3, 12, 10))):
            image = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
            inp = grpcclient.InferInput("image", list(image.shape), "FP32")
            inp.set_data_from_numpy(image)
            got = client.infer(name, [inp]).as_numpy("OUTPUT__0")
            want = module(torch.from_numpy(image)).detach().numpy()
            np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)  # TF32 convolutions
        client.close()
    finally:
        assert server.stop() == 0, server.log()


def test_print_env_lists_the_gpus():
    import subprocess
    from conftest import SERVER
    out = subprocess.run([SERVER, "--print-env"], capture_output=True, text=True, timeout=120).stdout
    assert f"gpu 0: {torch.cuda.get_device_name(0)}, compute capability " in out
    assert "result: " in out and "GPU(s) usable" in out
    assert "problem: " not in out, out


def test_load_unload_cycles_give_gpu_memory_back(tmp_path_factory):
    """10 load/unload cycles of a model with 256 MiB of weights on the GPU: the device's free
    memory (all processes) must come back each time. A leaked module would keep 256 MiB per
    cycle; the caching allocator keeping its blocks would keep them too (ReleaseCachedMemory
    empties it after each unload)."""
    from test_model_control import write_model

    root = tmp_path_factory.mktemp("gpu_cycles")
    write_model(root, "big", Big(), 1, dims=8192, out=8192)
    config = (root / "big" / "config.pbtxt").read_text().replace("KIND_CPU", "KIND_GPU")
    (root / "big" / "config.pbtxt").write_text(config)
    server = start_server(root, tmp_path_factory, ["--device", "cuda", "--model-control-mode", "explicit"])
    client = grpcclient.InferenceServerClient(url=server.url)
    data = np.ones((1, 8192), dtype=np.float32)
    free = []
    try:
        for _ in range(10):
            client.load_model("big")
            inputs = [grpcclient.InferInput("INPUT__0", [1, 8192], "FP32")]
            inputs[0].set_data_from_numpy(data)
            client.infer("big", inputs)
            client.unload_model("big")
            free.append(torch.cuda.mem_get_info(0)[0])
    finally:
        client.close()
        assert server.stop() == 0, server.log()
    print("free GPU MiB after each unload:", [f // 2**20 for f in free])
    assert free[1] - free[-1] < 64 * 2**20, "GPU memory was not given back"


def test_aoti_package_compiled_for_cuda_serves_on_the_gpu(tmp_path_factory):
    """The bundled MLP compiled on this GPU (model.cuda.pt2, batch 1..64) and served by two GPU
    instances sharing one loader: answers equal the package run by torch in Python."""
    import os
    import sys
    from conftest import ROOT
    sys.path.insert(0, os.path.join(ROOT, "models"))
    import bundled_models
    root = tmp_path_factory.mktemp("aoti_gpu")
    os.makedirs(root / "mlp_aoti" / "1")
    with open(os.path.join(ROOT, "models", "mlp_aoti", "config.pbtxt")) as f:
        config = f.read().replace("kind: KIND_CPU\n    count: 1", "kind: KIND_GPU\n    count: 2")
    assert "KIND_GPU" in config
    (root / "mlp_aoti" / "config.pbtxt").write_text(config)
    package = str(root / "mlp_aoti" / "1" / "model.cuda.pt2")
    bundled_models.export("mlp_aoti", package, device="cuda")
    server = start_server(root, tmp_path_factory, ["--device", "cuda"])
    try:
        assert "model=mlp_aoti version=1 device=cuda:0 x2" in server.log()
        client = grpcclient.InferenceServerClient(url=server.url)
        reference = torch._inductor.aoti_load_package(package)
        rng = np.random.default_rng(3)
        for rows in (1, 3, 64):
            x = rng.random((rows, 784), dtype=np.float32)
            inp = grpcclient.InferInput("INPUT__0", [rows, 784], "FP32")
            inp.set_data_from_numpy(x)
            got = client.infer("mlp_aoti", [inp]).as_numpy("OUTPUT__0")
            with torch.no_grad():
                want = reference(torch.from_numpy(x).cuda()).cpu().numpy()
            np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)
        client.close()
    finally:
        assert server.stop() == 0


def test_cuda_graphs_capture_every_warmed_shape_and_answer_as_eager(tmp_path_factory):
    """The bundled conv net with optimization.cuda.graphs on the GPU: warm-up captures its shapes
    (one log line each), and replays answer as the same model without graphs does."""
    import re
    root = write_bundled(tmp_path_factory.mktemp("graphs_gpu"), ["convnet"])
    graphs = root / "convnet_graphs"
    graphs.mkdir()
    (graphs / "1").mkdir()
    (graphs / "1" / "model.pt").write_bytes((root / "convnet" / "1" / "model.pt").read_bytes())
    config = (root / "convnet" / "config.pbtxt").read_text()
    (graphs / "config.pbtxt").write_text(re.sub(r'^name:\s*"[^"]*"\n', "", config, flags=re.M)
                                         + "optimization { cuda { graphs: true } }\n")
    server = start_server(root, tmp_path_factory, ["--device", "cuda"])
    try:
        log = server.log()
        captured = re.findall(r"event=cuda_graph_captured model=convnet_graphs ", log)
        assert captured, log[-3000:]
        client = grpcclient.InferenceServerClient(url=server.url)
        rng = np.random.default_rng(2)
        for batch in (1, 4, 4, 8):
            image = rng.random((batch, 3, 32, 32), dtype=np.float32)
            answers = {}
            for model in ("convnet", "convnet_graphs"):
                inp = grpcclient.InferInput("image", list(image.shape), "FP32")
                inp.set_data_from_numpy(image)
                answers[model] = client.infer(model, [inp]).as_numpy("logits")
            np.testing.assert_allclose(answers["convnet_graphs"], answers["convnet"], rtol=1e-4, atol=1e-4)
        client.close()
    finally:
        assert server.stop() == 0
