"""Ensembles (platform "ensemble", ensemble_scheduling) on the real sluice-server with tritonclient
over gRPC and HTTP: a chain and a DAG with fan-out and fan-in answer what running their models by
hand answers; a step batches with its model's other traffic; a failing step fails the request
naming the step, and the server serves on; tensors between steps are not copied; a deadline or a cancellation drops a queued step; each load-time check
refuses its ensemble with its reason; in explicit mode an ensemble loads its models, and
unloading one of them leaves the ensemble answering UNAVAILABLE, naming it."""
import concurrent.futures

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
from torch import nn
from tritonclient.utils import InferenceServerException

from conftest import client_for, start_server, wait_models_ready
from make_test_repository import write_model


class Normalise(nn.Module):
    def forward(self, INPUT__0: torch.Tensor):
        return (INPUT__0 - 1.0) * 0.5


class Double(nn.Module):
    def forward(self, INPUT__0: torch.Tensor):
        return INPUT__0 * 2.0


class Square(nn.Module):
    def forward(self, INPUT__0: torch.Tensor):
        return INPUT__0 * INPUT__0


class Add(nn.Module):
    def forward(self, INPUT__0: torch.Tensor, INPUT__1: torch.Tensor):
        return INPUT__0 + INPUT__1


class Twice(nn.Module):
    def forward(self, INPUT__0: torch.Tensor):
        return INPUT__0 * 2


class RefuseNegative(nn.Module):
    def forward(self, INPUT__0: torch.Tensor):
        if bool((INPUT__0 < 0).any()):
            raise RuntimeError("negative input")
        return INPUT__0


def single(name, inputs=1, dtype="TYPE_FP32", batching="dynamic_batching { max_queue_delay_microseconds: 2000 }"):
    io = "".join(f'{{ name: "INPUT__{i}" data_type: {dtype} dims: [ 4 ] }}{"," if i + 1 < inputs else ""}'
                 for i in range(inputs))
    return (f'platform: "pytorch_libtorch"\nmax_batch_size: 8\ninput [ {io} ]\n'
            f'output [ {{ name: "OUTPUT__0" data_type: {dtype} dims: [ 4 ] }} ]\n'
            f'instance_group [ {{ kind: KIND_CPU count: 1 }} ]\n{batching}\n')


def ensemble(steps, outputs=(("OUTPUT", "FP32"),), inputs=(("INPUT", "FP32"),)):
    """An ensemble config: `steps` as (model, {model input: tensor}, {model output: tensor})."""
    declared_in = ", ".join(f'{{ name: "{n}" data_type: TYPE_{t} dims: [ 4 ] }}' for n, t in inputs)
    declared_out = ", ".join(f'{{ name: "{n}" data_type: TYPE_{t} dims: [ 4 ] }}' for n, t in outputs)
    body = ""
    for model, ins, outs in steps:
        maps = "".join(f' input_map {{ key: "{k}" value: "{v}" }}' for k, v in ins.items())
        maps += "".join(f' output_map {{ key: "{k}" value: "{v}" }}' for k, v in outs.items())
        body += f'    {{ model_name: "{model}" model_version: -1{maps} }},\n'
    return (f'platform: "ensemble"\nmax_batch_size: 8\ninput [ {declared_in} ]\noutput [ {declared_out} ]\n'
            f'ensemble_scheduling {{\n  step [\n{body.rstrip().rstrip(",")}\n  ]\n}}\n')


CHAIN = ensemble([("normalise", {"INPUT__0": "INPUT"}, {"OUTPUT__0": "normalised"}),
                  ("double", {"INPUT__0": "normalised"}, {"OUTPUT__0": "OUTPUT"})])
# normalise -> (double, square) -> add: fan-out and fan-in; "normalised" is an output too.
DAG = ensemble([("add", {"INPUT__0": "doubled", "INPUT__1": "squared"}, {"OUTPUT__0": "OUTPUT"}),
                ("square", {"INPUT__0": "normalised"}, {"OUTPUT__0": "squared"}),
                ("double", {"INPUT__0": "normalised"}, {"OUTPUT__0": "doubled"}),
                ("normalise", {"INPUT__0": "INPUT"}, {"OUTPUT__0": "normalised"})],
               outputs=(("OUTPUT", "FP32"), ("normalised", "FP32")))


def write_composing(root):
    write_model(root, "normalise", single("normalise"), Normalise())
    write_model(root, "double", single("double"), Double())
    write_model(root, "square", single("square"), Square())
    write_model(root, "add", single("add", inputs=2), Add())
    write_model(root, "refuse_negative", single("refuse_negative"), RefuseNegative())
    write_model(root, "as_int", single("as_int", dtype="TYPE_INT32"), Twice())
    # A lone request waits for company for 3 s: long enough for a deadline to pass first.
    write_model(root, "slow", single("slow", batching="dynamic_batching { preferred_batch_size: [ 8 ] "
                                                      "max_queue_delay_microseconds: 3000000 }"), Double())


def write_ensemble(root, name, config):
    write_model(root, name, config)  # a version directory, no model file


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    root = tmp_path_factory.mktemp("ensembles")
    write_composing(root)
    write_ensemble(root, "chain", CHAIN)
    write_ensemble(root, "dag", DAG)
    write_ensemble(root, "guarded", ensemble([("normalise", {"INPUT__0": "INPUT"}, {"OUTPUT__0": "n"}),
                                              ("refuse_negative", {"INPUT__0": "n"}, {"OUTPUT__0": "r"}),
                                              ("double", {"INPUT__0": "r"}, {"OUTPUT__0": "OUTPUT"})]))
    write_ensemble(root, "waits", ensemble([("slow", {"INPUT__0": "INPUT"}, {"OUTPUT__0": "OUTPUT"})]))
    write_ensemble(root, "cached", DAG + "response_cache { enable: true }\n")
    write_ensemble(root, "one_at_a_time", CHAIN.replace("ensemble_scheduling {\n",
                                                        "ensemble_scheduling {\n  max_inflight_requests: 1\n"))
    write_ensemble(root, "cached_slow", ensemble([("slow", {"INPUT__0": "INPUT"}, {"OUTPUT__0": "OUTPUT"})])
                   + "response_cache { enable: true }\n")
    # Refused at load, each with its reason.
    write_ensemble(root, "unknown_model", ensemble([("nowhere", {"INPUT__0": "INPUT"}, {"OUTPUT__0": "OUTPUT"})]))
    write_ensemble(root, "unwritten", ensemble([("double", {"INPUT__0": "missing"}, {"OUTPUT__0": "OUTPUT"})]))
    write_ensemble(root, "cycle", ensemble([("double", {"INPUT__0": "b"}, {"OUTPUT__0": "a"}),
                                            ("square", {"INPUT__0": "a"}, {"OUTPUT__0": "b"}),
                                            ("normalise", {"INPUT__0": "INPUT"}, {"OUTPUT__0": "OUTPUT"})]))
    write_ensemble(root, "mistyped", ensemble([("normalise", {"INPUT__0": "INPUT"}, {"OUTPUT__0": "n"}),
                                               ("as_int", {"INPUT__0": "n"}, {"OUTPUT__0": "OUTPUT"})]))
    write_ensemble(root, "no_such_input", ensemble([("double", {"WRONG__0": "INPUT"}, {"OUTPUT__0": "OUTPUT"})]))
    write_ensemble(root, "twice_written", ensemble([("double", {"INPUT__0": "INPUT"}, {"OUTPUT__0": "OUTPUT"}),
                                                    ("square", {"INPUT__0": "INPUT"}, {"OUTPUT__0": "OUTPUT"})]))
    return root


GOOD = ["chain", "dag", "guarded", "waits", "cached", "cached_slow", "one_at_a_time", "normalise", "double", "square", "add", "refuse_negative", "slow"]


@pytest.fixture(scope="module")
def server(repository, tmp_path_factory):
    server = start_server(repository, tmp_path_factory,
                          ["--device", "cpu", "--strict-readiness", "false", "--cache-config", "local,size=1048576"])
    wait_models_ready(server, GOOD)
    yield server
    assert server.stop() == 0, server.log()


def data(batch=2, seed=0):
    return np.random.default_rng(seed).uniform(1.0, 3.0, size=(batch, 4)).astype(np.float32)


def by_hand(x):
    n = (x - 1.0) * 0.5
    return n, n * 2.0 + n * n


def infer(client, module, model, x, outputs=None, **kwargs):
    given = module.InferInput("INPUT", list(x.shape), "FP32")
    given.set_data_from_numpy(x)
    requested = [module.InferRequestedOutput(name) for name in outputs] if outputs else None
    return client.infer(model, [given], outputs=requested, **kwargs)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_chain_and_a_dag_answer_what_their_models_answer_by_hand(server, protocol):
    client, module = client_for(server, protocol)
    x = data()
    n, combined = by_hand(x)
    np.testing.assert_allclose(infer(client, module, "chain", x).as_numpy("OUTPUT"), n * 2.0, rtol=1e-6)
    result = infer(client, module, "dag", x)
    np.testing.assert_allclose(result.as_numpy("OUTPUT"), combined, rtol=1e-6)
    np.testing.assert_allclose(result.as_numpy("normalised"), n, rtol=1e-6)
    only = infer(client, module, "dag", x, outputs=["normalised"])
    assert only.as_numpy("OUTPUT") is None
    np.testing.assert_allclose(only.as_numpy("normalised"), n, rtol=1e-6)
    metadata = client.get_model_metadata("dag", as_json=True) if protocol == "grpc" else client.get_model_metadata("dag")
    assert metadata["platform"] == "ensemble"
    assert [o["name"] for o in metadata["outputs"]] == ["OUTPUT", "normalised"]


def test_steps_batch_with_their_models_other_traffic(server):
    """32 ensemble requests and 32 direct requests to `double` at once: double's executions carry
    rows of several callers, ensemble steps among them."""
    stats = grpcclient.InferenceServerClient(server.url)

    def counts(model):
        s = stats.get_inference_statistics(model, as_json=True)["model_stats"][0]
        return int(s.get("inference_count", 0)), int(s.get("execution_count", 0))

    before, ensemble_before = counts("double"), counts("chain")

    def one(i):
        client = grpcclient.InferenceServerClient(server.url)
        x = data(1, seed=i)
        if i % 2:
            got = infer(client, grpcclient, "chain", x).as_numpy("OUTPUT")
            np.testing.assert_allclose(got, by_hand(x)[0] * 2.0, rtol=1e-6)
        else:
            given = grpcclient.InferInput("INPUT__0", [1, 4], "FP32")
            given.set_data_from_numpy(x)
            np.testing.assert_allclose(client.infer("double", [given]).as_numpy("OUTPUT__0"), x * 2.0, rtol=1e-6)
        return True

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        assert all(pool.map(one, range(64)))
    after, ensemble_after = counts("double"), counts("chain")
    assert after[0] - before[0] == 64  # 32 direct + 32 steps
    assert after[1] - before[1] < 64, (before, after)  # batched together
    assert ensemble_after[0] - ensemble_before[0] == 32


def copied_bytes(server, model):
    """sluice_ensemble_copied_bytes_total of `model`, by path ("device", "host")."""
    found = {}
    for line in server.metrics_text().splitlines():
        if line.startswith("sluice_ensemble_copied_bytes_total{") and f'model="{model}"' in line:
            path = line.split('path="', 1)[1].split('"', 1)[0]
            found[path] = float(line.rsplit(" ", 1)[1])
    return found


def test_tensors_between_steps_stay_where_their_model_made_them(server):
    """One request at a time: each step reads the tensor the step before made, where it made it;
    no byte is copied between steps, on the device or through the host, and the answers are
    those of the models run by hand."""
    client = grpcclient.InferenceServerClient(server.url)
    before = copied_bytes(server, "dag")
    for seed in range(5):
        x = data(3, seed=seed)
        n, combined = by_hand(x)
        result = infer(client, grpcclient, "dag", x)
        np.testing.assert_allclose(result.as_numpy("OUTPUT"), combined, rtol=1e-6)
        np.testing.assert_allclose(result.as_numpy("normalised"), n, rtol=1e-6)
    after = copied_bytes(server, "dag")
    assert set(after) == {"device", "host"}, after
    assert after["device"] - before.get("device", 0) == 0
    assert after["host"] - before.get("host", 0) == 0


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_failing_step_fails_the_request_naming_it_and_the_server_serves_on(server, protocol):
    client, module = client_for(server, protocol)
    with pytest.raises(InferenceServerException) as error:
        infer(client, module, "guarded", np.zeros((1, 4), dtype=np.float32))  # normalised to -0.5
    assert "ensemble 'guarded' step 2 (model 'refuse_negative') failed" in error.value.message()
    assert "negative input" in error.value.message()
    x = data(1)
    np.testing.assert_allclose(infer(client, module, "guarded", x).as_numpy("OUTPUT"), by_hand(x)[0] * 2.0,
                               rtol=1e-6)


def test_a_deadline_drops_the_queued_step(server):
    client = grpcclient.InferenceServerClient(server.url)
    before = client.get_inference_statistics("slow", as_json=True)["model_stats"][0]
    with pytest.raises(InferenceServerException) as error:
        infer(client, grpcclient, "waits", data(1), client_timeout=0.3)
    assert "DEADLINE_EXCEEDED" in str(error.value.status())
    import time
    time.sleep(3.5)  # past the slow model's batching delay: the step would have run by now
    after = client.get_inference_statistics("slow", as_json=True)["model_stats"][0]
    assert int(after.get("execution_count", 0)) == int(before.get("execution_count", 0))
    ensemble = client.get_inference_statistics("waits", as_json=True)["model_stats"][0]
    assert int(ensemble["inference_stats"]["fail"]["count"]) >= 1


def test_a_cancelled_request_drops_its_queued_step(server):
    import queue
    import time
    client = grpcclient.InferenceServerClient(server.url)
    before = client.get_inference_statistics("slow", as_json=True)["model_stats"][0]
    answers = queue.Queue()
    given = grpcclient.InferInput("INPUT", [1, 4], "FP32")
    given.set_data_from_numpy(data(1))
    call = client.async_infer("waits", [given], callback=lambda result, error: answers.put(error))
    time.sleep(0.3)
    call.cancel()
    error = answers.get(timeout=10)
    assert error is not None and "CANCELLED" in str(error.status())
    time.sleep(3.5)  # past the slow model's batching delay
    after = client.get_inference_statistics("slow", as_json=True)["model_stats"][0]
    assert int(after.get("execution_count", 0)) == int(before.get("execution_count", 0))


def inference_stats(client, model):
    return client.get_inference_statistics(model, as_json=True)["model_stats"][0]


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_cached_ensemble_answers_a_repeat_without_running_its_steps(server, protocol):
    client, module = client_for(server, protocol)
    stats = grpcclient.InferenceServerClient(server.url)
    x = data(3, seed=7 if protocol == "grpc" else 8)
    n, combined = by_hand(x)
    before = {m: inference_stats(stats, m) for m in ("cached", "normalise", "add")}
    for _ in range(3):
        result = infer(client, module, "cached", x)
        np.testing.assert_allclose(result.as_numpy("OUTPUT"), combined, rtol=1e-6)
        np.testing.assert_allclose(result.as_numpy("normalised"), n, rtol=1e-6)
    after = {m: inference_stats(stats, m) for m in ("cached", "normalise", "add")}

    def count(s, field):
        return int(s["inference_stats"].get(field, {}).get("count", 0))

    assert count(after["cached"], "cache_miss") - count(before["cached"], "cache_miss") == 1
    assert count(after["cached"], "cache_hit") - count(before["cached"], "cache_hit") == 2
    for model in ("normalise", "add"):  # the steps ran once, for the miss
        assert int(after[model]["inference_count"]) - int(before[model].get("inference_count", 0)) == 3


def test_identical_ensemble_requests_share_one_run(server):
    """Eight identical requests while the first one's step waits in the slow model's queue: one
    run of the steps, seven answers shared with it (the cache's single flight)."""
    stats = grpcclient.InferenceServerClient(server.url)
    slow_before = int(inference_stats(stats, "slow").get("inference_count", 0))
    x = data(1, seed=11)

    def one(_):
        client = grpcclient.InferenceServerClient(server.url)
        return infer(client, grpcclient, "cached_slow", x).as_numpy("OUTPUT")

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for got in pool.map(one, range(8)):
            np.testing.assert_allclose(got, x * 2.0, rtol=1e-6)
    assert int(inference_stats(stats, "slow")["inference_count"]) - slow_before == 1


def test_max_inflight_requests_lets_one_request_per_step_into_its_model(server):
    """16 callers at once through an ensemble with max_inflight_requests 1: every answer right, and
    each step's model ran them one at a time (as many executions as requests)."""
    stats = grpcclient.InferenceServerClient(server.url)
    before = {m: inference_stats(stats, m) for m in ("normalise", "double")}

    def one(i):
        client = grpcclient.InferenceServerClient(server.url)
        x = data(1, seed=100 + i)
        np.testing.assert_allclose(infer(client, grpcclient, "one_at_a_time", x).as_numpy("OUTPUT"),
                                   by_hand(x)[0] * 2.0, rtol=1e-6)
        return True

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        assert all(pool.map(one, range(16)))
    for model in ("normalise", "double"):
        after = inference_stats(stats, model)
        runs = int(after["execution_count"]) - int(before[model].get("execution_count", 0))
        rows = int(after["inference_count"]) - int(before[model].get("inference_count", 0))
        assert rows == 16 and runs == 16, (model, rows, runs)


def test_each_load_time_check_refuses_its_ensemble(server):
    client = grpcclient.InferenceServerClient(server.url)
    index = {m.name: m.reason for m in client.get_model_repository_index().models}
    expected = {
        "unknown_model": "ensemble 'unknown_model' step 1 (model 'nowhere') cannot be served",
        "unwritten": "step 1 (model 'double') reads 'missing' (for its input 'INPUT__0'), which is neither an "
                     "ensemble input nor written by any step",
        "cycle": "its steps form a cycle",
        "mistyped": "ensemble 'mistyped' step 2 (model 'as_int'): its input 'INPUT__0' is INT32 [4], but ensemble "
                    "tensor 'n' (output 'OUTPUT__0' of step 1) is FP32 [4]",
        "no_such_input": "model 'double' has no input 'WRONG__0'",
        "twice_written": "ensemble tensor 'OUTPUT' is written by step 1 (model 'double') and by step 2 "
                         "(model 'square')",
    }
    for name, reason in expected.items():
        assert reason in index[name], (name, index[name])
        assert not client.is_model_ready(name)


def test_explicit_mode_loads_the_steps_models_and_an_unloaded_one_is_named(tmp_path_factory):
    root = tmp_path_factory.mktemp("ensembles_explicit")
    write_composing(root)
    write_ensemble(root, "chain", CHAIN)
    server = start_server(root, tmp_path_factory, ["--device", "cpu", "--model-control-mode", "explicit"])
    try:
        client = grpcclient.InferenceServerClient(server.url)
        assert not client.is_model_ready("normalise")
        client.load_model("chain")
        assert client.is_model_ready("normalise") and client.is_model_ready("double")
        x = data(1)
        np.testing.assert_allclose(infer(client, grpcclient, "chain", x).as_numpy("OUTPUT"), by_hand(x)[0] * 2.0,
                                   rtol=1e-6)
        client.unload_model("double")
        assert not client.is_model_ready("chain")  # a step's model is gone
        index = {m.name: m for m in client.get_model_repository_index().models}
        assert index["chain"].state == "UNAVAILABLE", index["chain"]
        assert "step 2 (model 'double') cannot be served" in index["chain"].reason
        import json
        import urllib.request
        ready_only = urllib.request.urlopen(urllib.request.Request(
            f"http://{server.http_url}/v2/repository/index", data=b'{"ready": true}', method="POST"))
        assert "chain" not in {m["name"] for m in json.loads(ready_only.read())}
        with pytest.raises(InferenceServerException) as error:
            infer(client, grpcclient, "chain", x)
        assert "ensemble 'chain' step 2 (model 'double') failed" in error.value.message()
        assert "StatusCode.UNAVAILABLE" in str(error.value.status())
        client.load_model("double")
        assert client.is_model_ready("chain")
        np.testing.assert_allclose(infer(client, grpcclient, "chain", x).as_numpy("OUTPUT"), by_hand(x)[0] * 2.0,
                                   rtol=1e-6)
        # Unloading the ensemble leaves its models; with unload_dependents (gRPC and HTTP alike)
        # they go too.
        import tritonclient.http as httpclient
        rest = httpclient.InferenceServerClient(server.http_url)
        for unloader in (client, rest):
            client.load_model("chain")
            unloader.unload_model("chain")
            assert client.is_model_ready("normalise") and client.is_model_ready("double")
            client.load_model("chain")
            unloader.unload_model("chain", unload_dependents=True)
            assert not client.is_model_ready("chain")
            assert not client.is_model_ready("normalise") and not client.is_model_ready("double")
        assert "model_repository(unload_dependents)" in client.get_server_metadata().extensions
    finally:
        assert server.stop() == 0, server.log()
