// The simulated accelerator's timelines (benchmarks/sim_device/sim_timeline.h) with made-up
// times: launch-bound and work-bound forwards, one compute engine shared by every stream, copies
// on their own engines, and busy time counted from the timelines.
#include "benchmarks/sim_device/sim_timeline.h"

#include <gtest/gtest.h>

namespace sluice::sim {
namespace {

constexpr int64_t kUs = 1000;

DeviceParams H200() { return {}; }  // launch 2.6 ms, d0 1.0 ms, d1 94 us a row, 50 GB/s

TEST(SimTimelineTest, SmallBatchesAreLaunchBoundAndLargeOnesWorkBound) {
  Timeline device;
  Stream stream;
  // Batch 1: 1.094 ms of work ends with the launch, 2.6 ms after it began.
  EXPECT_EQ(device.Compute(&stream, 1, 0, 2600 * kUs, H200()), 2600 * kUs);
  // Batch 8 alike (1.752 ms of work): the H200's 2.7 ms at batch 1 and 8 alike.
  EXPECT_EQ(device.Compute(&stream, 8, 3000 * kUs, 5600 * kUs, H200()), 5600 * kUs);
  // Batch 64: 7.016 ms of work, started with its launch.
  EXPECT_EQ(device.Compute(&stream, 64, 6000 * kUs, 8600 * kUs, H200()), 13016 * kUs);
  const TimelineStats stats = device.stats();
  EXPECT_EQ(stats.compute_busy_ns, (1094 + 1752 + 7016) * kUs);  // the work, not the waits
  EXPECT_EQ(stats.compute_items, 3);
  EXPECT_EQ(stats.compute_rows, 73);
}

TEST(SimTimelineTest, StreamsShareTheComputeEngineInArrivalOrder) {
  Timeline device;
  Stream a, b;
  EXPECT_EQ(device.Compute(&a, 64, 0, 2600 * kUs, H200()), 7016 * kUs);
  // b's launch overlapped a's work: its work waits for the engine, then runs.
  EXPECT_EQ(device.Compute(&b, 64, 2700 * kUs, 5300 * kUs, H200()), 14032 * kUs);
  EXPECT_EQ(a.last_end, 7016 * kUs);                          // a need not wait for b
  EXPECT_EQ(device.stats().compute_busy_ns, 2 * 7016 * kUs);  // no gap: the engine stayed busy
}

TEST(SimTimelineTest, CopiesUseTheirOwnEnginesAndOrderWithinTheirStream) {
  Timeline device;
  Stream a, b;
  DeviceParams params = H200();
  // 1 MB at 50 GB/s: 20 us.
  EXPECT_EQ(device.Copy(&a, Timeline::kHostToDevice, 1000000, 0, params.gbps), 20 * kUs);
  // b's copy waits for the engine; a's compute waits for a's copy, not for b's.
  EXPECT_EQ(device.Copy(&b, Timeline::kHostToDevice, 1000000, 10 * kUs, params.gbps), 40 * kUs);
  params.d0_us = 100;
  params.d1_us = 0;
  EXPECT_EQ(device.Compute(&a, 1, 5 * kUs, 6 * kUs, params), 120 * kUs);
  // The answer's copy back waits for the compute on a's stream, on the other engine.
  EXPECT_EQ(device.Copy(&a, Timeline::kDeviceToHost, 500000, 7 * kUs, params.gbps), 130 * kUs);
  const TimelineStats stats = device.stats();
  EXPECT_EQ(stats.copy_busy_ns[Timeline::kHostToDevice], 40 * kUs);
  EXPECT_EQ(stats.copy_busy_ns[Timeline::kDeviceToHost], 10 * kUs);
  EXPECT_EQ(stats.copy_bytes[Timeline::kHostToDevice], 2000000);
}

}  // namespace
}  // namespace sluice::sim
