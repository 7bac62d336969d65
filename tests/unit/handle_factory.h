// A ModelHandle over a DynamicBatcher with one given backend, from config.pbtxt text: what the
// tests of the layers above the scheduler (the gRPC service, the allocation count) serve.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "server/batching/dynamic_batcher.h"
#include "server/manager/model_handle.h"
#include "server/repository/model_config_parser.h"

namespace sluice::testing {

// `max_requests`: the batcher's queue cap (max_queue_size); the batch cap is 8 rows.
inline std::shared_ptr<ModelHandle> MakeHandle(const std::string& name, const std::string& config_text,
                                               std::unique_ptr<ModelBackend> backend, const TimeSource* clock,
                                               int max_requests = 1024) {
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
  return std::make_shared<ModelHandle>(model, 1, "cpu x1", std::shared_ptr<Scheduler>(*std::move(batcher)),
                                       std::move(stats), clock);
}

}  // namespace sluice::testing
