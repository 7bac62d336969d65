"""Models on demand within a GPU memory budget (issue 36) on this machine's GPU:
benchmarks/on_demand_benchmark.py with the models' instances on the GPU and the budget given as
--model-load-gpu-limit 0:<fraction> (the device allocator's bytes each load measured, warm-up peak
included). Twelve copies of the bundled MLP as TorchScript (the bundled .pt2 is a CPU package), a
budget for four, Zipf traffic at 30 requests/s for 20 s: hit rate, cold starts and their p50/p99,
loads, evictions, and the sampled resident model memory against the budget (the step fails when it
goes over, or when a request fails). The CPU dry run: the benchmark's smoke mode on the CPU."""
# kit-timeout: 75
import kitlib
import on_demand_benchmark as od


def body():
    if kitlib.NO_GPU:
        report = od.measure(kitlib.BIN, models=4, fit=2, rate=20.0, seconds=2.0)
    else:
        report = od.measure(kitlib.BIN, models=12, fit=4, rate=30.0, seconds=20.0, device=kitlib.device(),
                            formats=("ts",))
    rows = [[label, row["requests"], f"{row['answered_per_s']:.1f}", od.fmt(row["hit_rate"], 3), row["cold_starts"],
             od.fmt(row["cold_start_p50_ms"]), od.fmt(row["cold_start_p99_ms"]), od.fmt(row["load_ms_mean"], 0),
             row["loads"], row["evictions"], row["failures"] or "-"] for label, row in report["rows"].items()]
    details = kitlib.table(["", "requests", "answered/s", "hit rate", "cold", "cold p50 ms", "cold p99 ms", "load ms",
                            "loads", "evicted", "failures"], rows)
    mib = 2 ** 20
    details += (f"\n\nbudget {report['budget_bytes'] / mib:.1f} MiB on {od.budget_device(report['device'])} "
                f"(one-time {report['one_time_bytes'] / mib:.1f} MiB + {report['fit']:g} x "
                f"{report['model_bytes'] / mib:.1f} MiB); peak resident {report['peak_resident_bytes'] / mib:.1f} MiB "
                f"over {report['samples']} samples; pinning: {report['pinning']}.")
    everything = report["rows"]["all"]
    passed = report["within_budget"] and not everything["failures"]
    summary = (f"{report['models']} models, budget for {report['fit']:g}: hit rate {od.fmt(everything['hit_rate'], 3)}, "
               f"cold start p50/p99 {od.fmt(everything['cold_start_p50_ms'])}/{od.fmt(everything['cold_start_p99_ms'])} ms, "
               f"{everything['evictions']} evictions, peak {report['peak_resident_bytes'] / mib:.1f} of "
               f"{report['budget_bytes'] / mib:.1f} MiB")
    return kitlib.gpu_outcome(passed, summary, report, details)


if __name__ == "__main__":
    kitlib.run_step(body)
