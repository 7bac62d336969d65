// The manager's tests' shared parts: models as the repository would build them, a repository in
// memory, requests sent straight to a version, and the manager's three parts wired together.
#pragma once

#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "server/manager/model_control.h"
#include "server/manager/model_manager.h"
#include "server/manager/version_loader.h"
#include "tests/unit/fakes.h"

namespace sluice::testing {

inline ModelOverride ConfigOverride(std::string json) {
  ModelOverride override;
  override.config_json = std::move(json);
  return override;
}

// INPUT__0 FP32 [2] -> OUTPUT__0 FP32 [2], max_batch_size 4, one KIND_AUTO instance, as the
// repository would build it from a config.pbtxt with nothing else in it. `edit` changes the spec
// as more config would (the parser's own tests cover the config side).
inline RepositoryModel Model(const std::string& name, std::vector<int64_t> versions,
                             const std::function<void(ModelSpec&)>& edit = nullptr) {
  RepositoryModel model;
  model.name = name;
  model.directory = "/repo/" + name;
  ModelSpec& spec = model.spec;
  spec.name = name;
  spec.max_batch_size = 4;
  spec.inputs.push_back({"INPUT__0", DataType::kFp32, {2}});
  spec.outputs.push_back({"OUTPUT__0", DataType::kFp32, {2}});
  spec.instance_groups.push_back({InstanceKind::kAuto, 1, {}});
  if (edit) edit(spec);
  for (int64_t v : versions) model.versions[v] = model.directory / std::to_string(v) / "model.pt";
  return model;
}

inline std::function<void(ModelSpec&)> Groups(std::vector<InstanceGroupSpec> groups) {
  return [groups](ModelSpec& spec) { spec.instance_groups = groups; };
}

inline RepositoryModel Broken(const std::string& name, const std::string& why) {
  RepositoryModel model;
  model.name = name;
  model.status = absl::InvalidArgumentError(why);
  return model;
}

inline std::vector<RepositoryModel> Models(std::vector<RepositoryModel> models) { return models; }

// A repository in memory for model control: what LoadModel and PollRepository read.
class MemorySource final : public ModelSource {
 public:
  std::optional<std::string> last_override() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return last_override_;
  }
  void Put(RepositoryModel model, const std::string& fingerprint) {
    std::lock_guard<std::mutex> lock(mutex_);
    model.fingerprint = fingerprint;
    models_[model.name] = std::move(model);
  }
  void Remove(const std::string& name) {
    std::lock_guard<std::mutex> lock(mutex_);
    models_.erase(name);
  }
  StatusOr<std::vector<RepositoryModel>> Scan() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<RepositoryModel> models;
    for (const auto& [name, model] : models_) models.push_back(model);
    return models;
  }
  StatusOr<RepositoryModel> Read(const std::string& name,
                                 const ModelOverride& override) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    last_override_ = override.config_json;
    auto it = models_.find(name);
    if (it == models_.end()) return absl::NotFoundError("no model '" + name + "'");
    return it->second;
  }

 private:
  mutable std::mutex mutex_;
  std::map<std::string, RepositoryModel> models_;
  mutable std::optional<std::string> last_override_;
};

// Submits a request with id `id` (one row of INPUT__0) and returns where its answer will be.
inline std::future<StatusOr<Outputs>> Send(ModelHandle* model, const std::string& id) {
  struct Call {
    std::vector<float> data = std::vector<float>(2, 1.0f);
    TensorSink sink;
    std::promise<StatusOr<Outputs>> answer;
  };
  auto call = std::make_shared<Call>();
  auto request = std::make_unique<InferRequest>();
  request->model_name = model->spec().name;
  request->id = id;
  request->inputs.push_back({"INPUT__0",
                             DataType::kFp32,
                             {1, 2},
                             reinterpret_cast<const char*>(call->data.data()),
                             8,
                             {}});
  auto answer = call->answer.get_future();
  model->Submit(std::move(request), &call->sink, [call](Status status) {
    call->answer.set_value(testing::Collected(status, call->sink));
  });
  return answer;
}

// Closes `backend`'s gate and sends request "1", which starts and blocks there, and request "2",
// which waits in the queue behind it. Both are answered once the gate opens.
inline std::pair<std::future<StatusOr<Outputs>>, std::future<StatusOr<Outputs>>> HoldTwoRequests(
    FakeBackend* backend, ModelHandle* servable) {
  const int warmup_runs = backend->started();
  backend->CloseGate();
  auto running = Send(servable, "1");
  backend->WaitStarted(warmup_runs + 1);
  return {std::move(running), Send(servable, "2")};
}

// The manager's three parts wired as the server wires them.
// Ensembles find their step models in `manager` (unless loader_options names another lookup).
struct ManagerParts {
  ManagerParts(std::vector<RepositoryModel> models, FakeBackendFactory* factory,
               VersionLoader::Options loader_options = {},
               ModelControl::Options control_options = {},
               ModelManager::Options manager_options = {})
      : manager(std::move(models), manager_options),
        loader(factory, WithLookup(std::move(loader_options), &manager)),
        control(&manager, &loader, std::move(control_options)) {}
  static VersionLoader::Options WithLookup(VersionLoader::Options options,
                                           const ModelLookup* lookup) {
    if (options.lookup == nullptr) options.lookup = lookup;
    return options;
  }
  ModelManager manager;  // before the loader, which finds ensembles' models in it
  VersionLoader loader;
  ModelControl control;
};

// An ensemble of `steps` models in a chain: INPUT__0 -> the first -> ... -> OUTPUT__0, each step
// reading its model's INPUT__0 and writing its OUTPUT__0 (Model's tensors), one version.
inline RepositoryModel Ensemble(const std::string& name, const std::vector<std::string>& steps) {
  RepositoryModel model = Model(name, {1}, [&](ModelSpec& spec) {
    spec.platform = kEnsemblePlatform;
    spec.instance_groups.clear();
    for (size_t i = 0; i < steps.size(); ++i) {
      const std::string in = i == 0 ? "INPUT__0" : "t" + std::to_string(i);
      const std::string out = i + 1 == steps.size() ? "OUTPUT__0" : "t" + std::to_string(i + 1);
      spec.ensemble.steps.push_back({steps[i], -1, {{"INPUT__0", in}}, {{"OUTPUT__0", out}}});
    }
  });
  return model;
}

inline ModelControl::Options Control(ModelControlMode mode, const ModelSource* source,
                                     std::vector<std::string> startup = {}) {
  ModelControl::Options options;
  options.mode = mode;
  options.source = source;
  options.startup_models = std::move(startup);
  return options;
}

}  // namespace sluice::testing
