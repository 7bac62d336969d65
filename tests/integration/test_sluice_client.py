"""sluice-client, the CLI, against the real server."""
import re
import subprocess

import numpy as np
import torch
from conftest import CLIENT


def run(url, *args, check=True):
    result = subprocess.run([CLIENT, "--url", url, *args], capture_output=True, text=True, timeout=60)
    if check:
        assert result.returncode == 0, result.stdout + result.stderr
    return result


def test_health(bundled_server):
    out = run(bundled_server.url, "health").stdout
    assert "live: true" in out and "ready: true" in out


def test_models_lists_states_and_reasons(server):
    out = run(server.url, "models").stdout
    assert re.search(r"^dtype_fp32\t1\tREADY$", out, re.M)
    assert re.search(r"^broken_file\t1\tUNAVAILABLE\tcannot load", out, re.M)


def test_metadata(bundled_server):
    out = run(bundled_server.url, "metadata", "convnet").stdout
    assert "input  image FP32 [-1,3,32,32]" in out
    assert "output logits FP32 [-1,10]" in out


def test_config(bundled_server):
    out = run(bundled_server.url, "config", "mlp").stdout
    assert 'name: "mlp"' in out and "max_batch_size: 64" in out


def test_infer_random_inputs(bundled_server):
    out = run(bundled_server.url, "infer", "mlp", "-b", "3").stdout
    assert "input  INPUT__0 FP32 [3,784]" in out
    assert "output OUTPUT__0 FP32 [3,10]" in out


def test_infer_npy_matches_torch(bundled_server, bundled_repository, tmp_path):
    image = np.random.default_rng(3).random((2, 3, 32, 32), dtype=np.float32)
    np.save(tmp_path / "image.npy", image)
    out = run(bundled_server.url, "infer", "convnet", "--input", f"image={tmp_path / 'image.npy'}",
              "--max-values", "20").stdout
    line = next(l for l in out.splitlines() if l.startswith("output logits"))
    values = [float(v) for v in line.split("[", 2)[2].rstrip("]").split(",")]
    model = torch.jit.load(str(bundled_repository / "convnet" / "1" / "model.pt"))
    with torch.inference_mode():
        expected = model(torch.from_numpy(image)).flatten().tolist()
    np.testing.assert_allclose(values, expected, rtol=1e-4, atol=1e-5)  # printed with 6 digits


def test_errors_exit_nonzero_with_server_message(bundled_server, tmp_path):
    result = run(bundled_server.url, "infer", "nope", check=False)
    assert result.returncode != 0
    assert "NOT_FOUND" in result.stderr and "Request for unknown model: 'nope' is not found" in result.stderr
    bad = tmp_path / "bad.npy"
    bad.write_bytes(b"not numpy")
    result = run(bundled_server.url, "infer", "mlp", "--input", f"INPUT__0={bad}", check=False)
    assert result.returncode != 0 and "not a .npy file" in result.stderr
    wrong = tmp_path / "wrong.npy"
    np.save(wrong, np.zeros((1, 5), np.float32))
    result = run(bundled_server.url, "infer", "mlp", "--input", f"INPUT__0={wrong}", check=False)
    assert result.returncode != 0 and "INVALID_ARGUMENT" in result.stderr and "dimension 1 is 5" in result.stderr


def test_unreachable_server(tmp_path):
    result = subprocess.run([CLIENT, "--url", "127.0.0.1:1", "--timeout-ms", "2000", "health"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "UNAVAILABLE" in result.stderr
