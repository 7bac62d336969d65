// Fuzzes what a model repository holds: config.pbtxt text, parsed, validated into a ModelSpec
// (padding buckets, warm-up samples, batching parameters) and turned into a shape plan.
#include <cstddef>
#include <cstdint>
#include <string>

#include "server/batching/shape_plan.h"
#include "server/repository/model_config_parser.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto config =
      sluice::ParseModelConfigText(std::string(reinterpret_cast<const char*>(data), size), "fuzz");
  if (!config.ok()) return 0;
  auto spec = sluice::BuildModelSpec("fuzz", &*config);
  if (!spec.ok()) return 0;
  const sluice::ShapePlan plan = sluice::ComputeShapePlan(*spec);
  (void)sluice::DecideCudnnBenchmark(sluice::CudnnBenchmarkMode::kAuto, *spec, plan);
  return 0;
}
