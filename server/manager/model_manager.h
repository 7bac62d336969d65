// Owns the loaded models: for each repository model and selected version, its instances (built
// by an injected BackendFactory), its scheduler and its state.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "server/batching/batch_queue.h"
#include "server/batching/model_stats.h"
#include "server/batching/scheduler.h"
#include "server/batching/shape_plan.h"
#include "server/core/clock.h"
#include "server/core/liveness.h"
#include "server/core/backend.h"
#include "server/core/device.h"
#include "server/repository/model_repository.h"

namespace sluice {

enum class ModelState { kLoading, kReady, kUnavailable };
const char* ModelStateName(ModelState state);  // "LOADING", "READY", "UNAVAILABLE"

// A ready model version, as handed to a request. Shared ownership keeps it (and its scheduler)
// alive for as long as a request holds it.
struct ServableModel {
  const RepositoryModel* model = nullptr;  // owned by the manager, lives as long as it
  int64_t version = 0;
  std::string device;  // "cpu", "cuda:0", or a list for several instances
  std::shared_ptr<Scheduler> scheduler;
  std::shared_ptr<ModelStats> stats;  // for requests the api rejects before they reach the scheduler
};

// Statistics of one loaded version, for ModelStatistics.
struct VersionStatistics {
  std::string name;
  int64_t version = 0;
  ModelStatsSnapshot stats;
};

// What the server did to make one version fast from its first request: the cuDNN benchmark
// decision and the warm-up.
struct ModelTuning {
  std::string name;
  int64_t version = 0;
  bool cudnn_benchmark = false;
  std::string cudnn_reason;        // why (DecideCudnnBenchmark)
  ConvolutionTuning convolutions;  // of the first instance (every instance loads the same graph)
  bool shapes_finite = false;
  size_t shape_count = 0;          // shapes in the plan (0 when not finite)
  std::vector<WarmupPass> warmup;  // every (instance, shape) pair warmed, and the samples
  Duration warmup_time{0};         // wall time of the warm-up
};

// What the manager reports about model versions, for the Prometheus metrics (server/metrics);
// the manager knows nothing about how it is exported. Implementations are thread-safe.
class ModelObserver {
 public:
  virtual ~ModelObserver() = default;
  // Where the request statistics of a version about to load also go (null: nowhere).
  virtual std::shared_ptr<StatsSink> SinkFor(const std::string& model, int64_t version) = 0;
  virtual void OnState(const std::string& model, int64_t version, ModelState state) = 0;
  // A version became ready: its tuning, and how long it took to load (warm-up included).
  virtual void OnReady(const ModelTuning& tuning, Duration load_time) = 0;
};

// One row of RepositoryIndex.
struct ModelIndexEntry {
  std::string name;
  std::string version;  // empty when the model has no loadable version at all
  ModelState state = ModelState::kUnavailable;
  std::string reason;
};

// Thread-safe. Lookups may run while LoadAll is still loading.
class ModelManager {
 public:
  struct Options {
    DevicePolicy device_policy = DevicePolicy::kAuto;  // --device
    size_t max_queue_size = 1024;  // per model version, unless its config sets max_queue_size
    const TimeSource* clock = nullptr;  // null: the steady clock
    std::shared_ptr<ByteBudget> queued_bytes_budget;  // server-wide cap (--max-queued-bytes); may be null
    LivenessMonitor* liveness = nullptr;  // told about fatal device errors; may be null
    CudnnBenchmarkMode cudnn_benchmark = CudnnBenchmarkMode::kAuto;  // --cudnn-benchmark
    bool warmup = true;  // --warmup: false skips every model's warm-up (cold-start measurements)
    ModelObserver* observer = nullptr;  // told about states, tuning and request events; may be null
  };

  ModelManager(std::vector<RepositoryModel> models, BackendFactory* factory, Options options);
  ~ModelManager();

  // Loads every selected version of every model. A model that fails to load is logged with its
  // reason and marked UNAVAILABLE; the others still load. Returns FAILED_PRECONDITION only for a
  // start-up error that concerns every model (--device cuda without a usable GPU).
  Status LoadAll();

  // The model version a request goes to. `version` empty: the newest ready one.
  // NOT_FOUND: no such model or version (or not a number); UNAVAILABLE: it exists but is not ready
  // (the reason is in the message).
  StatusOr<ServableModel> Find(const std::string& name, const std::string& version) const;

  // The repository entry of `name` (any state): NOT_FOUND when unknown.
  StatusOr<const RepositoryModel*> FindModel(const std::string& name) const;

  // Ready version numbers of a model, ascending.
  std::vector<int64_t> ReadyVersions(const std::string& name) const;

  std::vector<ModelIndexEntry> Index() const;

  // Statistics of ready versions: all models when `name` is empty, else that model (NOT_FOUND
  // when unknown), narrowed to `version` when given.
  StatusOr<std::vector<VersionStatistics>> Statistics(const std::string& name,
                                                      const std::string& version) const;

  // The tuning of every ready version, in repository order.
  std::vector<ModelTuning> Tunings() const;

  // True once LoadAll finished and every model in the repository has every selected version ready.
  bool AllReady() const;

  // Stops every scheduler (queued requests are answered UNAVAILABLE). Idempotent. May run while
  // LoadAll is loading (a shutdown signal during start-up): warm-ups are abandoned, and the
  // versions not loaded yet stay UNAVAILABLE.
  void Stop();

 private:
  struct VersionSlot {
    int64_t version = 0;
    ModelState state = ModelState::kLoading;
    std::string reason;
    std::string device;
    std::shared_ptr<Scheduler> scheduler;
    std::shared_ptr<ModelStats> stats;
    ModelTuning tuning;
  };
  struct Entry {
    RepositoryModel model;
    std::vector<VersionSlot> versions;  // ascending
  };

  StatusOr<std::shared_ptr<Scheduler>> LoadVersion(const RepositoryModel& model,
                                                   const std::filesystem::path& file,
                                                   std::shared_ptr<ModelStats> stats,
                                                   std::string* device_description,
                                                   ModelTuning* tuning);
  StatusOr<std::unique_ptr<Scheduler>> MakeScheduler(const ModelSpec& spec,
                                                     std::vector<std::unique_ptr<ModelBackend>> instances,
                                                     std::shared_ptr<ModelStats> stats,
                                                     std::function<void(const Status&)> on_fatal) const;
  static void LogTuning(const ModelTuning& tuning);
  const Entry* FindEntry(const std::string& name) const;
  // CPU instances over every loadable model version (for the default thread split).
  int CountCpuInstances() const;

  BackendFactory* const factory_;
  const Options options_;
  SteadyTimeSource steady_;
  const TimeSource* const clock_;
  mutable std::mutex mutex_;
  std::vector<Entry> entries_;  // the vector itself never changes after construction
  bool loaded_ = false;         // guarded by mutex_
  std::atomic<bool> stopping_{false};  // Stop was called: LoadAll loads nothing more
  int default_intra_op_threads_ = 1;  // set by LoadAll before anything loads
};

}  // namespace sluice
