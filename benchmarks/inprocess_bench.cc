// sluice-bench-inprocess: forward-pass throughput and latency of a TorchScript file called
// directly through LibTorch, at several batch sizes: the ceiling a server is measured against.
// Prints one JSON object per batch size on stdout.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <c10/core/InferenceMode.h>
#include <torch/script.h>

#include "server/runtime/torch_backend.h"

int main(int argc, char** argv) {
  CLI::App app{"In-process LibTorch forward benchmark"};
  std::string model;
  std::vector<int64_t> row_shape;
  std::vector<int64_t> batch_sizes{1, 2, 4, 8, 16, 32, 64};
  double seconds = 1.0;
  int threads = 0;
  int warmup = 20;
  bool worker_thread = false;
  int gap_us = 0;
  bool via_runtime = false;
  app.add_option("--model", model, "TorchScript file")->required();
  app.add_option("--row-shape", row_shape, "Shape of one row, without the batch dimension")->required()->delimiter(',');
  app.add_option("--batch-sizes", batch_sizes, "Batch sizes to measure")->delimiter(',')->capture_default_str();
  app.add_option("--seconds", seconds, "Measuring time per batch size")->capture_default_str();
  app.add_option("--warmup", warmup, "Untimed forward passes per batch size")->capture_default_str();
  app.add_option("--threads", threads, "Intra-op threads (0: LibTorch's default)")->capture_default_str();
  app.add_option("--worker-thread", worker_thread,
                 "Measure on a std::thread instead of the main thread (as server instances run)")
      ->capture_default_str();
  app.add_option("--gap-us", gap_us, "Sleep between forward passes (as between requests)")
      ->capture_default_str();
  app.add_option("--via-sluice-runtime", via_runtime,
                 "Call Sluice's TorchScript backend (Execute) instead of Module::forward, to see "
                 "what the runtime seam adds")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  std::unique_ptr<sluice::ModelBackend> backend;
  if (via_runtime) {
    sluice::ModelSpec spec;
    spec.name = "bench";
    spec.max_batch_size = static_cast<int>(*std::max_element(batch_sizes.begin(), batch_sizes.end()));
    // The output's shape is not checked by this benchmark: accept any.
    spec.inputs = {{"INPUT__0", sluice::DataType::kFp32, row_shape}};
    spec.outputs = {{"OUTPUT__0", sluice::DataType::kFp32, {-1}}};
    spec.instance_groups = {sluice::InstanceGroupSpec{}};
    spec.intra_op_threads = threads;
    auto loaded = sluice::MakeTorchBackendFactory()->Load(spec, model, sluice::Device{});
    if (!loaded.ok()) {
      std::fprintf(stderr, "%s\n", std::string(loaded.status().message()).c_str());
      return 1;
    }
    backend = *std::move(loaded);
  }

  torch::jit::Module module = torch::jit::load(model);
  module.eval();
  auto measure = [&] {
  if (threads > 0) at::set_num_threads(threads);
  c10::InferenceMode inference_mode;
  for (int64_t batch : batch_sizes) {
    std::vector<int64_t> shape{batch};
    shape.insert(shape.end(), row_shape.begin(), row_shape.end());
    const at::Tensor input = torch::rand(shape);
    sluice::InferRequest request;
    request.batch_size = batch;
    request.inputs = {{"INPUT__0", sluice::DataType::kFp32, shape,
                       static_cast<const char*>(input.data_ptr()), input.nbytes()}};
    auto forward = [&] {
      if (backend) {
        if (!backend->Execute(request).ok()) std::abort();
      } else {
        module.forward({input});
      }
    };
    for (int i = 0; i < warmup; ++i) forward();
    std::vector<double> latencies_us;
    const auto start = std::chrono::steady_clock::now();
    const auto stop = start + std::chrono::duration<double>(seconds);
    auto now = start;
    while (now < stop || latencies_us.size() < 5) {
      const auto before = std::chrono::steady_clock::now();
      forward();
      now = std::chrono::steady_clock::now();
      latencies_us.push_back(std::chrono::duration<double, std::micro>(now - before).count());
      if (gap_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(gap_us));
    }
    const double elapsed = std::chrono::duration<double>(now - start).count();
    std::sort(latencies_us.begin(), latencies_us.end());
    std::printf("{\"batch\": %lld, \"iterations\": %zu, \"p50_us\": %.1f, \"p99_us\": %.1f, "
                "\"rows_per_s\": %.1f, \"threads\": %d}\n",
                static_cast<long long>(batch), latencies_us.size(), latencies_us[latencies_us.size() / 2],
                latencies_us[latencies_us.size() * 99 / 100],
                static_cast<double>(batch) * static_cast<double>(latencies_us.size()) / elapsed,
                at::get_num_threads());
  }
  };
  if (worker_thread) {
    std::thread(measure).join();
  } else {
    measure();
  }
  return 0;
}
