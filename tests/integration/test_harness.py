"""The harness the tests, benchmarks and GPU kit share (tests/harness): a server that loses its
port to another process is started again on new ports, one that fails for another reason is not
(its log is in the error), stop() reports a clean shutdown, and a failed perf_analyzer run says
why."""
import os
import socket

import pytest

from conftest import SERVER
from harness import perf_analyzer, process, server as harness_server
from harness.server import SluiceServer


@pytest.fixture()
def repository(tmp_path):
    root = tmp_path / "repository"
    root.mkdir()
    return root


def test_a_server_that_lost_its_port_is_started_again_on_new_ports(repository, tmp_path, monkeypatch):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    real = harness_server.free_port
    handed = []

    def first_the_taken_port():
        handed.append(port if not handed else real())
        return handed[-1]

    monkeypatch.setattr(harness_server, "free_port", first_the_taken_port)
    server = SluiceServer(SERVER, repository, ["--device", "cpu"], log_path=str(tmp_path / "server.log"))
    try:
        with server:
            assert server.port != port and server.url == f"127.0.0.1:{server.port}"
            assert server._spawns_left == 1  # started twice out of three
            assert server.ready_s is not None and server.ready_s > 0
        assert server.process.returncode == 0
    finally:
        taken.close()


def test_a_server_that_fails_otherwise_is_not_started_again(tmp_path):
    server = SluiceServer(SERVER, tmp_path / "absent", log_path=str(tmp_path / "server.log"))
    with pytest.raises(RuntimeError, match="is not a directory") as failure:
        server.start(timeout=60)
    assert server._spawns_left == 2  # one start, no retry
    assert str(tmp_path / "absent") in str(failure.value)  # the command line is in the error


def test_port_options_and_stop(repository, tmp_path):
    server = SluiceServer(SERVER, repository, ["--device", "cpu", "--allow-http", "false"],
                          log_path=str(tmp_path / "server.log"), metrics_port=0, http_port=None)
    with server:
        assert "--http-port" not in server.args and "--http-address" not in server.args
        assert server.args[server.args.index("--metrics-port") + 1] == "0"
        assert "--metrics-address" not in server.args
        assert server.http_url is None
        assert process.rss_bytes(server.process.pid) > 1 << 20
        assert process.cpu_seconds(server.process.pid) >= 0
        # perf_analyzer's failure comes back with its own words (here: no such model).
        with pytest.raises(RuntimeError, match="perf_analyzer failed for absent") as failure:
            perf_analyzer.run(server.url, "absent", 1, str(tmp_path / "absent.csv"), smoke=True, timeout=120)
        assert "absent" in str(failure.value).split("\n", 1)[1]
        # With a log file (the GPU kit's steps): the output goes there as it runs, and the error
        # still carries it.
        log = tmp_path / "perf_analyzer.txt"
        with pytest.raises(RuntimeError, match="perf_analyzer failed for absent") as failure:
            perf_analyzer.run(server.url, "absent", 1, str(tmp_path / "absent.csv"), smoke=True, timeout=120,
                              log_path=str(log))
        assert "absent" in str(failure.value).split("\n", 1)[1]
        assert log.read_text().startswith(perf_analyzer.path()) and "absent" in log.read_text().split("\n", 1)[1]
    assert server.stop() == 0  # stopping twice is harmless
    assert process.rss_bytes() > 0 and os.getpid() > 0


def test_metric_value_reads_one_series_exactly():
    text = ('# HELP a_total help\n# TYPE a_total counter\na_total 3\n'
            'a_total_more 9\nb{model="m",version="1"} 2.5\nb{model="m2",version="1"} 7\n')
    assert harness_server.metric_value(text, "a_total") == 3
    assert harness_server.metric_value(text, 'b{model="m",version="1"}') == 2.5
    assert harness_server.metric_value(text, 'b{model="x",version="1"}') is None
    assert harness_server.metric_value(text, "a") is None  # a prefix is not the series


def test_batch_executions_count_the_forwards_a_window_formed(bundled_server):
    import numpy as np
    import tritonclient.grpc as grpcclient
    from harness.bench import batch_executions, executions_between, model_stats
    before = batch_executions(model_stats(bundled_server.url, "mlp"))
    client = grpcclient.InferenceServerClient(url=bundled_server.url)
    try:
        for _ in range(2):  # one at a time: two forwards of one row
            tensor = grpcclient.InferInput("INPUT__0", [1, 784], "FP32")
            tensor.set_data_from_numpy(np.zeros((1, 784), np.float32))
            client.infer("mlp", [tensor])
    finally:
        client.close()
    assert executions_between(before, batch_executions(model_stats(bundled_server.url, "mlp"))) == {1: 2}
    assert executions_between({1: 5, 4: 2}, {1: 5, 4: 3, 8: 1}) == {4: 1, 8: 1}


def test_floor_ab_weighs_the_reference_by_the_forwards_formed():
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                    "benchmarks"))
    import floor_ab
    # In-process: 62 us for one row, 296 us for 16, 505 us for 32 (rows_per_s as the benchmark writes it).
    inproc = {b: {"rows_per_s": 1e6 * b / us} for b, us in ((1, 62.0), (16, 296.0), (32, 505.0))}
    assert floor_ab.execution_us(inproc, 16) == pytest.approx(296.0)
    assert floor_ab.execution_us(inproc, 24) == pytest.approx(296.0 + (505.0 - 296.0) / 2)
    assert floor_ab.execution_us(inproc, 64) == pytest.approx(1010.0)  # beyond the sizes: per row of the largest
    # Forwards of 31 and 1 rows in equal numbers: their mean is 16 rows, but in-process they cost
    # (execution_us(31) + 62) / 32 a row, less than 296 / 16.
    weighted = floor_ab.weighted_per_row_us(inproc, {31: 10, 1: 10})
    assert weighted == pytest.approx((floor_ab.execution_us(inproc, 31) + 62.0) / 32)
    assert weighted < 296.0 / 16
    assert floor_ab.weighted_per_row_us(inproc, {1: 3}) == pytest.approx(62.0)
