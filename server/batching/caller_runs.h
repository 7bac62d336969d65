// Whether a model's requests may run on the thread that received them
// (sluice.run_on_receiving_thread). A request that finds its queue empty and an instance idle is
// run by the gRPC thread that received it instead of being handed to the batcher and a worker:
// two thread wake-ups and hand-offs less (docs/design/request-path-costs.md). That thread reads no
// other call while the model runs, so only a model whose lone request warm-up measured cheap may do
// it.
#pragma once

#include <string>
#include <vector>

#include "server/batching/scheduler.h"
#include "server/core/clock.h"
#include "server/core/model_spec.h"

namespace sluice {

struct CallerRunsChoice {
  bool asked = false;  // the model's config asks for it
  bool on = false;
  std::string reason;    // in words, for the log: why on, or why not
  Duration measured{0};  // the slowest lone request warm-up measured (0: none measured)
};

// On when `spec` asks for it (DynamicBatchingSpec::run_on_receiving_thread), is not a sequence
// model (its requests are bound to sequence slots), and the slowest lone-request pass of `passes`
// (batch size 0 or 1: every shape a single-row request can have; its median timed run, else its
// last warm-up run) took at most run_on_receiving_thread_max_us. Off, with the reason, when warm-up
// measured no lone request (sluice.warmup false, or shapes not finite).
CallerRunsChoice ChooseCallerRuns(const ModelSpec& spec, const std::vector<WarmupPass>& passes);

}  // namespace sluice
