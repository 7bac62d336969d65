"""Dynamic batching end to end: concurrent clients against the real server, each answer equal to
the un-batched torch reference; queue timeouts, caps, cancellation and padding; ModelStatistics."""
import concurrent.futures
from functools import partial
import threading
import time
import warnings

import grpc
import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from conftest import start_server
from harness.bench import batch_executions


def row_mix(x):
    """What the batched test models compute (make_test_repository.RowMix), in torch."""
    t = torch.from_numpy(x)
    return (t * 2.0 + t.sum(dim=1, keepdim=True)).numpy()


def statistics(triton, model):
    return triton.get_inference_statistics(model).model_stats[0]


def infer(client, model, data, **kwargs):
    inp = grpcclient.InferInput("INPUT__0", list(data.shape), "FP32")
    inp.set_data_from_numpy(data)
    return client.infer(model, [inp], **kwargs)


def test_32_concurrent_clients_get_the_unbatched_reference(server, triton):
    before = statistics(triton, "batched")
    errors = []

    def client_loop(index):
        client = grpcclient.InferenceServerClient(url=server.url)
        rng = np.random.default_rng(index)
        try:
            for _ in range(15):
                rows = int(rng.integers(1, 4))
                data = rng.random((rows, 4), dtype=np.float32) * 100
                got = infer(client, "batched", data).as_numpy("OUTPUT__0")
                np.testing.assert_allclose(got, row_mix(data), rtol=1e-6, atol=1e-5)
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)
        finally:
            client.close()

    threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    after = statistics(triton, "batched")
    inferences = after.inference_count - before.inference_count
    executions = after.execution_count - before.execution_count
    assert inferences >= 32 * 15
    assert executions > 0
    assert inferences / executions > 1.5, f"average batch {inferences / executions:.2f}"
    assert after.inference_stats.queue.count > before.inference_stats.queue.count
    assert any(b.batch_size > 1 for b in after.batch_stats)


def test_statistics_rpc_matches_triton_meaning(triton, stub):
    stats = statistics(triton, "padded")
    assert stats.name == "padded" and stats.version == "1"
    everything = stub.ModelStatistics(service_pb2.ModelStatisticsRequest(), timeout=5)
    assert {s.name for s in everything.model_stats} >= {"batched", "dtype_fp32", "versioned"}
    with pytest.raises(grpc.RpcError) as error:
        stub.ModelStatistics(service_pb2.ModelStatisticsRequest(name="nope"), timeout=5)
    assert error.value.code() == grpc.StatusCode.NOT_FOUND


def test_padding_rows_never_reach_the_caller(triton):
    before = batch_executions(statistics(triton, "padded"))
    data = np.arange(4, dtype=np.float32).reshape(1, 4)
    result = infer(triton, "padded", data)
    assert result.as_numpy("OUTPUT__0").shape == (1, 4)
    np.testing.assert_allclose(result.as_numpy("OUTPUT__0"), row_mix(data))
    after = batch_executions(statistics(triton, "padded"))
    assert after.get(4, 0) == before.get(4, 0) + 1  # the model saw a batch of 4
    assert set(after) == {4}


def test_queue_timeout_drops_the_request_before_the_model(triton):
    before = statistics(triton, "slow_queue")
    started = time.monotonic()
    with pytest.raises(InferenceServerException) as error:
        infer(triton, "slow_queue", np.ones((1, 4), np.float32), timeout=20000)  # 20 ms
    assert error.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    assert "did not run" in error.value.message()
    assert time.monotonic() - started < 1.0  # well before the 1.5 s batching delay
    after = statistics(triton, "slow_queue")
    assert after.execution_count == before.execution_count
    assert after.inference_stats.fail.count == before.inference_stats.fail.count + 1


def test_full_queue_rejects_at_once_and_queued_requests_still_run(server):
    # slow_queue: max_queue_size 2 and a 1.5 s delay, so of three requests sent together two
    # wait and exactly one is turned away at once, whatever their order.
    data = np.ones((1, 4), np.float32)
    clients = [grpcclient.InferenceServerClient(url=server.url) for _ in range(3)]

    def call(client):
        started = time.monotonic()
        try:
            return infer(client, "slow_queue", data), time.monotonic() - started
        except InferenceServerException as error:
            return error, time.monotonic() - started

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        outcomes = list(pool.map(call, clients))
    for client in clients:
        client.close()
    rejected = [(r, t) for r, t in outcomes if isinstance(r, InferenceServerException)]
    served = [r for r, _ in outcomes if not isinstance(r, InferenceServerException)]
    assert len(rejected) == 1 and len(served) == 2, outcomes
    error, elapsed = rejected[0]
    assert error.status() == "StatusCode.UNAVAILABLE"
    assert "max_queue_size" in error.message()
    assert elapsed < 1.0  # at once, not after the batching delay
    for result in served:
        np.testing.assert_allclose(result.as_numpy("OUTPUT__0"), row_mix(data))


def test_cancelled_call_leaves_the_queue(server, triton):
    from tritonclient.grpc import service_pb2_grpc
    before = statistics(triton, "slow_queue")
    request = service_pb2.ModelInferRequest(model_name="slow_queue")
    request.inputs.add(name="INPUT__0", datatype="FP32", shape=[1, 4])
    request.raw_input_contents.append(np.ones((1, 4), np.float32).tobytes())
    with grpc.insecure_channel(server.url) as channel:
        future = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer.future(request, timeout=30)
        time.sleep(0.2)  # let it reach the queue
        future.cancel()
        deadline = time.monotonic() + 1.0  # well before the 1.5 s batching delay
        while time.monotonic() < deadline:
            now = statistics(triton, "slow_queue")
            if now.inference_stats.fail.count > before.inference_stats.fail.count:
                break
            time.sleep(0.02)
    assert now.inference_stats.fail.count == before.inference_stats.fail.count + 1
    assert now.execution_count == before.execution_count


def task_files(pid):
    """(thread id, /proc stat fields from the 3rd on, /proc status as a dict) of every thread of
    `pid` still there when read."""
    import os
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                status = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
        except OSError:
            continue
        yield int(tid), fields, status


def thread_counters(pid):
    """[(name, scheduling policy, voluntary context switches)] of every thread of `pid`."""
    # stat's 41st field is the policy (0 SCHED_OTHER, 3 SCHED_BATCH); fields[0] is the 3rd.
    return [(status["Name"].strip(), int(fields[38]), int(status["voluntary_ctxt_switches"]))
            for _, fields, status in task_files(pid)]


def worker_switches(pid):
    return sum(switches for name, _, switches in thread_counters(pid) if name.startswith("sluice-worker"))


def thread_cpus(pid):
    """{thread id: (name, set of CPUs it may run on)} of every thread of `pid`."""
    found = {}
    for tid, _, status in task_files(pid):
        cpus = set()
        for part in status["Cpus_allowed_list"].strip().split(","):
            first, _, last = part.partition("-")
            cpus.update(range(int(first), int(last or first) + 1))
        found[tid] = (status["Name"].strip(), cpus)
    return found


def test_model_cpus_keep_every_other_thread_off_the_models_cpus(tmp_path_factory):
    """--model-cpus: the models' workers, and the OpenMP threads a worker's forward pass starts
    (libgomp's threads take their creator's name), run on the CPUs named, every other thread of the
    server on the rest; the CPU thread split counts the CPUs named; the answers are unchanged.
    Naming every CPU (as a list or a count), or one the process may not use, is refused at start
    with the reason."""
    import os
    import subprocess
    from conftest import SERVER
    from make_test_repository import RowMix, tensor_block, write_model
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("needs two CPUs")
    root = tmp_path_factory.mktemp("model_cpus")
    write_model(root, "rows", 'platform: "pytorch_libtorch"\nmax_batch_size: 8\n'
                + tensor_block("input", "INPUT__0", "TYPE_FP32", [4])
                + tensor_block("output", "OUTPUT__0", "TYPE_FP32", [4])
                + "dynamic_batching { }\ninstance_group [{ kind: KIND_CPU count: 2 }]\n", RowMix())
    # Asks to run on the receiving thread (a gRPC thread): --model-cpus turns that off.
    write_model(root, "cheap", 'platform: "pytorch_libtorch"\nmax_batch_size: 8\n'
                + tensor_block("input", "INPUT__0", "TYPE_FP32", [4])
                + tensor_block("output", "OUTPUT__0", "TYPE_FP32", [4])
                + "dynamic_batching { }\ninstance_group [{ kind: KIND_CPU count: 1 }]\n"
                + 'parameters { key: "sluice.run_on_receiving_thread" value { string_value: "true" } }\n', RowMix())
    # Wide enough rows that LibTorch's elementwise kernels run on two OpenMP threads.
    write_model(root, "wide", 'platform: "pytorch_libtorch"\nmax_batch_size: 1\n'
                + tensor_block("input", "INPUT__0", "TYPE_FP32", [1 << 18])
                + tensor_block("output", "OUTPUT__0", "TYPE_FP32", [1 << 18])
                + "instance_group [{ kind: KIND_CPU count: 1 }]\n"
                + 'parameters { key: "INTRA_OP_THREAD_COUNT" value { string_value: "2" } }\n', RowMix())
    model_cpu = allowed[0]
    front_ends = set(allowed[1:])
    # The list form here; test_deploy starts a server with the count form (last:N).
    server = start_server(root, tmp_path_factory, ["--device", "cpu", "--model-cpus", str(model_cpu)])
    try:
        log = server.log()
        assert f"event=cpu_split models={model_cpu} front_ends={','.join(map(str, sorted(front_ends)))}" in log, log
        assert ('event=run_on_receiving_thread model=cheap version=1 on=false '
                'reason="--model-cpus keeps forward passes off the front ends\' CPUs"') in log, log
        assert "event=cpu_threads cpus=1 " in log and f"(--model-cpus {model_cpu})" in log, log
        client = grpcclient.InferenceServerClient(server.url)
        try:
            x = np.arange(12, dtype=np.float32).reshape(3, 4)
            inp = grpcclient.InferInput("INPUT__0", [3, 4], "FP32")
            inp.set_data_from_numpy(x)
            want = RowMix()(torch.from_numpy(x)).numpy()
            np.testing.assert_allclose(client.infer("rows", [inp]).as_numpy("OUTPUT__0"), want, rtol=1e-5)
            wide = np.random.default_rng(4).standard_normal((1, 1 << 18)).astype(np.float32)
            inp = grpcclient.InferInput("INPUT__0", [1, 1 << 18], "FP32")
            inp.set_data_from_numpy(wide)
            want = RowMix()(torch.from_numpy(wide)).numpy()
            np.testing.assert_allclose(client.infer("wide", [inp]).as_numpy("OUTPUT__0"), want, rtol=1e-4, atol=1e-3)
        finally:
            client.close()
        threads = thread_cpus(server.process.pid).values()
        workers = [cpus for name, cpus in threads if name.startswith("sluice-worker")]
        # Four instances, and at least one OpenMP thread beside the "wide" instance's worker.
        assert len(workers) >= 5 and all(cpus == {model_cpu} for cpus in workers), threads
        others = [(name, cpus) for name, cpus in threads if not name.startswith("sluice-worker")]
        assert others and all(cpus == front_ends for _, cpus in others), others
    finally:
        server.stop()
    for cpus, reason in ((",".join(map(str, allowed)), "leave at least one for the front ends"),
                         (f"{allowed[0]},{allowed[-1] + 1}", f"{allowed[-1] + 1} are not among the CPUs this process may use"),
                         ("1-0", "runs backwards"),
                         (f"last:{len(allowed)}", f"last:{len(allowed)} would give the models every CPU")):
        result = subprocess.run([SERVER, "--model-repository", str(root), "--device", "cpu", "--model-cpus", cpus],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode != 0 and reason in result.stderr, (result.returncode, result.stderr)


def test_model_cpus_in_a_shared_pool_under_a_quota_are_named_in_a_warning(tmp_path):
    """--model-cpus where the process's CPUs are a shared pool (its mask holds more CPUs than its
    cgroup quota lets it use, as in a Kubernetes pod without dedicated CPUs): the split still
    happens, and the log says the CPUs are not the server's own. A real cgroup with a CPU quota
    (v1's cpu controller or v2's cpu.max), made for the test; skipped where this process cannot
    make one."""
    import os
    import subprocess
    import uuid
    from conftest import SERVER
    from harness.server import free_port
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("needs two CPUs")
    name = f"sluice-test-{uuid.uuid4().hex[:8]}"
    if os.path.isdir("/sys/fs/cgroup/cpu") and os.path.exists("/sys/fs/cgroup/cpu/cgroup.procs"):
        group, quota = os.path.join("/sys/fs/cgroup/cpu", name), ("cpu.cfs_quota_us", "50000")
    elif os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
        group, quota = os.path.join("/sys/fs/cgroup", name), ("cpu.max", "50000 100000")
    else:
        pytest.skip("no cgroup CPU controller found")
    try:
        os.mkdir(group)
        with open(os.path.join(group, quota[0]), "w") as f:
            f.write(quota[1])
    except OSError as e:
        if os.path.isdir(group):
            os.rmdir(group)
        pytest.skip(f"cannot make a cgroup with a CPU quota here: {e}")
    cpus = ",".join(map(str, allowed))
    # A shell that joins the cgroup (or exits 97), then runs what follows; taskset restores this
    # process's CPU mask, which joining a cgroup with its own cpuset (v2) may widen.
    join = ["bash", "-c", f'echo $$ > {group}/cgroup.procs || exit 97; exec taskset -c {cpus} "$@"', "bash"]
    try:
        # The server finds its cgroup from /proc/self/cgroup under the mount: where this
        # process's cgroups are not at the mount's root (a container sharing the host's cgroup
        # namespace), that path does not lead to the group made here.
        member = subprocess.run(join + ["cat", "/proc/self/cgroup"], capture_output=True, text=True, timeout=30)
        if member.returncode == 97:
            pytest.skip(f"cannot move a process into the cgroup here: {member.stderr}")
        paths = [line.split(":", 2) for line in member.stdout.splitlines()]
        if group.startswith("/sys/fs/cgroup/cpu/"):
            seen = [os.path.join("/sys/fs/cgroup/cpu", path.lstrip("/")) for _, controllers, path in paths
                    if "cpu" in controllers.split(",")]
        else:
            seen = [os.path.join("/sys/fs/cgroup", path.lstrip("/")) for number, _, path in paths if number == "0"]
        if seen != [group]:
            pytest.skip(f"this process's cgroup paths are not under the mount's root here: {member.stdout}")
        (tmp_path / "repository").mkdir()
        command = [SERVER, "--model-repository", str(tmp_path / "repository"), "--device", "cpu",
                   "--model-cpus", "last:1", "--grpc-port", str(free_port()), "--http-port", str(free_port()),
                   "--metrics-port", str(free_port())]
        log_path = tmp_path / "server.log"
        with open(log_path, "w") as out:
            server = subprocess.Popen(join + command, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 30
            while (time.monotonic() < deadline and server.poll() is None
                   and "event=models_loaded" not in log_path.read_text()):
                time.sleep(0.1)
        finally:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        log = log_path.read_text()
        assert f"event=cpu_split models={allowed[-1]} " in log, log
        # The quota found is the one of the group made here (the path ends the figure).
        assert (f'event=model_cpus_shared reason="the process may run on {len(allowed)} CPUs but its cgroup quota '
                'lets it use 1 (') in log and f"cgroup quota 0.5 ({group})" in log, log
        assert "shared pool, not its own" in log, log
    finally:
        # The kernel may take a moment to let go of a process that has just exited.
        for _ in range(20):
            try:
                os.rmdir(group)
                break
            except OSError:
                time.sleep(0.1)
        else:
            warnings.warn(f"could not remove the test's cgroup {group}")


def test_a_cheap_model_runs_on_the_receiving_thread_and_a_slow_one_does_not(tmp_path_factory):
    """sluice.run_on_receiving_thread: requests sent one at a time run on gRPC's thread (the
    model's worker never wakes), with the same answers; over its bound, or over HTTP, they go to
    the worker. Also --model-threads-first (the default): gRPC's threads, and the batchers of
    models that form batches at once, run SCHED_BATCH; the models' workers, and a batcher with a
    queue delay, SCHED_OTHER."""
    from make_test_repository import RowMix, tensor_block, write_model
    import tritonclient.http as httpclient
    root = tmp_path_factory.mktemp("receiving_thread")
    row_io = (tensor_block("input", "INPUT__0", "TYPE_FP32", [4])
              + tensor_block("output", "OUTPUT__0", "TYPE_FP32", [4]))
    for name, bound in (("cheap", 100000), ("over_bound", 1)):
        write_model(root, name, 'platform: "pytorch_libtorch"\nmax_batch_size: 8\n' + row_io
                    + "dynamic_batching { }\ninstance_group [{ kind: KIND_CPU count: 1 }]\n"
                    + 'parameters { key: "sluice.run_on_receiving_thread" value { string_value: "true" } }\n'
                    + f'parameters {{ key: "sluice.run_on_receiving_thread_max_us" value {{ string_value: "{bound}" }} }}\n',
                    RowMix())
    # A batcher with a timer to keep (a queue delay here; a latency target alike) stays SCHED_OTHER.
    write_model(root, "delayed", 'platform: "pytorch_libtorch"\nmax_batch_size: 8\n' + row_io
                + "dynamic_batching { max_queue_delay_microseconds: 100 }\n"
                + "instance_group [{ kind: KIND_CPU count: 1 }]\n", RowMix())
    server = start_server(root, tmp_path_factory, ["--device", "cpu"])
    try:
        log = server.log()
        assert "event=run_on_receiving_thread model=cheap version=1 on=true" in log, log
        assert "event=run_on_receiving_thread model=over_bound version=1 on=false" in log, log
        assert "the bound is 1 us (sluice.run_on_receiving_thread_max_us)" in log, log
        pid = server.process.pid
        policies = thread_counters(pid)
        assert {policy for name, policy, _ in policies if name.startswith("sluice-worker")} == {0}, policies
        # cheap's and over_bound's batchers form batches at once: SCHED_BATCH; delayed's SCHED_OTHER.
        assert sorted(policy for name, policy, _ in policies if name.startswith("sluice-batcher")) == [0, 3, 3], policies
        assert {policy for name, policy, _ in policies
                if not name.startswith(("sluice-worker", "sluice-batcher"))} == {3}, policies

        rng = np.random.default_rng(3)
        client = grpcclient.InferenceServerClient(server.url)
        http = httpclient.InferenceServerClient(server.http_url)
        try:
            # Over its bound each request goes to the worker, which sleeps once per request less
            # the times the next request arrived before it went back to sleep (95 of 100 once on
            # a loaded host): at least half, against at most 10 of 100 on the receiving thread.
            for model, at_most, at_least in (("cheap", 10, 0), ("over_bound", None, 50)):
                before = worker_switches(pid)
                for _ in range(100):
                    data = rng.random((1, 4), dtype=np.float32)
                    result = infer(client, model, data)
                    np.testing.assert_allclose(result.as_numpy("OUTPUT__0"), row_mix(data), rtol=1e-6)
                woke = worker_switches(pid) - before
                assert woke >= at_least, (model, woke)
                if at_most is not None:
                    assert woke <= at_most, (model, woke)  # a few: warm-up's tail, a request racing it
            # HTTP's event loop is never held: its requests go to the worker. One sleep of the
            # worker per request, less one where the next request arrived before the worker went
            # back to sleep (19 of 20 once on a loaded host): at least half of 40, against at most
            # 10 of 100 on the receiving thread above.
            before = worker_switches(pid)
            for _ in range(40):
                data = rng.random((1, 4), dtype=np.float32)
                inp = httpclient.InferInput("INPUT__0", [1, 4], "FP32")
                inp.set_data_from_numpy(data)
                np.testing.assert_allclose(http.infer("cheap", [inp]).as_numpy("OUTPUT__0"), row_mix(data), rtol=1e-6)
            assert worker_switches(pid) - before >= 20
            # Concurrent callers: whoever finds the instance busy queues; every answer is right.
            def call(i):
                data = np.full((1, 4), float(i), np.float32)
                return infer(client, "cheap", data).as_numpy("OUTPUT__0"), row_mix(data)
            with concurrent.futures.ThreadPoolExecutor(8) as pool:
                for got, want in pool.map(call, range(200)):
                    np.testing.assert_allclose(got, want, rtol=1e-6)
        finally:
            client.close()
            http.close()
    finally:
        assert server.stop() == 0, server.log()


class SlowMix(torch.nn.Module):
    """Rows independent of each other, about a quarter of a millisecond of CPU per row (48
    products of 512 x 512): slow enough that a burst of requests holds more work than a short
    latency target allows, however fast the client sends."""

    def __init__(self):
        super().__init__()
        generator = torch.Generator().manual_seed(5)
        self.w_in = torch.nn.Parameter(torch.randn(4, 512, generator=generator) / 2, requires_grad=False)
        self.layers = torch.nn.Parameter(torch.randn(4, 512, 512, generator=generator) / 23, requires_grad=False)
        self.w_out = torch.nn.Parameter(torch.randn(512, 4, generator=generator) / 23, requires_grad=False)

    def forward(self, INPUT__0: torch.Tensor) -> torch.Tensor:
        h = INPUT__0 @ self.w_in
        for i in range(48):
            h = torch.relu(h @ self.layers[i % 4])
        return h @ self.w_out


def test_a_latency_target_refuses_at_once_what_it_cannot_answer_in_time(tmp_path_factory):
    """sluice.latency_target_us: a burst holding far more work than the target allows gets some
    answers (equal to the model's) and, at once, UNAVAILABLE with the reason for the rest; the
    refusals are counted in the metrics and the statistics, and the server keeps serving."""
    import tritonclient.http as httpclient
    from make_test_repository import tensor_block, write_model
    root = tmp_path_factory.mktemp("latency_target")
    row_io = (tensor_block("input", "INPUT__0", "TYPE_FP32", [4])
              + tensor_block("output", "OUTPUT__0", "TYPE_FP32", [4]))
    module = SlowMix().eval()
    write_model(root, "slow", 'platform: "pytorch_libtorch"\nmax_batch_size: 8\n' + row_io
                + "dynamic_batching { }\ninstance_group [{ kind: KIND_CPU count: 1 }]\n"
                + 'parameters { key: "sluice.latency_target_us" value { string_value: "5000" } }\n', module)
    server = start_server(root, tmp_path_factory, ["--device", "cpu"])
    client = grpcclient.InferenceServerClient(server.url)
    try:
        data = np.random.default_rng(11).random((64, 1, 4), dtype=np.float32)
        with torch.no_grad():
            want = [module(torch.from_numpy(x)).numpy() for x in data]
        answers = [None] * len(data)
        done = threading.Semaphore(0)

        def callback(index, result, error):
            answers[index] = (result, error, time.monotonic())
            done.release()

        sent = time.monotonic()
        for i, x in enumerate(data):
            inp = grpcclient.InferInput("INPUT__0", [1, 4], "FP32")
            inp.set_data_from_numpy(x)
            client.async_infer("slow", [inp], partial(callback, i))
        for _ in data:
            assert done.acquire(timeout=60)
        ok = refused = 0
        for i, (result, error, at) in enumerate(answers):
            if error is None:
                np.testing.assert_allclose(result.as_numpy("OUTPUT__0"), want[i], rtol=1e-4, atol=1e-5)
                ok += 1
            else:
                assert error.status() == "StatusCode.UNAVAILABLE", error
                assert "within its latency target of 5000 us (sluice.latency_target_us)" in error.message(), error
                refused += 1
        # 64 rows of this model take far longer than 5 ms on one instance: both happen.
        assert ok > 0 and refused > 0, (ok, refused)
        text = server.metrics_text()
        counted = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                      if line.startswith('sluice_latency_refusals_total{model="slow"'))
        assert counted == refused, text
        assert 'sluice_batch_cost_ratio_count{model="slow",version="1"}' in text
        # The statistics extension shows the target, the refusals and the live costs (Sluice's
        # own fields: tritonclient's gRPC client parses the response unchanged, skipping them).
        (grpc_stats,) = client.get_inference_statistics("slow", as_json=True)["model_stats"]
        assert "sluice_latency_target" not in grpc_stats and int(grpc_stats["inference_count"]) >= ok
        http = httpclient.InferenceServerClient(server.http_url)
        try:
            (stats,) = http.get_inference_statistics("slow")["model_stats"]
        finally:
            http.close()
        target = stats["sluice_latency_target"]
        assert int(target["target_us"]) == 5000 and int(target["refused_for_target"]) == refused, target
        assert 0 < float(target["plan_share"]) <= 1, target
        # Every answer counted against the target inside the server (the lone request below and
        # earlier ones may add more; these were all answered before the statistics were read).
        assert int(target["answered"]) >= ok and 0 <= int(target.get("answered_late", 0)) <= int(target["answered"]), target
        costs = target["batch_costs"]
        assert costs and all(c["shape_group"] == "INPUT__0[4,]" and int(c["ns"]) > 0 for c in costs), costs
        assert sum(int(c.get("observations", 0)) for c in costs) > 0, costs  # corrected by the batches that ran
        # Still serving: a lone request is answered. On a loaded machine one lone request may still
        # be refused by the target (its wait plus the predicted cost over 5 ms), so a few tries.
        inp = grpcclient.InferInput("INPUT__0", [1, 4], "FP32")
        inp.set_data_from_numpy(data[0])
        answer = None
        for _ in range(20):
            try:
                answer = client.infer("slow", [inp]).as_numpy("OUTPUT__0")
                break
            except InferenceServerException as error:
                assert "within its latency target" in error.message(), error
                time.sleep(0.05)
        assert answer is not None, "every lone request was refused"
        np.testing.assert_allclose(answer, want[0], rtol=1e-4, atol=1e-5)
        assert time.monotonic() - sent < 60
    finally:
        client.close()
        server.stop()


def test_a_latency_target_does_not_hold_a_closed_loop_until_its_target(tmp_path_factory):
    """A closed loop of 8 callers (perf_analyzer --concurrency-range 8) against a model whose
    max_batch_size is larger: once every caller waits in the queue no request can arrive, and the
    latency target's wait for one more arrival must end (its silence bound, BatchQueue::
    StopWaitingAt) instead of holding each batch until the oldest request's 400 ms had nearly
    passed (which it did, and the overload rule then refused requests: UNAVAILABLE)."""
    from make_test_repository import tensor_block, write_model
    root = tmp_path_factory.mktemp("latency_target_closed_loop")
    row_io = (tensor_block("input", "INPUT__0", "TYPE_FP32", [4])
              + tensor_block("output", "OUTPUT__0", "TYPE_FP32", [4]))
    write_model(root, "slow", 'platform: "pytorch_libtorch"\nmax_batch_size: 32\n' + row_io
                + "dynamic_batching { }\ninstance_group [{ kind: KIND_CPU count: 1 }]\n"
                + 'parameters { key: "sluice.latency_target_us" value { string_value: "400000" } }\n',
                SlowMix().eval())
    server = start_server(root, tmp_path_factory, ["--device", "cpu"])
    latencies, errors = [], []
    lock = threading.Lock()

    def caller(seed):
        client = grpcclient.InferenceServerClient(server.url)
        x = np.random.default_rng(seed).random((1, 4), dtype=np.float32)
        try:
            end = time.monotonic() + 3.0
            while time.monotonic() < end:
                inp = grpcclient.InferInput("INPUT__0", [1, 4], "FP32")
                inp.set_data_from_numpy(x)
                started = time.monotonic()
                try:
                    client.infer("slow", [inp])
                    with lock:
                        latencies.append(time.monotonic() - started)
                except Exception as error:  # noqa: BLE001 (every failure is the test's finding)
                    with lock:
                        errors.append(str(error))
        finally:
            client.close()

    try:
        threads = [threading.Thread(target=caller, args=(seed,)) for seed in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        # The bug refused requests by the dozen. A stall of the whole machine (seen once in a
        # container: a request starved for 345 ms) may still cost one or two near the target:
        # at most two and 1 % of the calls.
        assert len(errors) <= 2 + (len(latencies) + len(errors)) // 100, (len(errors), len(latencies), errors[:3])
        latencies.sort()
        # A batch of this model takes milliseconds to a few tens of them on a busy machine: far
        # below the ~390 ms each answer took while the queue waited for an arrival that could not come.
        assert len(latencies) >= 16 and latencies[len(latencies) // 2] < 0.15, (len(latencies), latencies[::8])
    finally:
        server.stop()
