#include "server/batching/caller_runs.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"

namespace sluice {
namespace {

int64_t Micros(Duration duration) {
  return std::chrono::duration_cast<std::chrono::microseconds>(duration).count();
}

}  // namespace

CallerRunsChoice ChooseCallerRuns(const ModelSpec& spec, const std::vector<WarmupPass>& passes) {
  CallerRunsChoice choice;
  const DynamicBatchingSpec& batching = spec.dynamic_batching;
  if (!batching.run_on_receiving_thread) {
    choice.reason = "sluice.run_on_receiving_thread is false";
    return choice;
  }
  choice.asked = true;
  if (spec.sequence_batching.enabled) {
    choice.reason = "a sequence model's requests run on their sequence's slot";
    return choice;
  }
  bool any = false;
  for (const WarmupPass& pass : passes) {
    if (pass.batch_size > 1) continue;
    any = true;
    choice.measured = std::max(
        choice.measured, pass.median_timed > Duration::zero() ? pass.median_timed : pass.last_run);
  }
  if (!any) {
    choice.reason = "warm-up measured no lone request (sluice.warmup false, or shapes not finite)";
    return choice;
  }
  const int64_t measured_us = Micros(choice.measured);
  choice.on = measured_us <= batching.run_on_receiving_thread_max_us;
  choice.reason = absl::StrCat("a lone request took ", measured_us, " us in warm-up; the bound is ",
                               batching.run_on_receiving_thread_max_us,
                               " us (sluice.run_on_receiving_thread_max_us)");
  return choice;
}

}  // namespace sluice
