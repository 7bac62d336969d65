"""Implicit sequence state (sequence_batching `state`) on the real sluice-server: the server keeps
each sequence's state between its requests, under the direct and the oldest strategies, with
tritonclient over gRPC and HTTP. Triton's sequence example traffic (its values, ids and flags)
answers the running sums; many interleaved sequences answer theirs while the oldest strategy
batches rows of different sequences together; an initial_state data_file seeds each sequence; a
state output listed in `output` reaches the client; an AOTInductor package keeps its state the
same way; the refusals keep Triton's wording."""
import concurrent.futures
import random
import shutil
import uuid

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from torch import nn
from tritonclient.utils import InferenceServerException

from conftest import client_for, start_server, wait_models_ready
from make_test_repository import write_model
from state_packages import state_accumulator_package


class StateAccumulator(nn.Module):
    """The running sum of a sequence's inputs, with the sum kept by the server as implicit state."""

    def forward(self, INPUT__0: torch.Tensor, STATE_IN__1: torch.Tensor):
        total = STATE_IN__1 + INPUT__0
        return total, total


STATE = ('state [{{ input_name: "STATE_IN__1" output_name: "STATE_OUT__1" data_type: TYPE_INT32 '
         'dims: [ 1 ]{initial} }}]')
IO = ('input [{ name: "INPUT__0" data_type: TYPE_INT32 dims: [ 1 ] }]\n'
      'output [{ name: "OUTPUT__0" data_type: TYPE_INT32 dims: [ 1 ] }]\n')
DIRECT = "direct { }"
OLDEST = "oldest { max_candidate_sequences: 16 preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 2000 }"


def config(strategy, state=STATE.format(initial=""), io=IO, batch=4, instances=2):
    return (f'platform: "pytorch_libtorch"\nmax_batch_size: {batch}\n{io}'
            f'instance_group [{{ kind: KIND_CPU count: {instances} }}]\n'
            f'sequence_batching {{\n  max_sequence_idle_microseconds: 5000000\n  {strategy}\n  {state}\n}}\n')


SEEDED = STATE.format(initial=' initial_state [{ name: "seed" data_type: TYPE_INT32 dims: [ 1 ] '
                              'data_file: "seed.bin" }]')


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    root = tmp_path_factory.mktemp("sequence_state")
    write_model(root, "direct_state", config(DIRECT), StateAccumulator())
    write_model(root, "oldest_state", config(OLDEST), StateAccumulator())
    write_model(root, "oldest_unbatched", config("oldest { max_candidate_sequences: 4 }", batch=0,
                                                 io=IO.replace("dims: [ 1 ]", "dims: [ 1, 1 ]"),
                                                 state=STATE.format(initial="").replace("dims: [ 1 ]", "dims: [ 1, 1 ]")),
                StateAccumulator())
    write_model(root, "seeded", config(DIRECT, state=SEEDED), StateAccumulator())
    (root / "seeded" / "initial_state").mkdir()
    (root / "seeded" / "initial_state" / "seed.bin").write_bytes(np.array([1000], dtype=np.int32).tobytes())
    visible_io = IO.replace('output [{ name: "OUTPUT__0" data_type: TYPE_INT32 dims: [ 1 ] }]',
                            'output [{ name: "OUTPUT__0" data_type: TYPE_INT32 dims: [ 1 ] },'
                            ' { name: "STATE_OUT__1" data_type: TYPE_INT32 dims: [ 1 ] }]')
    write_model(root, "visible_state", config(DIRECT, io=visible_io), StateAccumulator())
    # The same arithmetic as an AOTInductor package: names bind by forward's arguments.
    write_model(root, "packaged_state", config(
        OLDEST, io=('input [{ name: "value" data_type: TYPE_INT32 dims: [ 1 ] }]\n'
                    'output [{ name: "OUTPUT__0" data_type: TYPE_INT32 dims: [ 1 ] }]\n'),
        state=STATE.format(initial="").replace("STATE_IN__1", "state").replace("STATE_OUT__1", "OUTPUT__1"))
        .replace('platform: "pytorch_libtorch"', 'platform: "torch_aoti"'))
    (root / "packaged_state" / "1").mkdir(parents=True, exist_ok=True)
    shutil.copy(state_accumulator_package(), root / "packaged_state" / "1" / "model.pt2")
    # Refused at load, each with its reason in the repository index.
    write_model(root, "bad_naming", config(DIRECT, state=STATE.format(initial="").replace("STATE_OUT__1", "STATE_OUT")),
                StateAccumulator())
    write_model(root, "bad_dims", config(DIRECT, state=STATE.format(initial="").replace("dims: [ 1 ]", "dims: [ -1 ]")),
                StateAccumulator())
    write_model(root, "missing_seed", config(DIRECT, state=SEEDED), StateAccumulator())
    write_model(root, "short_seed", config(DIRECT, state=SEEDED), StateAccumulator())
    (root / "short_seed" / "initial_state").mkdir()
    (root / "short_seed" / "initial_state" / "seed.bin").write_bytes(b"\x01\x02")
    write_model(root, "bad_candidates", config("oldest { }"), StateAccumulator())
    return root


@pytest.fixture(scope="module")
def server(repository, tmp_path_factory):
    server = start_server(repository, tmp_path_factory, ["--device", "cpu", "--strict-readiness", "false"])
    wait_models_ready(server, ["direct_state", "oldest_state", "oldest_unbatched", "seeded", "visible_state",
                               "packaged_state"])
    yield server
    assert server.stop() == 0, server.log()


def infer(client, module, model, sequence_id, v, start=False, end=False, outputs=None):
    """One row [[v]]: [1, 1] is a batch of one for the batched models and the whole tensor for
    oldest_unbatched (dims [1, 1])."""
    data = module.InferInput("value" if model == "packaged_state" else "INPUT__0", [1, 1], "INT32")
    data.set_data_from_numpy(np.full((1, 1), v, dtype=np.int32))
    requested = [module.InferRequestedOutput(name) for name in outputs] if outputs else None
    result = client.infer(model, [data], outputs=requested, sequence_id=sequence_id,
                          sequence_start=start, sequence_end=end)
    return int(result.as_numpy("OUTPUT__0").flatten()[0]), result


@pytest.mark.parametrize("model", ["direct_state", "oldest_state", "oldest_unbatched", "packaged_state"])
@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_tritons_sequence_example_traffic_answers_the_running_sums(server, model, protocol):
    """simple_*_sequence_sync_infer_client's traffic: two integer sequences and a UUID string one,
    each sent in full, one after the other."""
    client, module = client_for(server, protocol)
    values = [11, 7, 5, 3, 2, 0, 1]
    for sequence_id, sent in ((1000, [0] + values), (1001, [100] + [-v for v in values]),
                              (str(uuid.uuid4()), [20] + [-v for v in values])):
        total = 0
        for step, v in enumerate(sent):
            total += v
            got, _ = infer(client, module, model, sequence_id, v, start=step == 0, end=step == len(sent) - 1)
            assert got == total, (model, sequence_id, step)
    client.close()


@pytest.mark.parametrize("model", ["direct_state", "oldest_state", "packaged_state"])
def test_interleaved_sequences_keep_their_own_state(server, model):
    """24 sequences of 10 steps from 12 clients at once over gRPC and HTTP: more sequences than
    the two instances' slots under direct (8), so later ones wait; under oldest the rows of
    different sequences run together. Every answer is its own sequence's running sum."""
    def run_client(index):
        rng = random.Random(index)
        client, module = client_for(server, "grpc" if index % 2 == 0 else "http")
        for sequence_id in (7000 + 2 * index, 7001 + 2 * index):
            total = 0
            for step in range(10):
                v = rng.randint(-50, 100)
                total += v
                got, _ = infer(client, module, model, sequence_id, v, start=step == 0, end=step == 9)
                assert got == total, (model, sequence_id, step)
        client.close()
        return True

    client = grpcclient.InferenceServerClient(server.url)
    before = client.get_inference_statistics(model, as_json=True)["model_stats"][0]
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        assert all(pool.map(run_client, range(12)))
    after = client.get_inference_statistics(model, as_json=True)["model_stats"][0]
    inferences = int(after.get("inference_count", 0)) - int(before.get("inference_count", 0))
    executions = int(after.get("execution_count", 0)) - int(before.get("execution_count", 0))
    assert inferences == 240
    assert executions < inferences, (executions, inferences)  # rows of several sequences together


def test_a_new_sequence_on_a_reused_slot_starts_from_the_initial_state(server):
    client = grpcclient.InferenceServerClient(server.url)
    for model in ("direct_state", "oldest_state"):
        for round_ in range(3):  # the same slot, three sequences in turn
            assert infer(client, grpcclient, model, 42, 5, start=True)[0] == 5
            assert infer(client, grpcclient, model, 42, 6, end=True)[0] == 11, (model, round_)


def test_an_initial_state_file_seeds_every_sequence(server):
    client = httpclient.InferenceServerClient(server.http_url)
    for sequence_id in (1, 2):
        assert infer(client, httpclient, "seeded", sequence_id, 1, start=True)[0] == 1001
        assert infer(client, httpclient, "seeded", sequence_id, 2, end=True)[0] == 1003


def test_the_state_is_hidden_unless_the_config_lists_its_output(server):
    client = grpcclient.InferenceServerClient(server.url)
    metadata = client.get_model_metadata("direct_state", as_json=True)
    assert [i["name"] for i in metadata["inputs"]] == ["INPUT__0"]
    assert [o["name"] for o in metadata["outputs"]] == ["OUTPUT__0"]
    _, result = infer(client, grpcclient, "direct_state", 55, 3, start=True)
    assert result.as_numpy("STATE_OUT__1") is None  # "every output" leaves the state out
    with pytest.raises(InferenceServerException, match="unknown requested output 'STATE_OUT__1'"):
        infer(client, grpcclient, "direct_state", 55, 1, outputs=["STATE_OUT__1"])
    # A client that sends the state itself is refused: the server fills it.
    data = grpcclient.InferInput("INPUT__0", [1, 1], "INT32")
    data.set_data_from_numpy(np.ones((1, 1), dtype=np.int32))
    state = grpcclient.InferInput("STATE_IN__1", [1, 1], "INT32")
    state.set_data_from_numpy(np.ones((1, 1), dtype=np.int32))
    with pytest.raises(InferenceServerException, match="STATE_IN__1"):
        client.infer("direct_state", [data, state], sequence_id=55)
    assert infer(client, grpcclient, "direct_state", 55, 4, end=True)[0] == 7  # the refusals kept nothing

    assert [o["name"] for o in client.get_model_metadata("visible_state", as_json=True)["outputs"]] == \
        ["OUTPUT__0", "STATE_OUT__1"]
    got, result = infer(client, grpcclient, "visible_state", 56, 9, start=True, outputs=["OUTPUT__0", "STATE_OUT__1"])
    assert got == 9 and int(result.as_numpy("STATE_OUT__1")[0, 0]) == 9
    assert infer(client, grpcclient, "visible_state", 56, 1, end=True)[0] == 10


def test_refused_state_configurations_say_why(server):
    client = grpcclient.InferenceServerClient(server.url)
    index = {m.name: m.reason for m in client.get_model_repository_index().models}
    assert ("model 'bad_naming' is using sequence batching with state but state 'STATE_OUT' does not follow "
            "the <name>__<index> naming convention") in index["bad_naming"]
    assert "a state of variable size, use_growable_memory, is not supported" in index["bad_dims"]
    assert "cannot read its initial_state data_file" in index["missing_seed"]
    assert "holds 2 bytes; INT32 [1] is 4" in index["short_seed"]
    assert "oldest.max_candidate_sequences must be in [1, 4096]" in index["bad_candidates"]
    for name in ("bad_naming", "bad_dims", "missing_seed", "short_seed", "bad_candidates"):
        assert not client.is_model_ready(name)
    assert infer(client, grpcclient, "direct_state", 77, 2, start=True, end=True)[0] == 2
