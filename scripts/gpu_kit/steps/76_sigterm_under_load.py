"""SIGTERM under GPU load, as `docker stop` sends it: ResNet-50 FP16 (preferred batch sizes
{1, 8, 32, 64} padded) served on the GPU with --shutdown-grace-seconds 10 (the default is 30 s;
shorter here so that a stuck drain fits in the step) and --shutdown-delay-seconds 0 (the default),
driven by many client threads, each keeping one gRPC request in flight and counting every request
it sent, every OK answer and every refusal. After about two seconds of load the server gets SIGTERM
while the load goes on. Pass: the process exits 0 within its grace; the log shows the drain
(event=draining, event=shutdown, event=stopped); every request answered before SIGTERM is OK and
every later one ends OK or refused, none with another code (INTERNAL, or CANCELLED for a call
the server had taken: dropped by the drain) or past its client deadline (hung). Refused means
UNAVAILABLE, or CANCELLED for a request sent after SIGTERM that reached gRPC while it was shutting
down, before any handler took it (bare "CANCELLED" from gRPC itself; counted only when the drain
ended within its grace, so gRPC cancelled nothing the server had taken). Those are reported
separately: unlike UNAVAILABLE they are not retry-safe for a client that retries only UNAVAILABLE.
Reports the counts, the requests in flight at SIGTERM and how they ended, and the drain time
(SIGTERM to exit, and the log's draining-to-stopped). CPU dry run: the bundled MLP on the CPU with
a few threads."""
# kit-timeout: 45
import datetime
import os
import re
import shutil
import signal
import subprocess
import threading
import time

import numpy as np

import kitlib

GRACE_S = 10
LOAD_BEFORE_SIGTERM_S = 2.0
# Each request's client deadline: past the grace, so a request the drain kept waiting is told
# apart from one that hung (DEADLINE_EXCEEDED), and inside the step's cap.
CLIENT_TIMEOUT_S = GRACE_S + 6
DRAIN_EVENTS = ("event=draining", "event=shutdown ", "event=stopped")


class Load:
    """`threads` clients, each sending one request at a time until stopped; every request is
    recorded as (sent, done, code) in monotonic seconds."""

    def __init__(self, url, model, input_name, datatype, data, threads):
        self.records, self.stop = [], threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(url, model, input_name, datatype, data),
                                          daemon=True) for _ in range(threads)]

    def start(self):
        for thread in self._threads:
            thread.start()

    def join(self, timeout):
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return sum(thread.is_alive() for thread in self._threads)

    def _run(self, url, model, input_name, datatype, data):
        import tritonclient.grpc as grpcclient
        from tritonclient.utils import InferenceServerException
        client = grpcclient.InferenceServerClient(url=url)
        tensor = grpcclient.InferInput(input_name, list(data.shape), datatype)
        tensor.set_data_from_numpy(data)
        try:
            while not self.stop.is_set():
                sent = time.monotonic()
                try:
                    client.infer(model, [tensor], client_timeout=CLIENT_TIMEOUT_S)
                    code, message = "OK", ""
                except InferenceServerException as error:
                    code, message = str(error.status()).replace("StatusCode.", ""), error.message() or ""
                with self._lock:
                    self.records.append((sent, time.monotonic(), code, message[:200]))
                if code != "OK":
                    time.sleep(0.05)  # refused: the server is going away, no need to spin
        finally:
            client.close()


KINDS = ("ok", "refused", "cancelled_by_shutdown", "lost", "hung")


def classify(record, sigterm_at, drain_within_grace):
    """What became of one request (KINDS). A call that reaches gRPC while its server is shutting
    down, before any handler took it (sent after SIGTERM, or just before it and still in the
    transport), is cancelled by gRPC itself with a bare "CANCELLED" and no message of Sluice's:
    a refusal too when the drain ended within its grace (so gRPC cancelled nothing the server had
    taken; Sluice's own cancellations say what happened). Anything else that is not OK or
    UNAVAILABLE after SIGTERM was lost."""
    _, done, code, message = record
    if code == "OK":
        return "ok"
    if code == "DEADLINE_EXCEEDED":
        return "hung"
    if done < sigterm_at:
        return "lost"  # failed under plain load
    if code == "UNAVAILABLE":
        return "refused"
    if code == "CANCELLED" and message.strip() in ("", "CANCELLED") and drain_within_grace:
        return "cancelled_by_shutdown"
    return "lost"


def log_time(line):
    """The timestamp of a server log line (spdlog pattern %Y-%m-%dT%H:%M:%S.%e), as seconds."""
    match = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})", line)
    return datetime.datetime.strptime(match.group(1), "%Y-%m-%dT%H:%M:%S.%f").timestamp() if match else None


def body():
    root = os.path.join(kitlib.WORK, "sigterm_under_load")
    shutil.rmtree(root, ignore_errors=True)
    if kitlib.NO_GPU:
        model, input_name, datatype, threads = "mlp", "INPUT__0", "FP32", 4
        data = np.random.default_rng(3).standard_normal((1, 784)).astype(np.float32)
        kitlib.write_bundled(root, [model], "dynamic_batching { }")
    else:
        arch, side, sizes, _ = kitlib.resnet_geometry()
        model, input_name, datatype, threads = f"{arch}_fp16", "INPUT__0", "FP16", 32
        data = np.random.default_rng(3).standard_normal((1, 3, side, side)).astype(np.float16)
        kitlib.write_resnet(root, model, "fp16", sizes, "off")
    server = kitlib.start_server(root, ["--device", kitlib.device(), "--shutdown-grace-seconds", str(GRACE_S),
                                        "--shutdown-delay-seconds", "0"], timeout=30)
    load = Load(server.url, model, input_name, datatype, data, threads)
    numbers = {"model": model, "threads": threads, "grace_s": GRACE_S, "client_timeout_s": CLIENT_TIMEOUT_S}
    failures = []
    try:
        load.start()
        time.sleep(LOAD_BEFORE_SIGTERM_S)
        numbers["answered_before_sigterm"] = len(load.records)
        kitlib.write_result("fail", "cut short before SIGTERM", numbers)
        sigterm_at = time.monotonic()
        sigterm_wall = time.time()
        server.process.send_signal(signal.SIGTERM)
        try:
            server.process.wait(timeout=GRACE_S + 8)
        except subprocess.TimeoutExpired:  # a finding; server.stop below kills it
            failures.append(f"the server was still running {GRACE_S + 8} s after SIGTERM (grace {GRACE_S} s)")
        exited_at = time.monotonic()
        numbers["sigterm_to_exit_s"] = round(exited_at - sigterm_at, 3)
        numbers["exit_code"] = server.process.returncode
        kitlib.write_result("fail", "cut short after the exit, while the clients finished", numbers)
        # A little load after the exit: those requests must be refused (UNAVAILABLE), not hang.
        time.sleep(0.3)
        load.stop.set()
        still_running = load.join(CLIENT_TIMEOUT_S + 2)
        if still_running:
            failures.append(f"{still_running} client thread(s) still waiting on a request after the exit")
    finally:
        load.stop.set()
        code = server.stop(timeout=5)
    numbers["exit_code"] = code

    records = sorted(load.records)
    with open(kitlib.step_path("requests.csv"), "w") as f:
        f.write("sent_s,done_s,code,message\n")
        for sent, done, outcome, message in records:
            f.write(f"{sent - sigterm_at:.4f},{done - sigterm_at:.4f},{outcome},\"{message.replace(chr(34), chr(39))}\"\n")
    codes = {}
    for _, _, outcome, _ in records:
        codes[outcome] = codes.get(outcome, 0) + 1
    log = open(server.log_path).read()
    lines = {event: next((line for line in log.splitlines() if event in line), None) for event in DRAIN_EVENTS}
    draining, stopped = (log_time(lines[e]) if lines[e] else None for e in ("event=draining", "event=stopped"))
    drain_s = stopped - draining if draining and stopped else None
    # gRPC's grace never ran out: it cancelled none of the calls the server had taken.
    drain_within_grace = drain_s is not None and drain_s < GRACE_S - 1
    kinds = {}
    for record in records:
        kinds.setdefault(classify(record, sigterm_at, drain_within_grace), []).append(record)
    before = [r for r in records if r[1] < sigterm_at]
    in_flight = [r for r in records if r[0] < sigterm_at <= r[1]]
    after = [r for r in records if r[0] >= sigterm_at]
    ok_after_sigterm = [r for r in records if r[1] >= sigterm_at and r[2] == "OK"]
    count = {kind: len(kinds.get(kind, [])) for kind in KINDS}
    numbers.update({
        "sent": len(records), "codes": codes, "outcomes": count,
        "answered_before_sigterm": len(before),
        "in_flight_at_sigterm": len(in_flight),
        "in_flight_ok": sum(1 for r in in_flight if r[2] == "OK"),
        "in_flight_not_ok": {c: sum(1 for r in in_flight if r[2] == c) for c in {r[2] for r in in_flight} - {"OK"}},
        "sent_after_sigterm": len(after),
        "sent_after_sigterm_ok": sum(1 for r in after if r[2] == "OK"),
        "refused_while_draining": sum(1 for r in kinds.get("refused", []) if r[1] < exited_at),
        "refused_after_exit": sum(1 for r in kinds.get("refused", []) if r[1] >= exited_at),
        "last_ok_after_sigterm_s": round(max((r[1] for r in ok_after_sigterm), default=sigterm_at) - sigterm_at, 3),
        "messages": {kind: sorted({f"{r[2]}: {r[3]}" for r in kinds[kind]})[:3] for kind in kinds if kind != "ok"},
        "drain_log": lines,
        "log_draining_to_stopped_s": None if drain_s is None else round(drain_s, 3),
        "log_sigterm_to_draining_s": round(draining - sigterm_wall, 3) if draining else None,
    })
    kitlib.write_result("fail", "cut short while judging", numbers)

    if code != 0:
        failures.append(f"the server exited {code}, expected 0")
    elif numbers["sigterm_to_exit_s"] > GRACE_S + 2:
        failures.append(f"exit {numbers['sigterm_to_exit_s']} s after SIGTERM, past the {GRACE_S} s grace")
    for kind in ("lost", "hung"):
        if count[kind]:
            failures.append(f"{count[kind]} request(s) {kind}: {numbers['messages'][kind][:2]}")
    if not before:
        failures.append("no request was answered before SIGTERM: the server was not under load")
    missing = [event.strip() for event, line in lines.items() if line is None]
    if missing:
        failures.append(f"no {', '.join(missing)} line in the log")
    rows = [["sent", len(records)], ["answered OK", count["ok"]],
            ["refused UNAVAILABLE (while draining / after the exit)",
             f"{count['refused']} ({numbers['refused_while_draining']} / {numbers['refused_after_exit']})"],
            ["CANCELLED by gRPC's shutdown (sent after SIGTERM, never taken)", count["cancelled_by_shutdown"]],
            ["lost (another error, or failed before SIGTERM)", count["lost"]],
            ["hung (past the client deadline)", count["hung"]],
            ["answered before SIGTERM", len(before)],
            ["in flight at SIGTERM (OK)", f"{numbers['in_flight_at_sigterm']} ({numbers['in_flight_ok']})"],
            ["sent after SIGTERM (OK)", f"{len(after)} ({numbers['sent_after_sigterm_ok']})"],
            ["last OK answer after SIGTERM", f"{numbers['last_ok_after_sigterm_s']} s"],
            ["SIGTERM to exit", f"{numbers['sigterm_to_exit_s']} s (grace {GRACE_S} s)"],
            ["log: draining to stopped", f"{numbers['log_draining_to_stopped_s']} s"],
            ["exit code", code]]
    details = (kitlib.table(["what", "value"], rows) + "\n\nDrain log lines:\n\n```\n"
               + "\n".join(line for line in lines.values() if line) + "\n```")
    if failures:
        return kitlib.gpu_outcome(False, "; ".join(failures)[:400], numbers, details)
    cancelled = count["cancelled_by_shutdown"]
    return kitlib.gpu_outcome(
        True, f"{model}, {threads} threads: SIGTERM with {numbers['in_flight_at_sigterm']} requests in flight "
              f"({numbers['in_flight_ok']} answered OK); exit 0 after {numbers['sigterm_to_exit_s']} s "
              f"(grace {GRACE_S} s, log drain {numbers['log_draining_to_stopped_s']} s); {len(records)} sent, "
              f"{count['ok']} OK, {count['refused']} UNAVAILABLE"
              + (f", {cancelled} CANCELLED by gRPC's shutdown (sent after SIGTERM; not retry-safe as "
                 "UNAVAILABLE is)" if cancelled else "")
              + "; none lost or hung", numbers, details)


if __name__ == "__main__":
    kitlib.run_step(body)
