// How many CPUs this process may use: the machine's cores, narrowed by its CPU affinity mask
// (taskset, a container's cpuset) and by a cgroup CPU quota (Docker --cpus, a Kubernetes CPU
// limit), whichever is smallest. The CPU thread split divides this number, not the machine's
// cores: more OpenMP threads than CPUs make every parallel region pay for the oversubscription.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace sluice {

struct CpuBudget {
  int cpus = 1;        // what the split divides: at least 1
  std::string limit;   // which limit applied, for the log: "cores", "affinity" or "cgroup quota"
  std::string detail;  // the numbers behind it, e.g. "16 cores, affinity 2, quota 1.5 (cpu.max
                       // 150000 100000)"
};

// cgroup v2's cpu.max ("max 100000", "150000 100000"): the quota in CPUs, nullopt when unlimited or
// unreadable.
std::optional<double> ParseCpuMax(const std::string& text);
// cgroup v1's cpu.cfs_quota_us and cpu.cfs_period_us: the quota in CPUs, nullopt when unlimited
// (quota -1) or unreadable.
std::optional<double> ParseCfsQuota(const std::string& quota_us, const std::string& period_us);

// `cores`: the machine's (hardware_concurrency); `affinity`: CPUs in the affinity mask (0:
// unknown); `quota`: the cgroup quota in CPUs. A quota rounds up (1.5 CPUs of quota keep 2
// threads busy half the time, which beats one thread idle half the time).
CpuBudget DecideCpuBudget(int cores, int affinity, std::optional<double> quota);

// Reads this process's affinity mask and the CPU quota of its cgroup (v2: cpu.max of its cgroup
// and every ancestor under `cgroup_root`; v1: the cpu controller's cfs files), then decides.
// `proc_self_cgroup` and `cgroup_root` are parameters for tests.
// `affinity_cpus` (> 0): count that many CPUs instead of the calling thread's mask (--model-cpus:
// main() has moved this thread onto the front ends' CPUs; the models get the listed ones).
CpuBudget DetectCpuBudget(const std::string& proc_self_cgroup = "/proc/self/cgroup",
                          const std::string& cgroup_root = "/sys/fs/cgroup", int affinity_cpus = 0);

// The CPUs in the calling thread's affinity mask, sorted; nullopt when it cannot be read (errno
// says why).
std::optional<std::vector<int>> AllowedCpus();

// A CPU list as taskset and cpusets write it ("0", "0-3,8", "2,4-5"): the CPUs, sorted, each once.
// An error names what is wrong (empty, not a number, a range backwards, a CPU over CPU_SETSIZE -
// 1).
absl::StatusOr<std::vector<int>> ParseCpuList(const std::string& text);

// --model-cpus as given: a CPU list, or a count of the CPUs this process may use taken from
// either end of its affinity mask ("first:1", "last:6"), for a container whose CPU numbers are not
// known in advance (Docker's --cpuset-cpus, a Kubernetes pod with dedicated CPUs).
struct CpuChoice {
  std::vector<int> list;  // a CPU list (ParseCpuList), or empty
  int first = 0;          // "first:N": the N lowest-numbered CPUs this process may use
  int last = 0;           // "last:N": the N highest-numbered ones
  bool empty() const { return list.empty() && first == 0 && last == 0; }
};
// A CPU list, "first:N" or "last:N" (N >= 1). An error names what is wrong.
absl::StatusOr<CpuChoice> ParseCpuChoice(const std::string& text);
// The CPUs `choice` names among `allowed` (sorted): a list as it is (SplitCpus judges it), a count
// taken from `allowed`, refused when `allowed` has no more than N CPUs (nothing would be left for
// the front ends).
absl::StatusOr<std::vector<int>> ChooseCpus(const CpuChoice& choice,
                                            const std::vector<int>& allowed);

// --model-cpus on CPUs that are not the process's own: non-empty (the reason, for the log) when
// its mask holds more CPUs than its cgroup quota lets it use, a shared pool (a Kubernetes pod
// without dedicated CPUs), where other processes, and other replicas given the same --model-cpus,
// run on the models' CPUs too.
std::string SharedCpusWarning(const CpuBudget& budget, size_t allowed_cpus);

// --model-cpus: the models' workers on `model` (a CPU list), every other thread of the server on
// the rest of `allowed` (the process's affinity mask). Both must be non-empty: CPUs of `model`
// outside `allowed` are an error (the process could never run there), and so is a `model` that
// leaves nothing for the front ends.
struct CpuSplit {
  std::vector<int> model;
  std::vector<int> front_ends;
};
absl::StatusOr<CpuSplit> SplitCpus(const std::vector<int>& model, const std::vector<int>& allowed);

}  // namespace sluice
