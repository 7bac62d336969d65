// sluice-bench-inprocess: forward-pass throughput and latency of a TorchScript file (or an
// AOTInductor package, .pt2) called directly through LibTorch, at several batch sizes: the
// ceiling a server is measured against.
// Prints one JSON object per batch size on stdout. On --device cuda the input lives on the GPU
// and every timed pass ends with a device synchronisation, so a latency is the whole forward.
// --via-sluice-runtime: the input is in the instance's staging memory on the host (pinned on a
// GPU, as the server's batches are) and each pass includes the copies to the device and back
// that the runtime makes; the difference between the two modes is what the copies cost.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>
#include <c10/core/InferenceMode.h>
#include <torch/cuda.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/script.h>

#include "absl/strings/ascii.h"
#include "server/core/data_type.h"
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
  std::string device_name = "cpu";
  std::string dtype_name = "fp32";
  app.add_option("--model", model, "TorchScript file, or an AOTInductor package (.pt2)")
      ->required();
  app.add_option("--row-shape", row_shape, "Shape of one row, without the batch dimension")
      ->required()
      ->delimiter(',');
  app.add_option("--batch-sizes", batch_sizes, "Batch sizes to measure")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--seconds", seconds, "Measuring time per batch size")->capture_default_str();
  app.add_option("--warmup", warmup, "Untimed forward passes per batch size")
      ->capture_default_str();
  app.add_option("--threads", threads, "Intra-op threads (0: LibTorch's default)")
      ->capture_default_str();
  app.add_option("--worker-thread", worker_thread,
                 "Measure on a std::thread instead of the main thread (as server instances run)")
      ->capture_default_str();
  app.add_option("--gap-us", gap_us, "Sleep between forward passes (as between requests)")
      ->capture_default_str();
  app.add_option("--via-sluice-runtime", via_runtime,
                 "Call Sluice's TorchScript backend (Execute) instead of Module::forward, to see "
                 "what the runtime seam adds")
      ->capture_default_str();
  app.add_option("--device", device_name,
                 "Where the module and its input live: cpu, cuda or cuda:N")
      ->capture_default_str();
  app.add_option("--dtype", dtype_name,
                 "Input datatype: fp32, fp16 or bf16 (the module must take it)")
      ->check(CLI::IsMember({"fp32", "fp16", "bf16"}))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  const torch::Device device(device_name);
  if (device.is_cuda() && !torch::cuda::is_available()) {
    std::fprintf(stderr, "--device %s: no usable CUDA GPU\n", device_name.c_str());
    return 1;
  }
  const torch::ScalarType scalar_type = dtype_name == "fp16"   ? torch::kHalf
                                        : dtype_name == "bf16" ? torch::kBFloat16
                                                               : torch::kFloat;
  const sluice::DataType data_type = *sluice::ParseDataTypeName(absl::AsciiStrToUpper(dtype_name));

  const bool package = model.size() > 4 && model.compare(model.size() - 4, 4, ".pt2") == 0;
  std::unique_ptr<sluice::ModelBackend> backend;
  if (via_runtime) {
    sluice::ModelSpec spec;
    spec.name = "bench";
    if (package) {
      spec.platform = "torch_aoti";
      spec.format = sluice::ModelFormat::kAotInductor;
    }
    spec.max_batch_size =
        static_cast<int>(*std::max_element(batch_sizes.begin(), batch_sizes.end()));
    // The output's shape is not checked by this benchmark: accept any.
    spec.inputs = {{"INPUT__0", data_type, row_shape}};
    spec.outputs = {{"OUTPUT__0", data_type, {-1}}};
    spec.instance_groups = {sluice::InstanceGroupSpec{}};
    spec.intra_op_threads = threads;
    auto loaded = sluice::MakeTorchBackendFactory()->Load(
        spec, model,
        sluice::Device{device.is_cuda(), device.is_cuda() ? std::max<int>(device.index(), 0) : 0});
    if (!loaded.ok()) {
      std::fprintf(stderr, "%s\n", std::string(loaded.status().message()).c_str());
      return 1;
    }
    backend = *std::move(loaded);
  }

  // The package's own input check, as the server runs it: a dynamic batch starts at 2.
  if (package) setenv("AOTI_RUNTIME_CHECK_INPUTS", "1", 1);
  std::optional<torch::jit::Module> module;
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader;
  if (package) {
    loader = std::make_unique<torch::inductor::AOTIModelPackageLoader>(
        model, "model", false, 1, device.is_cuda() ? std::max<int>(device.index(), 0) : -1);
  } else {
    module = torch::jit::load(model, device);
    module->eval();
  }
  auto measure = [&] {
    if (threads > 0) at::set_num_threads(threads);
    c10::InferenceMode inference_mode;
    for (int64_t batch : batch_sizes) {
      std::vector<int64_t> shape{batch};
      shape.insert(shape.end(), row_shape.begin(), row_shape.end());
      // The runtime takes host bytes (as the server hands them over); the module takes the input
      // where it lives.
      const at::Tensor host_input = torch::rand(shape).to(scalar_type);
      const at::Tensor input = host_input.to(device);
      // Through the runtime the input sits where the server puts a batch: in the instance's
      // staging memory (pinned on a GPU, so the host-to-device copy is asynchronous).
      std::unique_ptr<sluice::StagingBuffer> staging;
      const char* request_bytes = static_cast<const char*>(host_input.data_ptr());
      if (backend) {
        staging = backend->AllocateStaging(host_input.nbytes());
        std::memcpy(staging->data(), host_input.data_ptr(), host_input.nbytes());
        request_bytes = staging->data();
      }
      sluice::InferRequest request;
      request.batch_size = batch;
      request.inputs = {{"INPUT__0", data_type, shape, request_bytes, host_input.nbytes(), {}}};
      auto forward = [&] {
        if (backend) {
          sluice::TensorSink sink;  // what a caller gets: the outputs on the host, one copy each
          const sluice::OutputTarget target{batch, nullptr, &sink};
          if (!backend->Execute(request, absl::MakeConstSpan(&target, 1)).ok()) std::abort();
        } else {
          if (loader) {
            loader->run({input});
          } else {
            module->forward({input});
          }
          if (device.is_cuda()) torch::cuda::synchronize();
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
      std::printf(
          "{\"batch\": %lld, \"iterations\": %zu, \"p50_us\": %.1f, \"p99_us\": %.1f, "
          "\"rows_per_s\": %.1f, \"threads\": %d, \"device\": \"%s\", \"dtype\": \"%s\"}\n",
          static_cast<long long>(batch), latencies_us.size(), latencies_us[latencies_us.size() / 2],
          latencies_us[latencies_us.size() * 99 / 100],
          static_cast<double>(batch) * static_cast<double>(latencies_us.size()) / elapsed,
          at::get_num_threads(), device_name.c_str(), dtype_name.c_str());
    }
  };
  if (worker_thread) {
    std::thread(measure).join();
  } else {
    measure();
  }
  return 0;
}
