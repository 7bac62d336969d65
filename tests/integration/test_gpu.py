"""GPU end to end: the bundled models on --device cuda give the torch reference. Skipped without a
usable CUDA GPU (ctest label `gpu`)."""
import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
from conftest import start_server

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no usable CUDA GPU")


def test_bundled_models_on_cuda_match_torch(bundled_repository, tmp_path_factory):
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
        # cuDNN picks its own convolution algorithms: FP32 tolerance for GPU.
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        client.close()
    finally:
        assert server.stop() == 0
