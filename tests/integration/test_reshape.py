"""`reshape` on inputs and outputs of any datatype, as Triton's configurations write it: clients send
and receive `dims`, the model takes and makes `reshape` (each -1 carried over in order), with
batching and without, over gRPC and HTTP."""
import concurrent.futures

import numpy as np
import pytest
import torch
from torch import nn

from conftest import start_server, wait_models_ready
from make_test_repository import write_model


class PerRow(nn.Module):
    """Takes one INT8 per batch row ([batch], the config's dims [1] reshaped to []); returns it
    doubled the same way, and as FP16 [batch, 6] that clients see as [batch, 2, 3]."""

    def forward(self, INPUT__0: torch.Tensor):
        assert INPUT__0.dim() == 1, "the model takes [batch]"
        return INPUT__0 * 2, INPUT__0.to(torch.float16).unsqueeze(1).repeat(1, 6) + torch.arange(6).half()


class Blocks(nn.Module):
    """Takes FP32 [batch, n, 2, 2] (dims [-1, 4] reshaped to [-1, 2, 2]) and transposes each block."""

    def forward(self, INPUT__0: torch.Tensor):
        assert INPUT__0.dim() == 4, "the model takes [batch, n, 2, 2]"
        return INPUT__0.transpose(2, 3).contiguous()


class Flags(nn.Module):
    """No batching: BOOL [4] in (dims [2, 2]), [2, 2] out (dims [4])."""

    def forward(self, INPUT__0: torch.Tensor):
        assert INPUT__0.dim() == 1, "the model takes [4]"
        return INPUT__0.logical_not().reshape(2, 2)


PER_ROW_CONFIG = ('platform: "pytorch_libtorch"\nmax_batch_size: 8\n'
                  'input [{ name: "INPUT__0" data_type: TYPE_INT8 dims: [ 1 ] reshape: { shape: [ ] } }]\n'
                  'output [{ name: "OUTPUT__0" data_type: TYPE_INT8 dims: [ 1 ] reshape: { shape: [ ] } },'
                  ' { name: "OUTPUT__1" data_type: TYPE_FP16 dims: [ 2, 3 ] reshape: { shape: [ 6 ] } }]\n'
                  'dynamic_batching { max_queue_delay_microseconds: 50000 }\n')
BLOCKS_CONFIG = ('platform: "pytorch_libtorch"\nmax_batch_size: 4\n'
                 'input [{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ -1, 4 ] reshape: { shape: [ -1, 2, 2 ] } }]\n'
                 'output [{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ -1, 4 ] reshape: { shape: [ -1, 2, 2 ] } }]\n')
FLAGS_CONFIG = ('platform: "pytorch_libtorch"\nmax_batch_size: 0\n'
                'input [{ name: "INPUT__0" data_type: TYPE_BOOL dims: [ 2, 2 ] reshape: { shape: [ 4 ] } }]\n'
                'output [{ name: "OUTPUT__0" data_type: TYPE_BOOL dims: [ 4 ] reshape: { shape: [ 2, 2 ] } }]\n')


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("reshape")
    write_model(root, "per_row", PER_ROW_CONFIG, PerRow())
    write_model(root, "blocks", BLOCKS_CONFIG, Blocks())
    write_model(root, "flags", FLAGS_CONFIG, Flags())
    server = start_server(root, tmp_path_factory, ["--device", "cpu"])
    wait_models_ready(server, ["per_row", "blocks", "flags"])
    yield server
    assert server.stop() == 0, server.log()


def infer_per_row(client, value):
    import tritonclient.grpc as grpcclient
    given = grpcclient.InferInput("INPUT__0", [1, 1], "INT8")
    given.set_data_from_numpy(np.array([[value]], dtype=np.int8))
    return client.infer("per_row", [given])


def test_batched_requests_reach_the_model_reshaped_and_answer_in_dims(server):
    import tritonclient.grpc as grpcclient
    with grpcclient.InferenceServerClient(server.url) as client:
        # Concurrent requests of one row each, batched together (the queue delay waits for them).
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            results = list(pool.map(lambda v: infer_per_row(client, v), range(1, 7)))
        for value, result in zip(range(1, 7), results):
            assert result.as_numpy("OUTPUT__0").tolist() == [[2 * value]]
            halves = result.as_numpy("OUTPUT__1")
            assert halves.shape == (1, 2, 3) and halves.dtype == np.float16
            assert halves.reshape(-1).tolist() == [value + i for i in range(6)]
        stats = client.get_inference_statistics("per_row").model_stats[0]
        assert stats.inference_count == 6
        assert stats.execution_count < 6, "the requests were not batched"
        # What clients see is dims, in the metadata too.
        metadata = client.get_model_metadata("per_row")
        assert [list(t.shape) for t in metadata.inputs] == [[-1, 1]]
        assert [list(t.shape) for t in metadata.outputs] == [[-1, 1], [-1, 2, 3]]


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_variable_sizes_carry_over_in_order(server, protocol):
    if protocol == "grpc":
        import tritonclient.grpc as client_module
        url = server.url
    else:
        import tritonclient.http as client_module
        url = server.http_url
    values = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    with client_module.InferenceServerClient(url) as client:
        given = client_module.InferInput("INPUT__0", [2, 3, 4], "FP32")
        given.set_data_from_numpy(values)
        result = client.infer("blocks", [given])
    expected = values.reshape(2, 3, 2, 2).transpose(0, 1, 3, 2).reshape(2, 3, 4)
    assert result.as_numpy("OUTPUT__0").shape == (2, 3, 4)
    assert result.as_numpy("OUTPUT__0").tolist() == expected.tolist()


def test_without_batching(server):
    import tritonclient.http as httpclient
    flags = np.array([[True, False], [False, False]])
    with httpclient.InferenceServerClient(server.http_url) as client:
        given = httpclient.InferInput("INPUT__0", [2, 2], "BOOL")
        given.set_data_from_numpy(flags)
        result = client.infer("flags", [given])
    assert result.as_numpy("OUTPUT__0").tolist() == [False, True, True, True]


def test_a_request_in_the_reshaped_shape_is_refused_naming_dims(server):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException
    with grpcclient.InferenceServerClient(server.url) as client:
        given = grpcclient.InferInput("INPUT__0", [1], "INT8")  # the model's shape, not dims
        given.set_data_from_numpy(np.array([3], dtype=np.int8))
        with pytest.raises(InferenceServerException) as refused:
            client.infer("per_row", [given])
        assert "INVALID_ARGUMENT" in str(refused.value.status())
        assert "rank 1 where the model takes rank 2" in refused.value.message()
        assert infer_per_row(client, 5).as_numpy("OUTPUT__0").tolist() == [[10]]
