// The table of models the server knows: for each repository model, its versions and their states,
// and the handles of the ready ones. Lookups (Find), the repository index, statistics, readiness
// and the swap of a model's versions live here; loading is VersionLoader's and deciding what to
// load when is ModelControl's.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "server/batching/model_stats.h"
#include "server/core/mutex.h"
#include "server/core/repository_model.h"
#include "server/manager/model_events.h"
#include "server/manager/model_handle.h"
#include "server/manager/residency.h"
#include "server/manager/version_loader.h"

namespace sluice {

// Statistics of one loaded version, for ModelStatistics.
struct VersionStatistics {
  std::string name;
  int64_t version = 0;
  ModelStatsSnapshot stats;
  DeviceBytes memory;  // measured at load (LoadedVersion::memory)
};

// One row of RepositoryIndex.
struct ModelIndexEntry {
  std::string name;
  std::string version;  // empty when the model has no loadable version at all
  ModelState state = ModelState::kUnavailable;
  std::string reason;
  DeviceBytes memory;  // a ready version's, measured at load
};

// Versions taken out of service by Swap or Remove, for the caller to drain (ModelHandle::WaitIdle)
// and release. `stopped`: Stop has run, so the handles are stopped and no wait is needed.
struct RetiredVersions {
  std::vector<std::shared_ptr<ModelHandle>> handles;
  bool stopped = false;
};

// Thread-safe. Every call takes the table's lock only for the time it reads or writes the table;
// nothing waits for a model while holding it, so lookups never wait for a load or a drain.
// Changes are expected from one thread at a time (ModelControl's); the table stays consistent
// either way.
class ModelManager final : public ModelLookup {
 public:
  struct Options {
    ModelObserver* observer =
        nullptr;  // told about every state change and ready version; may be null
    // Where the time a model became ready is read from (Resident); null: the steady clock.
    const TimeSource* clock = nullptr;
  };

  // Knows `models` (in repository order), none of them asked for yet: each is "not loaded" until
  // BeginLoad or NotServed says otherwise.
  ModelManager(std::vector<RepositoryModel> models, Options options);
  ~ModelManager() override;

  // --- Changes (ModelControl) ---

  // `model` (new or newer files of a known one) is about to load. Records its fingerprint as
  // tried. When no version of it serves, the index shows it LOADING now (or its error when it
  // cannot load) and the observer hears LOADING for each version. Returns the versions serving
  // now, which keep serving until Swap.
  // `wanted` false (a load on demand): readiness (AllReady) does not wait for the model, before
  // or after it loads.
  std::vector<int64_t> BeginLoad(const std::shared_ptr<const RepositoryModel>& model,
                                 bool wanted = true);

  // Installs what loaded for `model` at once: lookups after it find the new versions, and every
  // version that served before is returned for the caller to drain and release. A version that
  // failed is listed UNAVAILABLE with its reason. When Stop has run, new handles are stopped and
  // listed as not loaded. Tells the observer (READY and OnReady, UNAVAILABLE for the failed and
  // for old versions the model no longer selects).
  RetiredVersions Swap(const std::shared_ptr<const RepositoryModel>& model,
                       std::vector<LoadedVersion>* loaded, bool wanted = true);

  // Takes every version of `name` out of service: lookups answer UNAVAILABLE (`reason`) at once,
  // and AllReady no longer waits for it. `forget` also drops it from the index. NOT_FOUND for an
  // unknown name.
  StatusOr<RetiredVersions> Remove(const std::string& name, const std::string& reason, bool forget);

  // Lists `name` as not served, with `reason` (explicit mode's models that are not loaded yet).
  void NotServed(const std::string& name, const std::string& reason);

  // Takes every version of `name` out of service as Remove does (not forgotten), but only when
  // none is busy: no request holds one (in flight or queued) and no sequence is active on one.
  // Checked under the table's lock, which lookups take too, so no request can find it between
  // the check and the removal. FAILED_PRECONDITION when busy (nothing changes); NOT_FOUND when
  // unknown.
  StatusOr<RetiredVersions> RemoveIfIdle(const std::string& name, const std::string& reason);

  // Records `model` (new, or newer files of a known one) without loading it: a model that serves
  // nothing is listed with `reason` and its new configuration; one that serves keeps its versions
  // (its entry changes on its next load).
  void Know(const std::shared_ptr<const RepositoryModel>& model, const std::string& reason);

  // The models that serve now, as eviction sees them (ResidentModel; `pinned` left false).
  std::vector<ResidentModel> Resident() const;
  // The memory the ready versions of `name` took at load, summed per device.
  DeviceBytes MemoryOf(const std::string& name) const;

  // Who loads models on demand (see ModelLookup::on_demand); set before requests come, once.
  void SetOnDemand(OnDemandLoads* loads) { on_demand_.store(loads, std::memory_order_release); }
  OnDemandLoads* on_demand() const override { return on_demand_.load(std::memory_order_acquire); }
  uint64_t Generation(const std::string& name) const override;

  // Start-up has tried every model it was asked for: AllReady may now be true.
  void SetStarted();

  // Every model known, any state (the repository as last read), in repository order.
  std::vector<std::shared_ptr<const RepositoryModel>> Models() const;
  // The fingerprint of the files the last load of `name` read ("" when never tried); nullopt for
  // a name the table does not know.
  std::optional<std::string> TriedFingerprint(const std::string& name) const;

  // --- Lookups (front ends) ---

  // The model version a request goes to, as a reference that counts as in flight until it is
  // dropped (ModelHandle::Acquire): an unload or a reload waits for it. `version` empty: the
  // newest ready one. NOT_FOUND: no such model or version (or not a number); UNAVAILABLE: it
  // exists but is not ready (the reason is in the message).
  StatusOr<InFlightModel> Find(const std::string& name, const std::string& version) const override;
  // Looks in the ready versions of `name` and in those being drained (see ModelLookup).
  StatusOr<InFlightModel> FindSequence(const std::string& name,
                                       const CorrelationId& id) const override;

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

  // True once SetStarted ran and every model the server is asked to serve (BeginLoad and not
  // Removed since) has every selected version ready.
  bool AllReady() const;

  // Stops every version, those being drained after a Swap or Remove included (queued requests are
  // answered UNAVAILABLE, which also ends their drain). Idempotent; Swap after it installs nothing.
  void Stop();

 private:
  struct VersionSlot {
    int64_t version = 0;
    ModelState state = ModelState::kLoading;
    std::string reason;
    std::shared_ptr<ModelHandle> handle;  // ready versions only
    ModelTuning tuning;
    DeviceBytes memory;  // measured at load (ready versions)
  };
  struct Entry {
    std::shared_ptr<const RepositoryModel> model;  // never null
    std::vector<VersionSlot> versions;             // ascending; empty when never loaded or broken
    bool wanted = false;                           // the server is asked to serve it
    std::string reason;             // why it serves nothing, when `versions` is empty
    std::string tried_fingerprint;  // the files the last load attempt read (poll mode)
    TimePoint ready_since{};        // the last Swap that installed a ready version
    uint64_t changed_at = 0;        // generation_ at its last Swap or Remove (Generation)
  };

  // Remove and RemoveIfIdle.
  StatusOr<RetiredVersions> Take(const std::string& name, const std::string& reason, bool forget,
                                 bool only_if_idle);
  // A LOADING slot per selected version of `model` (none when it is broken).
  static std::vector<VersionSlot> LoadingSlots(const RepositoryModel& model);
  // Moves `slots`' handles into `retired` and remembers them until they are released.
  void RetireLocked(std::vector<VersionSlot>* slots, RetiredVersions* retired)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void Observe(const std::string& name, int64_t version, ModelState state) const;

  const Options options_;
  SteadyTimeSource steady_;
  const TimeSource* const clock_;  // options_.clock or &steady_
  std::atomic<OnDemandLoads*> on_demand_{nullptr};
  uint64_t generation_ ABSL_GUARDED_BY(mutex_) = 0;  // Swaps and Removes so far
  mutable Mutex mutex_;
  std::map<std::string, Entry> entries_
      ABSL_GUARDED_BY(mutex_);  // by name, which is repository order
  std::vector<std::weak_ptr<ModelHandle>> retiring_ ABSL_GUARDED_BY(mutex_);  // being drained
  bool started_ ABSL_GUARDED_BY(mutex_) = false;
  bool stopped_ ABSL_GUARDED_BY(mutex_) = false;
};

}  // namespace sluice
