// The server's health as the front ends report it: ready only between start and drain, never
// when not live, and with strict readiness only when every model is ready.
#include "server/frontend/server_health.h"

#include <gtest/gtest.h>

namespace sluice {
namespace {

TEST(ServerHealthTest, ReadyBetweenStartAndDrainAndNeverWhenNotLive) {
  LivenessMonitor liveness;
  ServerHealth health({/*strict=*/false, &liveness, nullptr});
  EXPECT_TRUE(health.Live());
  EXPECT_FALSE(health.Ready());  // not started
  health.SetStarted();
  EXPECT_TRUE(health.Ready());
  liveness.ReportFatal(absl::InternalError("illegal memory access"));
  EXPECT_FALSE(health.Live());
  EXPECT_FALSE(health.Ready());

  ServerHealth draining({false, nullptr, nullptr});
  draining.SetStarted();
  draining.BeginDrain();
  EXPECT_TRUE(draining.Live());  // draining is not dying
  EXPECT_FALSE(draining.Ready());
}

TEST(ServerHealthTest, StrictReadinessWaitsForEveryModel) {
  std::vector<RepositoryModel> models(1);
  models[0].name = "m";
  models[0].status = absl::UnavailableError("still loading");
  ModelManager manager(std::move(models), {});
  ServerHealth strict({/*strict=*/true, nullptr, &manager});
  strict.SetStarted();
  EXPECT_FALSE(strict.Ready());  // "m" is not ready
  ServerHealth lenient({/*strict=*/false, nullptr, &manager});
  lenient.SetStarted();
  EXPECT_TRUE(lenient.Ready());
}

}  // namespace
}  // namespace sluice
