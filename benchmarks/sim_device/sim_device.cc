// sluice_sim_device.so: a simulated accelerator as an operator library, so that the server's
// batching and instance pool can be engineered on a machine without a GPU against a device whose
// costs look like a real one's (benchmarks/device_feed_benchmark.py). A model's forward calls
//   x = sluice_sim::h2d(x, gbps)                       copy the batch to the device
//   y = sluice_sim::launch(x, width, launch_us, d0_us, d1_us, spin)   launch the forward
//   y = sluice_sim::d2h(y, gbps)                       copy the answer back
//   y = sluice_sim::sync(y, spin)                      wait for the stream, as CUDA's wait does
// Each calling thread is one stream (an instance's worker thread is its instance's stream); the
// compute engine and the two copy engines are shared by the whole process (sim_timeline.h).
// `launch` holds the calling thread for the launch cost (spinning, as a real launch does, or
// sleeping, which leaves a small machine's CPUs to the rest of the server), queues the work and
// returns at once;
// the copies queue and return at once; `sync` blocks (spin false: sleeps) or spins until the
// stream's last item has ended. The answer is zeros of shape [rows, width] in x's dtype.
// sluice_sim::stats() returns what the timelines counted since the library was loaded, as int64:
// [now_ns, compute_busy_ns, compute_items, compute_rows, h2d_busy_ns, d2h_busy_ns, h2d_bytes,
// d2h_bytes]: a model that returns it lets a client read the device's busy time.
#include <chrono>
#include <thread>

#include <ATen/ATen.h>
#include <torch/library.h>

#include "benchmarks/sim_device/sim_timeline.h"

namespace {

using sluice::sim::DeviceParams;
using sluice::sim::Stream;
using sluice::sim::Timeline;

Timeline& Device() {
  static Timeline* timeline = new Timeline();  // never destroyed: threads may outlive statics
  return *timeline;
}

thread_local Stream stream;

int64_t Now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Holds the calling thread until `until`: spinning (a real launch, or CUDA's spin wait) or
// sleeping (CUDA's blocking wait, or a launch on a small machine).
void WaitUntil(int64_t until, bool spin) {
  if (spin) {
    while (Now() < until) {
    }
  } else if (Now() < until) {
    std::this_thread::sleep_until(
        std::chrono::steady_clock::time_point(std::chrono::nanoseconds(until)));
  }
}

at::Tensor HostToDevice(const at::Tensor& x, double gbps) {
  Device().Copy(&stream, Timeline::kHostToDevice, static_cast<int64_t>(x.nbytes()), Now(), gbps);
  return x;
}

at::Tensor DeviceToHost(const at::Tensor& y, double gbps) {
  Device().Copy(&stream, Timeline::kDeviceToHost, static_cast<int64_t>(y.nbytes()), Now(), gbps);
  return y;
}

at::Tensor Launch(const at::Tensor& x, int64_t width, double launch_us, double d0_us, double d1_us,
                  bool spin) {
  TORCH_CHECK(x.dim() >= 1, "sluice_sim::launch: the input needs a batch dimension");
  DeviceParams params;
  params.launch_us = launch_us;
  params.d0_us = d0_us;
  params.d1_us = d1_us;
  const int64_t rows = x.size(0);
  const int64_t start = Now();
  WaitUntil(start + static_cast<int64_t>(launch_us * 1000), spin);
  Device().Compute(&stream, rows, start, Now(), params);
  return at::zeros({rows, width}, x.options());
}

at::Tensor Sync(const at::Tensor& y, bool spin) {
  WaitUntil(stream.last_end, spin);
  return y;
}

at::Tensor Stats() {
  const sluice::sim::TimelineStats s = Device().stats();
  return at::tensor({Now(), s.compute_busy_ns, s.compute_items, s.compute_rows, s.copy_busy_ns[0],
                     s.copy_busy_ns[1], s.copy_bytes[0], s.copy_bytes[1]},
                    at::kLong);
}

}  // namespace

// Every operator has effects the graph cannot see (the timelines): CONSERVATIVE keeps the
// TorchScript optimiser from folding, reordering or dropping any of them.
TORCH_LIBRARY(sluice_sim, m) {
  constexpr auto kEffects = c10::AliasAnalysisKind::CONSERVATIVE;
  m.def(torch::schema("h2d(Tensor x, float gbps) -> Tensor", kEffects), &HostToDevice);
  m.def(torch::schema("d2h(Tensor y, float gbps) -> Tensor", kEffects), &DeviceToHost);
  m.def(torch::schema("launch(Tensor x, int width, float launch_us, float d0_us, float d1_us, "
                      "bool spin) -> Tensor",
                      kEffects),
        &Launch);
  m.def(torch::schema("sync(Tensor y, bool spin) -> Tensor", kEffects), &Sync);
  m.def(torch::schema("stats() -> Tensor", kEffects), &Stats);
}
