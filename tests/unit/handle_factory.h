// A ModelHandle over a DynamicBatcher with one given backend, from config.pbtxt text: what the
// tests of the layers above the scheduler (the gRPC service, the allocation count) serve.
#pragma once

#include <map>
#include <mutex>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "server/batching/dynamic_batcher.h"
#include "server/manager/model_errors.h"
#include "server/manager/model_handle.h"
#include "server/repository/model_config_parser.h"

namespace sluice::testing {

// `max_requests`: the batcher's queue cap (max_queue_size); the batch cap is 8 rows.
inline std::shared_ptr<ModelHandle> MakeHandle(const std::string& name,
                                               const std::string& config_text,
                                               std::unique_ptr<ModelBackend> backend,
                                               const TimeSource* clock, int max_requests = 1024) {
  auto model = std::make_shared<RepositoryModel>();
  model->name = name;
  auto config = ParseModelConfigText(config_text, name);
  EXPECT_TRUE(config.ok()) << config.status();
  auto spec = BuildModelSpec(name, &*config);
  EXPECT_TRUE(spec.ok()) << spec.status();
  model->spec = *spec;
  model->config = std::make_shared<const inference::ModelConfig>(*config);
  std::vector<std::unique_ptr<ModelBackend>> backends;
  backends.push_back(std::move(backend));
  auto stats = std::make_shared<ModelStats>();
  DynamicBatcher::Options options;
  options.queue.max_batch_size = 8;
  options.queue.max_requests = max_requests;
  options.clock = clock;
  options.stats = stats;
  auto batcher = DynamicBatcher::Create(model->spec, std::move(backends), options);
  EXPECT_TRUE(batcher.ok()) << batcher.status();
  return std::make_shared<ModelHandle>(
      model, 1, "cpu x1", std::shared_ptr<Scheduler>(*std::move(batcher)), std::move(stats), clock);
}

// "x" INT32 [-1] -> "y" INT32 [-1] (and "sum" INT64 [1] with `with_sum`), batching up to 8 rows,
// `max_queue` waiting requests at most (default one), request timeouts allowed.
inline std::shared_ptr<ModelHandle> MakeEchoModel(const std::string& name,
                                                  std::unique_ptr<ModelBackend> backend,
                                                  const TimeSource* clock, bool with_sum = false,
                                                  int max_queue = 1) {
  return MakeHandle(name,
                    std::string("max_batch_size: 8\n"
                                "input [ { name: \"x\" data_type: TYPE_INT32 dims: [ -1 ] } ]\n"
                                "output [ { name: \"y\" data_type: TYPE_INT32 dims: [ -1 ] }") +
                        (with_sum ? ", { name: \"sum\" data_type: TYPE_INT64 dims: [ 1 ] }" : "") +
                        " ]\n"
                        "dynamic_batching { default_queue_policy { max_queue_size: " +
                        std::to_string(max_queue) + " allow_timeout_override: true } }\n",
                    std::move(backend), clock, max_queue);
}

// Models by name; "loading" exists but is not ready (UNAVAILABLE), any other unknown name is
// NOT_FOUND. FindSequence looks through `sequence_holders` (as the manager looks through ready and
// draining versions).
class FakeLookup final : public ModelLookup {
 public:
  StatusOr<InFlightModel> Find(const std::string& name,
                               const std::string& /*version*/) const override {
    if (name == "loading") return NoReadyVersionError(name, "still loading");
    std::lock_guard<std::mutex> lock(mutex);
    auto it = models.find(name);
    if (it == models.end() && loads != nullptr && loads->LoadsOnDemand(name)) {
      return NoReadyVersionError(name, "not loaded yet");
    }
    if (it == models.end()) return UnknownModelError(name);
    return it->second->Acquire();
  }
  StatusOr<InFlightModel> FindSequence(const std::string& /*name*/,
                                       const CorrelationId& id) const override {
    for (const auto& holder : sequence_holders) {
      if (holder->HasSequence(id)) return holder->Acquire();
    }
    return absl::NotFoundError("no version holds the sequence");
  }
  OnDemandLoads* on_demand() const override { return loads; }
  std::map<std::string, std::shared_ptr<ModelHandle>>
      models;  // guarded by `mutex` once requests run
  std::vector<std::shared_ptr<ModelHandle>> sequence_holders;
  OnDemandLoads* loads = nullptr;
  mutable std::mutex mutex;
};

}  // namespace sluice::testing
