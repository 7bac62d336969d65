// Model control: what loads when. At start-up it loads the models the server is asked for; while
// the server runs it loads, reloads and unloads models on request (RepositoryModelLoad/Unload) or
// as the repository changes (poll mode). All of it happens on the control thread, one change at
// a time: loading and warming up take seconds, and neither the gRPC threads nor lookups wait for
// them.
#pragma once

#include <atomic>
#include <deque>
#include <filesystem>
#include <map>
#include <set>
#include <functional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "server/core/clock.h"
#include "server/core/mutex.h"
#include "server/core/repository_model.h"
#include "server/core/status.h"
#include "server/manager/model_manager.h"
#include "server/manager/residency.h"
#include "server/manager/version_loader.h"

namespace sluice {

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

// Thread-safe. The synchronous calls (LoadAll, LoadModel, UnloadModel, PollRepository) run one
// at a time on the caller's thread; the server runs them on the control thread (Start, Submit).
class ModelControl {
 public:
  struct Options {
    ModelControlMode mode = ModelControlMode::kNone;  // --model-control-mode
    // In explicit mode, the models LoadAll loads (--load-model; "*" loads all); the others are
    // listed as not loaded until LoadModel loads them. Ignored in the other modes.
    std::vector<std::string> startup_models;
    const ModelSource* source = nullptr;  // where LoadModel and PollRepository read; null: nowhere
    Duration poll_interval = std::chrono::seconds(15);  // poll mode: --repository-poll-secs
    const TimeSource* clock =
        nullptr;  // what the polls are timed on (outlives the control); null: the steady clock
    // How long a retired version (reload, unload) keeps serving its active sequences so that they
    // can end; then they are ended with an error (--shutdown-grace-seconds).
    Duration sequence_drain = std::chrono::seconds(30);
    // Loads may carry model files (--allow-load-files; explicit mode): the front ends accept
    // "file:" load parameters, within max_load_file_bytes per load (--load-files-max-bytes).
    bool accept_load_files = false;
    uint64_t max_load_file_bytes = 1ull << 30;
    // --model-load-on-demand (explicit and poll modes): only the --load-model models load at
    // start-up, and they are pinned; any other model in the repository loads when a request asks
    // for it (LoadOnDemand). A model unloaded with RepositoryModelUnload stays unloaded until
    // RepositoryModelLoad loads it (an explicit unload wins). In poll mode a scan reloads changed
    // models that serve, records the others for their next load, and forgets removed ones.
    bool load_on_demand = false;
    // The memory budget per device and the minimum residency (--model-load-gpu-limit,
    // --model-load-host-limit, --model-min-residency-secs); loads on demand and explicit loads
    // unload idle models to stay within it, older ones (least recently used first) before those
    // younger than the minimum residency (PlanEviction).
    EvictionPolicy eviction;
    // After a failed load on demand, the model is not loaded on demand again for
    // load_retry_first, doubling per failure up to load_retry_longest (--model-load-retry-secs).
    Duration load_retry_first = std::chrono::seconds(10);
    Duration load_retry_longest = std::chrono::seconds(300);
    // How long a load waits for busy models to go idle when only they could make room.
    Duration room_wait = std::chrono::seconds(2);
    // After the budget had no room for a model, its requests are refused at once for this long
    // instead of each holding the control thread for room_wait.
    Duration no_room_retry = std::chrono::seconds(1);
    ModelObserver* observer = nullptr;  // loads, evictions and the budget; may be null
  };

  // `manager` and `loader` outlive the control.
  ModelControl(ModelManager* manager, VersionLoader* loader, Options options);
  // Stop().
  ~ModelControl();

  ModelControlMode mode() const { return options_.mode; }
  bool accepts_load_files() const { return options_.accept_load_files; }
  uint64_t max_load_file_bytes() const { return options_.max_load_file_bytes; }

  // Marks the start-up models LOADING (in explicit mode the others not loaded) before it returns,
  // then starts the control thread: LoadAll first (ahead of tasks submitted before Start), then
  // `loaded` with its status (on that thread), then in poll mode a PollRepository every
  // poll_interval, and Submit's tasks as they come. After Stop, `loaded` gets UNAVAILABLE.
  void Start(std::function<void(const Status&)> loaded);

  // Runs `task` on the control thread after the tasks before it, then `done` with its status (on
  // that thread). After Stop the task still runs (the calls then load nothing).
  void Submit(std::function<Status()> task, std::function<void(const Status&)> done);

  // Loads every selected version of every model the server is asked for (in explicit mode: the
  // start-up models). A model that fails to load is logged with its reason and marked
  // UNAVAILABLE; the others still load. Returns FAILED_PRECONDITION only for a start-up error
  // that concerns every model (--device cuda without a usable GPU).
  Status LoadAll();

  // Loads `name` as the source has it now, or reloads it when it is loaded: every selected
  // version is loaded and warmed up beside the versions serving now, and then swapped in at
  // once. Requests already given an old version (queued or running) finish on it; requests that
  // look the model up after the swap go to the new versions. The old versions stop once the last
  // request holding them is answered, before this returns. If anything fails (config, a version's
  // load or warm-up) while an old version serves, nothing changes and the error comes back; a
  // model that served nothing shows each version's failure. NOT_FOUND or INVALID_ARGUMENT for a
  // name the source does not have; FAILED_PRECONDITION without a source. `override` (a load
  // request's config) replaces the repository's configuration for this load; the next load
  // without one reads the repository's again. Every error starts "failed to load 'name': "
  // (Triton's words, which its clients match).
  Status LoadModel(const std::string& name, const ModelOverride& override = {});

  // Unloads every version of `name`: lookups answer UNAVAILABLE ("unloaded") at once, and this
  // returns when every request already given one of its versions is answered, after stopping the
  // schedulers and releasing the instances. OK when nothing of it is loaded; NOT_FOUND when the
  // manager does not know the model. An ensemble's step models stay loaded unless
  // `unload_dependents` (Triton's unload parameter): then each of them that no other loaded
  // ensemble runs and that is not pinned is unloaded after it, as if unloaded on its own.
  Status UnloadModel(const std::string& name, bool unload_dependents = false);

  // --model-load-on-demand: whether a request for `name` (not served now) should wait for it to
  // load (OnDemandLoads::LoadsOnDemand). Thread-safe, never waits for the control thread.
  bool LoadsOnDemand(const std::string& name) const ABSL_LOCKS_EXCLUDED(demand_mutex_);
  // Whether a load of `name` on demand would be refused now, without queueing one: UNAVAILABLE
  // after an explicit unload, during the back-off after failed loads, and for no_room_retry after
  // the budget had no room for it (saying why and when the next try may come). Thread-safe.
  Status CheckLoadOnDemand(const std::string& name) const ABSL_LOCKS_EXCLUDED(demand_mutex_);

  // Loads `name` for the requests waiting for it (on the control thread, from OnDemandLoader):
  // OK at once when it serves already. Refused while it is in back-off after failed loads, and
  // when it was unloaded explicitly. With a memory budget, first unloads the least recently used
  // models that may go (not pinned, not busy, resident at least the minimum) to make room for
  // what it measured last time it loaded (else its files' size times its instances); once
  // loaded, for what it measured now. RESOURCE_EXHAUSTED, naming what stays and why, when no room
  // can be made (after waiting up to room_wait for busy models); the model is then not loaded.
  Status LoadOnDemand(const std::string& name);

  // The budget and what the serving models hold, per device (for the index and the benchmarks).
  const DeviceBytes& budget() const { return options_.eviction.budget; }

  // One pass of poll mode: loads models that appeared in the source, reloads those whose files
  // changed since they were last tried (RepositoryModel::fingerprint; a failed reload is not
  // retried until the files change again, and the old version keeps serving), and unloads and
  // forgets those whose directory is gone. Per-model problems are logged, not returned; an error
  // only when the source cannot be scanned.
  Status PollRepository();

  // Called (on the thread of the change) after every LoadModel, UnloadModel and PollRepository
  // that changed something, when readiness may have changed; the server refreshes its health
  // service. Null: nothing. Not called with any lock held.
  void SetChangeListener(std::function<void()> listener);

  // From now on nothing loads and polling ends: a load in progress abandons its warm-up, loads
  // asked for later answer UNAVAILABLE. Does not wait. Idempotent.
  void BeginStop();

  // BeginStop, stops every model (ModelManager::Stop: queued requests are answered UNAVAILABLE,
  // drains in progress end), then joins the control thread once the tasks queued before are
  // answered. Idempotent.
  void Stop();

 private:
  void Loop();
  // The models LoadAll loads, each marked LOADING; in explicit mode the others are marked not
  // loaded.
  std::vector<std::shared_ptr<const RepositoryModel>> MarkStartupModels()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(control_mutex_);
  // Loads every version of `model` and swaps them in (see LoadModel). control_mutex_ held.
  // `wanted` false: readiness does not wait for the model (a load on demand).
  // Loads each step model of `ensemble` that serves no version yet (explicit loads of an
  // ensemble load its models first, as Triton's do), each within the memory budget as a load of
  // its own (MakeRoom, SettleBudget) that evicts none of the ensemble's other models. `trigger`
  // ("explicit", "on_demand") is what the observer is told; `wanted` as for Install.
  Status LoadComposingModels(const RepositoryModel& ensemble, const char* trigger, bool wanted)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(control_mutex_);
  // The loaded ensembles (other than `except`) whose steps run `model`.
  std::vector<std::string> EnsemblesRunning(const std::string& model,
                                            const std::string& except = {}) const;
  Status Install(const std::shared_ptr<const RepositoryModel>& model, bool wanted = true)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(control_mutex_);
  // Unload with control_mutex_ held; `forget` also removes the model from the index.
  Status Unload(const std::string& name, bool forget) ABSL_EXCLUSIVE_LOCKS_REQUIRED(control_mutex_);
  // Waits until no request holds each retired version (ModelHandle::WaitIdle; Stop ends the
  // wait), stops it and releases its instances and the memory they cached.
  void Retire(const std::string& name, RetiredVersions retired);
  void NotifyChange();
  // Makes room for `needed` for `name` (PlanEviction, then evicting each model chosen), waiting
  // up to room_wait for busy models. `name` itself is never chosen.
  Status MakeRoom(const std::string& name, const DeviceBytes& needed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(control_mutex_);
  // What `model` is expected to take when it loads: its last measurement, else its files' bytes
  // times its instance count, on the devices the budget limits.
  DeviceBytes Expected(const RepositoryModel& model) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(control_mutex_);
  // After `name` loaded: remembers what it measured; when the models now go over the budget,
  // evicts others. When that is not enough, unloads `name` itself (RESOURCE_EXHAUSTED) if
  // `may_unload` and it is not pinned; else it stays over the budget, with a warning (a reload,
  // a pinned model).
  Status SettleBudget(const std::string& name, bool may_unload)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(control_mutex_);
  bool Pinned(const std::string& name) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(control_mutex_);
  // The resident models, pinned marked.
  std::vector<ResidentModel> Resident() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(control_mutex_);
  void ReportBudget() const;
  bool Budgeted() const { return !options_.eviction.budget.empty(); }

  ModelManager* const manager_;
  VersionLoader* const loader_;
  const Options options_;
  SteadyTimeSource steady_;
  const TimeSource* const clock_;      // options_.clock or &steady_
  std::atomic<bool> stopping_{false};  // read by warm-ups as their abandon flag

  Mutex control_mutex_;  // one change at a time; held while loading and draining
  // Where each model's serving versions were read from (RepositoryModel::directory), for
  // ModelSource::Retain.
  std::map<std::string, std::filesystem::path> serving_directory_ ABSL_GUARDED_BY(control_mutex_);
  std::set<std::string> pinned_
      ABSL_GUARDED_BY(control_mutex_);  // --load-model with load_on_demand
  std::map<std::string, DeviceBytes> measured_
      ABSL_GUARDED_BY(control_mutex_);  // the last load's memory
  // While an ensemble loads: its name and the models its steps run, which no eviction for that
  // load chooses (ResidentModel::kept_for).
  std::string group_ensemble_ ABSL_GUARDED_BY(control_mutex_);
  std::set<std::string> group_ ABSL_GUARDED_BY(control_mutex_);

  mutable Mutex demand_mutex_;  // read by front-end threads (LoadsOnDemand, CheckLoadOnDemand)
  std::set<std::string> unloaded_explicitly_ ABSL_GUARDED_BY(demand_mutex_);
  LoadBackoff backoff_ ABSL_GUARDED_BY(demand_mutex_);
  LoadBackoff no_room_ ABSL_GUARDED_BY(demand_mutex_);  // Options::no_room_retry

  Mutex mutex_;  // the control thread's queue; never held while a task runs
  CondVar wake_;
  struct Task {
    std::function<Status()> run;
    std::function<void(const Status&)> done;
  };
  std::deque<Task> tasks_ ABSL_GUARDED_BY(mutex_);
  // Queues `task` (at the front when `first`) for the control thread; after Stop, answers its
  // `done` with UNAVAILABLE instead and returns false.
  bool Enqueue(Task task, bool first) ABSL_LOCKS_EXCLUDED(mutex_);
  bool polling_ ABSL_GUARDED_BY(mutex_) = false;  // poll mode, once LoadAll ran
  bool thread_stopping_ ABSL_GUARDED_BY(mutex_) = false;
  TimePoint next_poll_ ABSL_GUARDED_BY(mutex_);
  std::function<void()> change_listener_ ABSL_GUARDED_BY(mutex_);

  Mutex thread_mutex_;  // Start and Stop may run on different threads
  std::thread thread_ ABSL_GUARDED_BY(thread_mutex_);
};

}  // namespace sluice
