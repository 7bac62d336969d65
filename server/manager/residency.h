// Which models stay in memory when more are asked for than fit (--model-load-on-demand with a
// memory budget): the budget per device, the choice of models to evict (least recently used
// first, among those that may go), and the back-off after a failed load. Pure policy: no threads,
// no clock of its own, no model table; ModelControl feeds it what ModelManager reports and acts
// on its answers on the control thread.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "server/core/clock.h"
#include "server/core/status.h"

namespace sluice {

// Bytes per device, keyed "cpu" (the host) or "cuda:N".
using DeviceBytes = std::map<std::string, uint64_t>;
std::string DescribeBytes(uint64_t bytes);  // "12.5 MiB"
std::string DescribeDeviceBytes(
    const DeviceBytes& bytes);  // "cpu 12.5 MiB, cuda:0 1.20 GiB" ("none")

// One --model-load-gpu-limit value, Triton's "<gpu>:<fraction>" (fraction in (0, 1]): the device
// key ("cuda:N") and the fraction. INVALID_ARGUMENT naming what is wrong.
StatusOr<std::pair<std::string, double>> ParseGpuLimit(std::string_view text);

// A model that serves now, as eviction sees it.
struct ResidentModel {
  std::string name;
  DeviceBytes memory;       // measured at load, per device
  TimePoint last_used{};    // the last request that found it (the load's end when none)
  TimePoint ready_since{};  // when its current versions became ready
  bool busy = false;        // requests in flight or queued, or active sequences
  bool pinned = false;      // --load-model, or sluice.pinned in its config
  // Why this model may not go although idle and unpinned, when it is in a group with another
  // model ("loads with 'e'": a step model of the ensemble loading now; "runs in pinned ensemble
  // 'e'"): never chosen. Empty otherwise.
  std::string kept;
};

// The memory models may use, per device, and what may be evicted for a load.
struct EvictionPolicy {
  DeviceBytes budget;                                 // devices without an entry are not limited
  Duration min_residency = std::chrono::seconds(10);  // a model younger than this goes only
                                                      // when no older idle model frees enough
};

// The models to unload so that a load needing `needed` fits every budgeted device with the
// `resident` models left (`loading`, when resident, is never chosen): idle, unpinned models that
// have been ready for the minimum residency first, least recently used first, then younger idle
// ones, the youngest last; only models holding memory on a device still over its budget. The
// minimum residency orders eviction, it never keeps a load out. An empty list when it fits
// already. RESOURCE_EXHAUSTED when it cannot fit: larger than the budget alone, or the idle
// models do not free enough; the message names the device, the bytes, and why each resident model
// stays (pinned, busy).
StatusOr<std::vector<std::string>> PlanEviction(const std::vector<ResidentModel>& resident,
                                                const DeviceBytes& needed,
                                                const EvictionPolicy& policy, TimePoint now,
                                                std::string_view loading = {});

// Adds `more` to `total`, device by device.
void AddDeviceBytes(DeviceBytes* total, const DeviceBytes& more);
// Sum of every resident model's memory on each device.
DeviceBytes ResidentBytes(const std::vector<ResidentModel>& resident);

// After a failed load a model is not loaded on demand again for a while: `first` after the first
// failure, doubling with each failure after it, at most `longest`; a load that works forgets the
// failures. Not thread-safe (the control thread's).
class LoadBackoff {
 public:
  LoadBackoff(Duration first, Duration longest) : first_(first), longest_(longest) {}
  // OK when `name` may load at `now`; else UNAVAILABLE with the last failure's reason and when
  // the next try may come.
  Status Check(const std::string& name, TimePoint now) const;
  void RecordFailure(const std::string& name, const Status& why, TimePoint now);
  void RecordSuccess(const std::string& name) { failures_.erase(name); }
  // The failures on record, for the index: name -> the reason and the next allowed try.
  struct Failure {
    int count = 0;
    std::string reason;
    TimePoint failed_at{};
    TimePoint retry_at{};
  };
  const std::map<std::string, Failure>& failures() const { return failures_; }

 private:
  const Duration first_;
  const Duration longest_;
  std::map<std::string, Failure> failures_;
};

}  // namespace sluice
