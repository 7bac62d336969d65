#include "server/manager/residency.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace sluice {

std::string DescribeBytes(uint64_t bytes) {
  if (bytes < (uint64_t{1} << 20))
    return absl::StrFormat("%.1f KiB", static_cast<double>(bytes) / 1024);
  if (bytes < (uint64_t{1} << 30))
    return absl::StrFormat("%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return absl::StrFormat("%.2f GiB", static_cast<double>(bytes) / (1 << 30));
}

std::string DescribeDeviceBytes(const DeviceBytes& bytes) {
  std::vector<std::string> parts;
  for (const auto& [device, count] : bytes)
    parts.push_back(absl::StrCat(device, " ", DescribeBytes(count)));
  return parts.empty() ? "none" : absl::StrJoin(parts, ", ");
}

StatusOr<std::pair<std::string, double>> ParseGpuLimit(std::string_view text) {
  const size_t colon = text.find(':');
  int gpu = -1;
  double fraction = 0;
  if (colon == std::string_view::npos ||
      !absl::SimpleAtoi(std::string(text.substr(0, colon)), &gpu) || gpu < 0 ||
      !absl::SimpleAtod(std::string(text.substr(colon + 1)), &fraction) ||
      !(fraction > 0 && fraction <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--model-load-gpu-limit ", std::string(text),
                     ": expected <gpu>:<fraction>, a GPU ordinal and a fraction "
                     "of its memory in (0, 1], e.g. 0:0.8"));
  }
  return std::make_pair(absl::StrCat("cuda:", gpu), fraction);
}

void AddDeviceBytes(DeviceBytes* total, const DeviceBytes& more) {
  for (const auto& [device, bytes] : more) (*total)[device] += bytes;
}

DeviceBytes ResidentBytes(const std::vector<ResidentModel>& resident) {
  DeviceBytes used;
  for (const ResidentModel& model : resident) AddDeviceBytes(&used, model.memory);
  return used;
}

namespace {

uint64_t Get(const DeviceBytes& bytes, const std::string& device) {
  auto it = bytes.find(device);
  return it == bytes.end() ? 0 : it->second;
}

// The devices whose budget `used` + `needed` goes over.
std::vector<std::string> Over(const DeviceBytes& used, const DeviceBytes& needed,
                              const DeviceBytes& budget) {
  std::vector<std::string> over;
  for (const auto& [device, limit] : budget) {
    if (Get(used, device) + Get(needed, device) > limit) over.push_back(device);
  }
  return over;
}

}  // namespace

StatusOr<std::vector<std::string>> PlanEviction(const std::vector<ResidentModel>& resident,
                                                const DeviceBytes& needed,
                                                const EvictionPolicy& policy, TimePoint now,
                                                std::string_view loading) {
  for (const auto& [device, limit] : policy.budget) {
    if (Get(needed, device) > limit) {
      return absl::ResourceExhaustedError(
          absl::StrCat("it needs ", DescribeBytes(Get(needed, device)), " on ", device,
                       ", more than the whole budget of ", DescribeBytes(limit)));
    }
  }
  DeviceBytes used = ResidentBytes(resident);
  std::vector<std::string> victims;
  if (Over(used, needed, policy.budget).empty()) return victims;

  // Idle, unpinned models may go: those resident for the minimum residency first, least recently
  // used first; then the younger ones, the youngest last. The minimum residency orders eviction
  // (older models go before one that just loaded); it never keeps a request from being served.
  std::vector<const ResidentModel*> settled;
  std::vector<const ResidentModel*> young;
  std::vector<std::string> kept;  // why the others stay
  for (const ResidentModel& model : resident) {
    if (model.name == loading) continue;
    if (model.pinned) {
      kept.push_back(absl::StrCat(model.name, " (pinned)"));
    } else if (!model.kept.empty()) {
      kept.push_back(absl::StrCat(model.name, " (", model.kept, ")"));
    } else if (model.busy) {
      kept.push_back(absl::StrCat(model.name, " (requests in flight or active sequences)"));
    } else if (now - model.ready_since < policy.min_residency) {
      young.push_back(&model);
    } else {
      settled.push_back(&model);
    }
  }
  std::stable_sort(
      settled.begin(), settled.end(),
      [](const ResidentModel* a, const ResidentModel* b) { return a->last_used < b->last_used; });
  std::stable_sort(young.begin(), young.end(), [](const ResidentModel* a, const ResidentModel* b) {
    return a->ready_since < b->ready_since;
  });
  std::vector<const ResidentModel*> order = settled;
  order.insert(order.end(), young.begin(), young.end());
  for (const ResidentModel* model : order) {
    // Only a model holding memory on a device still over its budget helps.
    const std::vector<std::string> over = Over(used, needed, policy.budget);
    if (over.empty()) break;
    const bool helps = std::any_of(over.begin(), over.end(), [&](const std::string& device) {
      return Get(model->memory, device) > 0;
    });
    if (!helps) continue;
    victims.push_back(model->name);
    for (const auto& [device, bytes] : model->memory) used[device] -= std::min(used[device], bytes);
  }
  const std::vector<std::string> over = Over(used, needed, policy.budget);
  if (over.empty()) return victims;
  const std::string& device = over.front();
  return absl::ResourceExhaustedError(
      absl::StrCat("it needs ", DescribeBytes(Get(needed, device)), " on ", device,
                   " and the budget of ", DescribeBytes(Get(policy.budget, device)), " has ",
                   DescribeBytes(Get(ResidentBytes(resident), device)),
                   " in use by models that cannot be unloaded now: ",
                   kept.empty() ? "none" : absl::StrJoin(kept, ", ")));
}

Status LoadBackoff::Check(const std::string& name, TimePoint now) const {
  auto it = failures_.find(name);
  if (it == failures_.end() || now >= it->second.retry_at) return absl::OkStatus();
  const Failure& failure = it->second;
  return absl::UnavailableError(absl::StrFormat(
      "model '%s' failed to load %.1f s ago (%d time(s) in a row) and is not loaded on demand "
      "again for "
      "another %.1f s: %s",
      name, std::chrono::duration<double>(now - failure.failed_at).count(), failure.count,
      std::chrono::duration<double>(failure.retry_at - now).count(), failure.reason));
}

void LoadBackoff::RecordFailure(const std::string& name, const Status& why, TimePoint now) {
  Failure& failure = failures_[name];
  ++failure.count;
  failure.reason = std::string(why.message());
  failure.failed_at = now;
  Duration wait = first_;
  for (int i = 1; i < failure.count && wait < longest_; ++i) wait *= 2;
  failure.retry_at = now + std::min(wait, longest_);
}

}  // namespace sluice
