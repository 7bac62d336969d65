#include "server/os/cpu_budget.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace sluice {
namespace {

std::optional<std::string> ReadFile(const std::filesystem::path& path) {
  std::ifstream file(path);
  if (!file) return std::nullopt;
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

std::optional<double> Quotient(const std::string& quota, const std::string& period) {
  double q = 0, p = 0;
  if (!absl::SimpleAtod(absl::StripAsciiWhitespace(quota), &q) ||
      !absl::SimpleAtod(absl::StripAsciiWhitespace(period), &p) || q <= 0 || p <= 0) {
    return std::nullopt;
  }
  return q / p;
}

// The process's cgroup paths from /proc/self/cgroup: the v2 path ("0::/a/b") and the v1 cpu
// controller's ("N:cpu,cpuacct:/a/b"), empty when absent.
void CgroupPaths(const std::string& text, std::string* v2, std::string* v1_cpu) {
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    std::vector<std::string> parts = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (parts.size() != 3) continue;
    if (parts[0] == "0" && parts[1].empty()) *v2 = parts[2];
    for (absl::string_view controller : absl::StrSplit(parts[1], ',')) {
      if (controller == "cpu") *v1_cpu = parts[2];
    }
  }
}

// The smallest quota on `base`/`relative` and its ancestors up to `base`, read by `quota_at`.
template <typename QuotaAt>
std::optional<double> SmallestOnPath(const std::filesystem::path& base, const std::string& relative,
                                     QuotaAt quota_at, std::string* where) {
  std::optional<double> smallest;
  std::filesystem::path path = base;
  auto consider = [&] {
    std::optional<double> quota = quota_at(path);
    if (quota && (!smallest || *quota < *smallest)) {
      smallest = quota;
      *where = path.string();
    }
  };
  consider();
  for (const std::filesystem::path& part : std::filesystem::path(relative).relative_path()) {
    path /= part;
    consider();
  }
  return smallest;
}

}  // namespace

std::optional<double> ParseCpuMax(const std::string& text) {
  std::vector<std::string> fields =
      absl::StrSplit(absl::StripAsciiWhitespace(text), ' ', absl::SkipEmpty());
  if (fields.size() != 2 || fields[0] == "max") return std::nullopt;
  return Quotient(fields[0], fields[1]);
}

std::optional<double> ParseCfsQuota(const std::string& quota_us, const std::string& period_us) {
  return Quotient(quota_us, period_us);  // -1 (unlimited) is not positive: nullopt
}

CpuBudget DecideCpuBudget(int cores, int affinity, std::optional<double> quota) {
  CpuBudget budget;
  cores = std::max(1, cores);
  budget.cpus = cores;
  budget.limit = "cores";
  budget.detail = absl::StrCat(cores, " cores");
  if (affinity > 0) {
    absl::StrAppend(&budget.detail, ", affinity ", affinity);
    if (affinity < budget.cpus) {
      budget.cpus = affinity;
      budget.limit = "affinity";
    }
  }
  if (quota) {
    const int quota_cpus = std::max(1, static_cast<int>(std::ceil(*quota - 1e-9)));
    absl::StrAppend(&budget.detail, ", cgroup quota ", std::round(*quota * 100) / 100);
    if (quota_cpus < budget.cpus) {
      budget.cpus = quota_cpus;
      budget.limit = "cgroup quota";
    }
  }
  return budget;
}

std::optional<std::vector<int>> AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return std::nullopt;
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

CpuBudget DetectCpuBudget(const std::string& proc_self_cgroup, const std::string& cgroup_root,
                          int affinity_cpus) {
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  int affinity = affinity_cpus;
  if (affinity <= 0) {
    if (std::optional<std::vector<int>> allowed = AllowedCpus())
      affinity = static_cast<int>(allowed->size());
  }

  std::string v2, v1_cpu;
  if (std::optional<std::string> text = ReadFile(proc_self_cgroup))
    CgroupPaths(*text, &v2, &v1_cpu);
  const std::filesystem::path root(cgroup_root);
  std::optional<double> quota;
  std::string where;
  if (!v1_cpu.empty()) {
    // v1: the cpu controller is mounted at <root>/cpu (or cpu,cpuacct).
    for (const char* mount : {"cpu", "cpu,cpuacct"}) {
      const std::filesystem::path base = root / mount;
      if (!std::filesystem::exists(base)) continue;
      quota = SmallestOnPath(
          base, v1_cpu,
          [](const std::filesystem::path& path) -> std::optional<double> {
            std::optional<std::string> q = ReadFile(path / "cpu.cfs_quota_us");
            std::optional<std::string> p = ReadFile(path / "cpu.cfs_period_us");
            return q && p ? ParseCfsQuota(*q, *p) : std::nullopt;
          },
          &where);
      break;
    }
  } else {
    // v2 (a container with its own cgroup namespace sees its cgroup as "/").
    quota = SmallestOnPath(
        root, v2.empty() ? "/" : v2,
        [](const std::filesystem::path& path) -> std::optional<double> {
          std::optional<std::string> text = ReadFile(path / "cpu.max");
          return text ? ParseCpuMax(*text) : std::nullopt;
        },
        &where);
  }
  CpuBudget budget = DecideCpuBudget(cores, affinity, quota);
  if (quota) absl::StrAppend(&budget.detail, " (", where, ")");
  return budget;
}

absl::StatusOr<std::vector<int>> ParseCpuList(const std::string& text) {
  constexpr int kMaxCpu = CPU_SETSIZE - 1;  // what a cpu_set_t holds
  std::vector<int> cpus;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    part = absl::StripAsciiWhitespace(part);
    std::vector<absl::string_view> ends = absl::StrSplit(part, absl::MaxSplits('-', 1));
    int first = 0, last = 0;
    if (!absl::SimpleAtoi(ends[0], &first) || first < 0 ||
        !absl::SimpleAtoi(ends.size() == 2 ? ends[1] : ends[0], &last) || last < 0) {
      return absl::InvalidArgumentError(absl::StrCat("\"", part, "\" in the CPU list \"", text,
                                                     "\" is not a CPU number or a range like 0-3"));
    }
    if (last < first) {
      return absl::InvalidArgumentError(
          absl::StrCat("the range \"", part, "\" in the CPU list \"", text, "\" runs backwards"));
    }
    if (last > kMaxCpu) {
      return absl::InvalidArgumentError(
          absl::StrCat("CPU ", last, " in the CPU list \"", text, "\" is over ", kMaxCpu));
    }
    for (int cpu = first; cpu <= last; ++cpu) cpus.push_back(cpu);
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

absl::StatusOr<CpuChoice> ParseCpuChoice(const std::string& text) {
  CpuChoice choice;
  const absl::string_view stripped = absl::StripAsciiWhitespace(text);
  for (auto [prefix, count] :
       {std::pair<absl::string_view, int*>{"first:", &choice.first}, {"last:", &choice.last}}) {
    if (!absl::StartsWith(stripped, prefix)) continue;
    if (!absl::SimpleAtoi(stripped.substr(prefix.size()), count) || *count < 1 ||
        *count > CPU_SETSIZE) {
      return absl::InvalidArgumentError(absl::StrCat("\"", stripped, "\" is not ", prefix,
                                                     "N with N a number of CPUs from 1 to ",
                                                     CPU_SETSIZE));
    }
    return choice;
  }
  if (absl::StrContains(stripped, ":")) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", stripped, "\" is none of a CPU list (0-3,8), first:N or last:N"));
  }
  absl::StatusOr<std::vector<int>> list = ParseCpuList(text);
  if (!list.ok()) return list.status();
  choice.list = *std::move(list);
  return choice;
}

absl::StatusOr<std::vector<int>> ChooseCpus(const CpuChoice& choice,
                                            const std::vector<int>& allowed) {
  if (choice.first == 0 && choice.last == 0) return choice.list;
  const size_t count = static_cast<size_t>(choice.first > 0 ? choice.first : choice.last);
  if (count >= allowed.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(choice.first > 0 ? "first:" : "last:", count,
                     " would give the models every CPU this process may use (",
                     absl::StrJoin(allowed, ","), "): leave at least one for the front ends"));
  }
  return choice.first > 0 ? std::vector<int>(allowed.begin(), allowed.begin() + count)
                          : std::vector<int>(allowed.end() - count, allowed.end());
}

std::string SharedCpusWarning(const CpuBudget& budget, size_t allowed_cpus) {
  if (budget.limit != "cgroup quota" || static_cast<size_t>(budget.cpus) >= allowed_cpus) return "";
  return absl::StrCat(
      "the process may run on ", allowed_cpus, " CPUs but its cgroup quota lets it use ",
      budget.cpus, " (", budget.detail,
      "): they are a shared pool, not its own, and other processes (other replicas given the same "
      "--model-cpus too) run on the models' CPUs. Give it dedicated CPUs (Kubernetes: a Guaranteed "
      "pod with whole CPUs on a node with the static CPU manager policy)");
}

absl::StatusOr<CpuSplit> SplitCpus(const std::vector<int>& model, const std::vector<int>& allowed) {
  CpuSplit split;
  std::vector<int> outside;
  for (int cpu : model) {
    (std::find(allowed.begin(), allowed.end(), cpu) == allowed.end() ? outside : split.model)
        .push_back(cpu);
  }
  if (!outside.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("CPU(s) ", absl::StrJoin(outside, ","),
                                                   " are not among the CPUs this process may use (",
                                                   absl::StrJoin(allowed, ","), ")"));
  }
  if (split.model.empty()) return absl::InvalidArgumentError("no CPU given for the models");
  for (int cpu : allowed) {
    if (!std::binary_search(split.model.begin(), split.model.end(), cpu))
      split.front_ends.push_back(cpu);
  }
  if (split.front_ends.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the models would take every CPU this process may use (",
                     absl::StrJoin(allowed, ","), "): leave at least one for the front ends"));
  }
  return split;
}

}  // namespace sluice
