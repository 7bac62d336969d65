// Names the calling thread, as `top -H`, `ps -L`, gdb and `perf report --sort comm` show it, and
// sets the Linux scheduling class of the threads that serve requests against those that run models.
#pragma once

#include <string>
#include <vector>

namespace sluice {

// Linux keeps 15 characters of a thread name: longer names are cut. Best effort: a failure
// leaves the name as it was.
void NameThisThread(const std::string& name);

// Linux's SCHED_BATCH for the calling thread and every thread it (or a thread it starts) starts
// afterwards (a thread inherits its creator's policy). main() calls it before any thread exists,
// so that gRPC's and the HTTP front end's threads (and some batchers: RunThisThreadAsFrontEnd)
// run as SCHED_BATCH: same share of the CPU as SCHED_OTHER, but a SCHED_BATCH thread that wakes
// does not preempt the thread running on its CPU. On a busy CPU a request's arrival then waits
// for the model's worker to finish or block instead of cutting its forward pass (and its cache)
// in two; the arrivals of that time are read together (docs/design/request-path-costs.md: 3.5 ->
// 0.9 context switches per request at concurrency 32, one core). Threads that find idle CPUs are
// not affected. False when the kernel refused (the reason logged by the caller from errno).
bool RunThreadsFromHereAsBatch();

// SCHED_OTHER for the calling thread: model workers, sequence batchers and the dynamic batchers
// that keep timers call it when they start, so that they keep preempting the front ends. A no-op
// where the policy already is SCHED_OTHER.
void RunThisThreadAsModelWork();

// SCHED_BATCH for the calling thread when this process's front ends run SCHED_BATCH (after a
// successful RunThreadsFromHereAsBatch; otherwise a no-op), whichever thread started it: what a
// dynamic batcher that forms batches at once calls when it starts (DynamicBatcher::
// RunsLikeTheFrontEnds says which do, and docs/design/request-path-costs.md, "Scheduling
// classes", why).
void RunThisThreadAsFrontEnd();

// Whether RunThreadsFromHereAsBatch has succeeded in this process.
bool FrontEndsRunAsBatch();

// --model-cpus: the calling thread, and every thread it starts afterwards, may run only on
// `cpus`. main() calls it with the front ends' CPUs before any thread exists, and records the
// models' CPUs with SetModelWorkerCpus; each model instance's worker then moves itself onto those
// (RunThisThreadOnModelCpus), and LibTorch's intra-op threads, which a worker's first parallel
// forward pass starts, inherit them. So a request's arrival never waits for the CPU a forward
// pass holds. False when the kernel refused (errno says why).
bool KeepThreadsFromHereOn(const std::vector<int>& cpus);
// Set once, in main() before any thread starts (read without a lock afterwards); empty: no split.
void SetModelWorkerCpus(std::vector<int> cpus);
// A model worker's first call: onto the models' CPUs when a split was set (otherwise a no-op,
// true). False when the kernel refused (errno says why): the thread stays where it was.
bool RunThisThreadOnModelCpus();

}  // namespace sluice
