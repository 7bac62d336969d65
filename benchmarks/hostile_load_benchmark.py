#!/usr/bin/env python3
"""A well-behaved HTTP client beside hostile ones, on one server, in one run:

    .venv/bin/python benchmarks/hostile_load_benchmark.py [--smoke] [--json out.json]
        [--bin-dir build/bin] [--slow 200] [--bodies 4] [--body-mib 1024] [--sent-mib 300]
        [--budget-mib 2048]

Phases, each timing the same well-behaved client (one keep-alive connection, sequential JSON
inferences on the bundled MLP, batch 1):
  unloaded   nobody else
  hostile    --slow connections trickle a request line one byte every 0.5 s (slow headers), and
             --bodies connections each declare a --body-mib body and send --sent-mib of it, as
             fast as the server takes it, and then stall (half-sent bodies)
The server runs with --http-max-buffered-bytes = --budget-mib. The table shows each phase's p50
and p99 and their ratio to the unloaded phase, the server's RSS before and at its peak during
the hostile phase, and what the hostile connections were answered (408, 503, or nothing). The
server runs on one CPU and the clients on another (taskset), as in the other benchmarks.

Prints a table and writes JSON. --smoke runs a tiny version (the test command runs it so the
script keeps working); its numbers mean nothing.
"""
import argparse
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from harness.bench import make_repository, pinning, serve, write_json  # noqa: E402
from harness.process import rss_bytes  # noqa: E402
from http_benchmark import http_port  # noqa: E402

BODY = json.dumps({"inputs": [{"name": "INPUT__0", "shape": [1, 784], "datatype": "FP32",
                               "data": [0.5] * 784}]})


def client_latencies(port, seconds, stop=None):
    """Sequential inferences on one keep-alive connection for `seconds`: latencies in us."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    latencies = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not (stop and stop.is_set()):
        started = time.perf_counter()
        connection.request("POST", "/v2/models/mlp/infer", BODY, {"Content-Type": "application/json"})
        response = connection.getresponse()
        response.read()
        if response.status != 200:
            raise RuntimeError(f"the well-behaved client got {response.status}")
        latencies.append((time.perf_counter() - started) * 1e6)
    connection.close()
    return latencies


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


class Hostiles:
    """The slow-header and half-sent-body connections, each on its own thread."""

    def __init__(self, port, slow, bodies, body_bytes, sent_bytes):
        self.port, self.slow, self.bodies = port, slow, bodies
        self.body_bytes, self.sent_bytes = body_bytes, sent_bytes
        self.stop = threading.Event()
        self.answers = []
        self.lock = threading.Lock()
        self.threads = []

    def _note(self, answer):
        with self.lock:
            self.answers.append(answer.split(b"\r\n", 1)[0].decode(errors="replace") if answer else "closed/none")

    def _slow(self):
        sockets = []
        for _ in range(self.slow):
            try:
                sockets.append(socket.create_connection(("127.0.0.1", self.port), timeout=5))
            except OSError:
                self._note(b"")
        line = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n"
        at = 0
        while not self.stop.is_set() and sockets:
            for s in list(sockets):
                s.setblocking(False)
                try:
                    answer = s.recv(4096)  # the server answered (408) or closed
                except BlockingIOError:
                    answer = None
                except OSError:
                    answer = b""
                if answer is None:
                    try:
                        s.send(line[at % len(line):at % len(line) + 1])
                        continue
                    except OSError:
                        answer = b""
                sockets.remove(s)
                self._note(answer)
                s.close()
            at += 1
            self.stop.wait(0.5)
        for s in sockets:
            self._note_text("still open at the end")
            s.close()

    def _note_text(self, text):
        with self.lock:
            self.answers.append(text)

    def _body(self):
        try:
            s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        except OSError:
            self._note(b"")
            return
        s.sendall(b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % self.body_bytes)
        chunk = b"x" * (1 << 20)
        sent = 0
        try:
            while sent < self.sent_bytes and not self.stop.is_set():
                s.sendall(chunk)
                sent += len(chunk)
        except OSError:
            pass
        s.settimeout(0.2)
        answer = b""
        while not self.stop.is_set():
            try:
                answer = s.recv(4096)
                break
            except socket.timeout:
                continue
            except OSError:
                break
        self._note(answer)
        s.close()

    def start(self):
        self.threads = [threading.Thread(target=self._slow)]
        self.threads += [threading.Thread(target=self._body) for _ in range(self.bodies)]
        for thread in self.threads:
            thread.start()

    def finish(self):
        self.stop.set()
        for thread in self.threads:
            thread.join(30)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin-dir", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                          "build", "bin"))
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--slow", type=int, default=200)
    parser.add_argument("--bodies", type=int, default=4)
    parser.add_argument("--body-mib", type=int, default=1024)
    parser.add_argument("--sent-mib", type=int, default=300)
    parser.add_argument("--budget-mib", type=int, default=2048)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--no-pin", action="store_true")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.smoke:
        args.slow, args.bodies, args.body_mib, args.sent_mib, args.budget_mib, args.seconds = 4, 1, 8, 4, 64, 1.0
    (server_prefix, client_prefix), pin_note = pinning(not args.no_pin)
    if client_prefix:
        os.sched_setaffinity(0, {int(client_prefix[-1])})

    with tempfile.TemporaryDirectory() as workdir:
        repository = os.path.join(workdir, "models")
        make_repository(repository, batching=True, names=["mlp"])
        # A server from before the byte budget (to compare against) runs without it.
        usage = subprocess.run([os.path.join(args.bin_dir, "sluice-server"), "--help"], capture_output=True,
                               text=True).stdout
        budget = ["--http-max-buffered-bytes", str(args.budget_mib << 20)]
        if "--http-max-buffered-bytes" not in usage:
            budget, args.budget_mib = [], 0
        process, _ = serve(args.bin_dir, repository, ["--device", "cpu", "--http-address", "127.0.0.1", *budget],
                           prefix=server_prefix, log_level="info")
        try:
            port = http_port(repository + ".log")
            client_latencies(port, min(2.0, args.seconds))  # warm-up
            unloaded = client_latencies(port, args.seconds)
            rss_before = rss_bytes(process.pid)
            hostiles = Hostiles(port, args.slow, args.bodies, args.body_mib << 20, args.sent_mib << 20)
            hostiles.start()
            peak = [rss_before]
            sampling = threading.Event()

            def sample():
                while not sampling.is_set():
                    peak[0] = max(peak[0], rss_bytes(process.pid))
                    sampling.wait(0.05)

            sampler = threading.Thread(target=sample)
            sampler.start()
            time.sleep(min(1.0, args.seconds))  # the hostile connections are open and sending
            hostile = client_latencies(port, args.seconds)
            hostiles.finish()
            sampling.set()
            sampler.join()
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)

    phases = []
    for name, latencies in (("unloaded", unloaded), ("hostile", hostile)):
        phases.append({"phase": name, "requests": len(latencies), "p50_us": statistics.median(latencies),
                       "p99_us": percentile(latencies, 0.99)})
    for phase in phases:
        phase["p50_vs_unloaded"] = phase["p50_us"] / phases[0]["p50_us"]
        phase["p99_vs_unloaded"] = phase["p99_us"] / phases[0]["p99_us"]
    answers = {}
    for answer in hostiles.answers:
        answers[answer] = answers.get(answer, 0) + 1
    print(f"\nMLP, batch 1, JSON over HTTP, one keep-alive client; {args.slow} slow-header connections, "
          f"{args.bodies} bodies of {args.body_mib} MiB with {args.sent_mib} MiB sent; budget "
          f"{f'{args.budget_mib} MiB' if args.budget_mib else 'none (this server has no --http-max-buffered-bytes)'}; "
          f"pinning: {pin_note}")
    print(f"{'phase':<10} {'requests':>9} {'p50 us':>9} {'p99 us':>9} {'p50/unl':>8} {'p99/unl':>8}")
    for phase in phases:
        print(f"{phase['phase']:<10} {phase['requests']:>9} {phase['p50_us']:>9.0f} {phase['p99_us']:>9.0f} "
              f"{phase['p50_vs_unloaded']:>8.2f} {phase['p99_vs_unloaded']:>8.2f}")
    print(f"server RSS: {rss_before / 2**20:.0f} MiB before, {peak[0] / 2**20:.0f} MiB at the peak "
          f"({(peak[0] - rss_before) / 2**20:.0f} MiB more)")
    print("hostile connections answered: " + ", ".join(f"{k}: {v}" for k, v in sorted(answers.items())))
    if args.json:
        write_json(args.json, {"benchmark": "hostile_load", "smoke": args.smoke, "pinning": pin_note,
                               "slow": args.slow, "bodies": args.bodies, "body_mib": args.body_mib,
                               "sent_mib": args.sent_mib, "budget_mib": args.budget_mib, "phases": phases,
                               "rss_before": rss_before, "rss_peak": peak[0], "hostile_answers": answers})


if __name__ == "__main__":
    main()
