// The clocks of a simulated accelerator (sim_device.cc's operators): a compute engine shared by
// every stream of the process and run in the order work reaches it, two copy engines (host to
// device, device to host), and per stream the end of its last item, which the next item of that
// stream waits for. Busy time is counted from these timelines, never from the callers' threads.
// Times are nanoseconds on one monotonic clock; nothing here reads a clock, so the rules are
// tested with made-up times. Thread-safe.
#pragma once

#include <algorithm>
#include <cstdint>
#include <mutex>

namespace sluice::sim {

struct DeviceParams {
  double launch_us = 2600;  // CPU time the calling thread spends launching one forward's kernels
  double d0_us = 1000;      // device time of a forward at any batch size
  double d1_us = 94;        // and per row
  double gbps = 50;         // each copy engine's bandwidth, GB/s
};

// The work a stream has queued: its next item starts no earlier than `last_end`.
struct Stream {
  int64_t last_end = 0;
};

struct TimelineStats {
  int64_t compute_busy_ns = 0;  // the compute engine's work (not the gaps a launch leaves)
  int64_t compute_items = 0;
  int64_t compute_rows = 0;
  int64_t copy_busy_ns[2] = {0, 0};  // host to device, device to host
  int64_t copy_bytes[2] = {0, 0};
};

class Timeline {
 public:
  enum Engine { kHostToDevice = 0, kDeviceToHost = 1 };

  // A copy of `bytes` queued at `now` on `stream`: it starts when the engine and the stream are
  // free and takes bytes / bandwidth. Returns its end.
  int64_t Copy(Stream* stream, Engine engine, int64_t bytes, int64_t now, double gbps) {
    std::lock_guard<std::mutex> lock(mutex_);
    const int64_t start = std::max({now, copy_end_[engine], stream->last_end});
    const auto duration = static_cast<int64_t>(static_cast<double>(bytes) / gbps);  // GB/s = B/ns
    copy_end_[engine] = stream->last_end = start + duration;
    stats_.copy_busy_ns[engine] += duration;
    stats_.copy_bytes[engine] += bytes;
    return stream->last_end;
  }

  // A forward of `rows` whose kernels were launched from `launch_start` to `launch_end` (the
  // calling thread spun meanwhile). Its kernels run as they arrive: the work (d0 + d1 * rows)
  // starts once the launch has begun and the engine and the stream are free, and cannot end
  // before the last kernel was launched, so a forward whose launches take longer than its work
  // ends with its launches (launch-bound). Returns its end.
  int64_t Compute(Stream* stream, int64_t rows, int64_t launch_start, int64_t launch_end,
                  const DeviceParams& params) {
    std::lock_guard<std::mutex> lock(mutex_);
    const int64_t start = std::max({launch_start, compute_end_, stream->last_end});
    const auto work = static_cast<int64_t>((params.d0_us + params.d1_us * rows) * 1000);
    compute_end_ = stream->last_end = std::max(start + work, launch_end);
    stats_.compute_busy_ns += work;
    ++stats_.compute_items;
    stats_.compute_rows += rows;
    return stream->last_end;
  }

  TimelineStats stats() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

 private:
  mutable std::mutex mutex_;
  int64_t compute_end_ = 0;
  int64_t copy_end_[2] = {0, 0};
  TimelineStats stats_;
};

}  // namespace sluice::sim
