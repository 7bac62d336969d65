"""The export recipe's config_text (models/sluice_export.py): the config.pbtxt it writes from
example inputs serves the model unchanged, and says what a TorchScript file cannot."""
import os
import sys

import numpy as np
import pytest
import torch
from torch import nn

from conftest import ROOT, start_server, wait_models_ready

sys.path.insert(0, os.path.join(ROOT, "models"))
from sluice_export import config_text  # noqa: E402


class Scorer(nn.Module):
    """Tokens [batch, length, 4] (length varies) and a mask [batch, length] -> per-position scores
    [batch, length] and a pooled FP16 vector [batch, 4]."""

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor):
        scores = tokens.sum(dim=2) * mask.to(torch.float32)
        return {"scores": scores, "pooled": tokens.mean(dim=1).half()}


EXAMPLES = (torch.ones(2, 5, 4), torch.ones(2, 5, dtype=torch.int64))


def test_the_text_declares_every_tensor_from_the_examples():
    text = config_text(Scorer().eval(), EXAMPLES, max_batch_size=16, dynamic={0: [0], 1: [0]},
                       input_names=["tokens", "mask"])
    assert text == ('platform: "pytorch_libtorch"\nmax_batch_size: 16\n'
                    'input [\n'
                    '  { name: "tokens" data_type: TYPE_FP32 dims: [ -1, 4 ] },\n'
                    '  { name: "mask" data_type: TYPE_INT64 dims: [ -1 ] }\n'
                    ']\n'
                    'output [\n'
                    '  { name: "scores" data_type: TYPE_FP32 dims: [ -1 ] },\n'
                    '  { name: "pooled" data_type: TYPE_FP16 dims: [ 4 ] }\n'
                    ']\n'
                    'dynamic_batching { }\n')
    unbatched = config_text(Scorer().eval(), EXAMPLES, max_batch_size=0)
    assert "max_batch_size: 0" in unbatched and "dynamic_batching" not in unbatched
    assert 'name: "INPUT__0" data_type: TYPE_FP32 dims: [ 2, 5, 4 ]' in unbatched


def test_a_torchscript_model_serves_with_the_written_config(tmp_path_factory):
    import tritonclient.grpc as grpcclient
    root = tmp_path_factory.mktemp("recipe")
    os.makedirs(root / "scorer" / "1")
    torch.jit.script(Scorer().eval()).save(str(root / "scorer" / "1" / "model.pt"))
    (root / "scorer" / "config.pbtxt").write_text(
        config_text(Scorer().eval(), EXAMPLES, max_batch_size=16, dynamic={0: [0], 1: [0]},
                    input_names=["tokens", "mask"]))
    # Without a config, a TorchScript file is refused with what to declare.
    os.makedirs(root / "bare" / "1")
    torch.jit.script(Scorer().eval()).save(str(root / "bare" / "1" / "model.pt"))
    server = start_server(root, tmp_path_factory, ["--device", "cpu", "--strict-readiness", "false"])
    try:
        wait_models_ready(server, ["scorer"])
        tokens = np.arange(3 * 7 * 4, dtype=np.float32).reshape(3, 7, 4)
        mask = np.ones((3, 7), dtype=np.int64)
        with grpcclient.InferenceServerClient(server.url) as client:
            inputs = [grpcclient.InferInput("tokens", [3, 7, 4], "FP32"),
                      grpcclient.InferInput("mask", [3, 7], "INT64")]
            inputs[0].set_data_from_numpy(tokens)
            inputs[1].set_data_from_numpy(mask)
            result = client.infer("scorer", inputs)
            expected = Scorer()(torch.from_numpy(tokens), torch.from_numpy(mask))
            np.testing.assert_array_equal(result.as_numpy("scores"), expected["scores"].numpy())
            np.testing.assert_array_equal(result.as_numpy("pooled"), expected["pooled"].numpy())
            index = {m.name: m for m in client.get_model_repository_index().models}
            assert "a TorchScript file (model.pt) cannot tell their datatypes and shapes" in index["bare"].reason
    finally:
        assert server.stop() == 0, server.log()
