// Owns the loaded models: for each repository model and selected version, its instances (built
// by an injected BackendFactory), its scheduler and its state. Also model control: loading,
// reloading and unloading models while the server serves (--model-control-mode).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "server/batching/batch_queue.h"
#include "server/batching/model_stats.h"
#include "server/batching/scheduler.h"
#include "server/batching/shape_plan.h"
#include "server/core/clock.h"
#include "server/core/liveness.h"
#include "server/core/backend.h"
#include "server/core/device.h"
#include "server/manager/model_handle.h"
#include "server/repository/model_repository.h"

namespace sluice {

enum class ModelState { kLoading, kReady, kUnavailable };
const char* ModelStateName(ModelState state);  // "LOADING", "READY", "UNAVAILABLE"

// --model-control-mode, with Triton's meaning:
//   none:     every model loads at start-up; the repository is never read again and
//             RepositoryModelLoad/Unload are refused.
//   poll:     every model loads at start-up; the repository is rescanned every
//             --repository-poll-secs and new, changed and removed models are loaded, reloaded
//             and unloaded; RepositoryModelLoad/Unload are refused.
//   explicit: only the --load-model models load at start-up ("*": all); RepositoryModelLoad and
//             RepositoryModelUnload load, reload and unload the others.
enum class ModelControlMode { kNone, kPoll, kExplicit };
const char* ModelControlModeName(ModelControlMode mode);  // "none", "poll", "explicit"
StatusOr<ModelControlMode> ParseModelControlMode(std::string_view text);

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

// Thread-safe. Lookups may run while models load. Control calls (LoadAll, LoadModel,
// UnloadModel, PollRepository) run one at a time; lookups never wait for them.
class ModelManager final : public ModelLookup {
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
    ModelControlMode control_mode = ModelControlMode::kNone;  // --model-control-mode
    // In explicit mode, the models LoadAll loads (--load-model; "*" loads all); the others are
    // listed by Index as not loaded until LoadModel loads them. Ignored in the other modes.
    std::vector<std::string> startup_models;
    const ModelSource* source = nullptr;  // where LoadModel and PollRepository read; null: nowhere
  };

  ModelManager(std::vector<RepositoryModel> models, BackendFactory* factory, Options options);
  ~ModelManager() override;

  // Loads every selected version of every model (in explicit mode: of the start-up models). A
  // model that fails to load is logged with its reason and marked UNAVAILABLE; the others still
  // load. Returns FAILED_PRECONDITION only for a start-up error that concerns every model
  // (--device cuda without a usable GPU).
  Status LoadAll();

  // Loads `name` as the source has it now, or reloads it when it is loaded: every selected
  // version is loaded and warmed up beside the versions serving now, and then swapped in at
  // once. Requests already given an old version (queued or running) finish on it; requests that
  // look the model up after the swap go to the new versions. The old versions stop once the last
  // request holding them is answered, before this returns. If anything fails (config, a version's
  // load or warm-up) while an old version serves, nothing changes and the error comes back; a
  // model that served nothing shows each version's failure. NOT_FOUND or INVALID_ARGUMENT for a
  // name the source does not have; FAILED_PRECONDITION without a source.
  Status LoadModel(const std::string& name);

  // Unloads every version of `name`: lookups answer UNAVAILABLE ("unloaded") at once, and this
  // returns when every request already given one of its versions is answered, after stopping the
  // schedulers and releasing the instances. OK when nothing of it is loaded; NOT_FOUND when the
  // manager does not know the model.
  Status UnloadModel(const std::string& name);

  // One pass of poll mode: loads models that appeared in the source, reloads those whose files
  // changed since they were last tried (RepositoryModel::fingerprint; a failed reload is not
  // retried until the files change again, and the old version keeps serving), and unloads and
  // forgets those whose directory is gone. Per-model problems are logged, not returned; an error
  // only when the source cannot be scanned.
  Status PollRepository();

  // The model version a request goes to, as a reference that counts as in flight until it is
  // dropped (ModelHandle::Acquire): an unload or a reload waits for it. `version` empty: the
  // newest ready one. NOT_FOUND: no such model or version (or not a number); UNAVAILABLE: it
  // exists but is not ready (the reason is in the message).
  StatusOr<std::shared_ptr<ModelHandle>> Find(const std::string& name, const std::string& version) const override;

  // The repository entry of `name` (any state): NOT_FOUND when unknown.
  StatusOr<std::shared_ptr<const RepositoryModel>> FindModel(const std::string& name) const;

  // Ready version numbers of a model, ascending.
  std::vector<int64_t> ReadyVersions(const std::string& name) const;

  std::vector<ModelIndexEntry> Index() const;

  // Statistics of ready versions: all models when `name` is empty, else that model (NOT_FOUND
  // when unknown), narrowed to `version` when given.
  StatusOr<std::vector<VersionStatistics>> Statistics(const std::string& name,
                                                      const std::string& version) const;

  // The tuning of every ready version, in repository order.
  std::vector<ModelTuning> Tunings() const;

  ModelControlMode control_mode() const { return options_.control_mode; }

  // Called (on the control caller's thread) after every LoadModel, UnloadModel and
  // PollRepository, when readiness may have changed; the server refreshes its health service.
  // Null: nothing. Not called with any manager lock held.
  void SetChangeListener(std::function<void()> listener);

  // True once LoadAll finished and every model the server is asked to serve (all of them, in
  // explicit mode those loaded and not unloaded since) has every selected version ready.
  bool AllReady() const;

  // Stops every scheduler, the ones being drained after a reload or unload included (queued
  // requests are answered UNAVAILABLE). Idempotent. May run while a load is in progress (a
  // shutdown signal during start-up): warm-ups are abandoned, the versions not loaded yet stay
  // UNAVAILABLE, and control calls after it load nothing.
  void Stop();

 private:
  struct VersionSlot {
    int64_t version = 0;
    ModelState state = ModelState::kLoading;
    std::string reason;
    std::shared_ptr<ModelHandle> handle;  // ready versions only
    ModelTuning tuning;
  };
  struct Entry {
    std::shared_ptr<const RepositoryModel> model;  // never null
    std::vector<VersionSlot> versions;  // ascending; empty when never loaded or broken
    bool wanted = true;   // the server is asked to serve it (false: never loaded, or unloaded)
    std::string reason;   // why it serves nothing, when `versions` is empty
    std::string tried_fingerprint;  // the files the last load attempt read (poll mode)
  };
  // One version loaded (or not) by Install, before it is swapped in.
  struct LoadedVersion {
    int64_t version = 0;
    Status status;
    std::shared_ptr<ModelHandle> handle;  // when loaded
    ModelTuning tuning;
    Duration load_time{0};
  };

  // A LOADING slot per selected version of `model` (none when it is broken).
  static std::vector<VersionSlot> LoadingSlots(const RepositoryModel& model);
  // Loads every version of `model` and swaps them in (see LoadModel). control_mutex_ held.
  Status Install(std::shared_ptr<const RepositoryModel> model);
  LoadedVersion LoadOneVersion(const std::shared_ptr<const RepositoryModel>& model, int64_t version);
  void NotifyChange();
  // Unload with control_mutex_ held; `forget` also removes the model from the index.
  Status Unload(const std::string& name, bool forget);
  // Waits until no request holds each old version (ModelHandle::WaitIdle; Stop ends the wait),
  // stops it and releases its instances and the memory they cached.
  void Retire(const std::string& name, std::vector<VersionSlot> old);

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
  // CPU instances over every loadable version of the models LoadAll loads (for the default
  // thread split). mutex_ held.
  int CountCpuInstances() const;

  BackendFactory* const factory_;
  const Options options_;
  SteadyTimeSource steady_;
  const TimeSource* const clock_;
  std::mutex control_mutex_;  // serialises LoadAll, LoadModel, UnloadModel, PollRepository
  mutable std::mutex mutex_;  // guards what follows, never held while loading or draining
  std::map<std::string, Entry> entries_;  // by name, which is repository order
  std::vector<std::weak_ptr<ModelHandle>> retiring_;  // old versions being drained
  std::function<void()> change_listener_;
  bool loaded_ = false;
  std::atomic<bool> stopping_{false};  // Stop was called: nothing more loads
  std::atomic<int> default_intra_op_threads_{1};  // set by LoadAll before anything loads
};

// Poll mode's thread: calls PollRepository every `interval` until Stop (or destruction).
class RepositoryPoller {
 public:
  RepositoryPoller(ModelManager* manager, Duration interval);
  ~RepositoryPoller();
  // Returns once a pass in progress has ended. Idempotent.
  void Stop();

 private:
  ModelManager* const manager_;
  const Duration interval_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace sluice
