#include "server/runtime/operator_libraries.h"

#include <ftw.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace sluice {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Built by ctest beside this binary (tests/CMakeLists.txt).
const fs::path kOpsDir = SLUICE_TEST_OPS_DIR;
const char* const kServer = SLUICE_SERVER_BINARY;

// Not std::filesystem::remove_all: libtorch.so exports its own copy, which crashes when called
// from a binary that links it (see aoti_package_test.cc).
void RemoveTree(const fs::path& root) {
  nftw(
      root.c_str(),
      [](const char* path, const struct stat*, int, struct FTW*) { return ::remove(path); }, 16,
      FTW_DEPTH | FTW_PHYS);
}

class OperatorLibrariesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("sluice_ops_test_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    RemoveTree(root_);
    for (const char* dir : {"model/ops", "allowed", "outside"}) fs::create_directories(root_ / dir);
  }
  void TearDown() override { RemoveTree(root_); }
  void Touch(const fs::path& path) { std::ofstream(path) << "x"; }
  OperatorLibraries Make() {
    OperatorLibraries::Options options;
    options.allowed_dirs = {root_ / "allowed", root_ / "does-not-exist"};
    options.probe_program = kServer;
    return OperatorLibraries(options);
  }
  fs::path root_;
};

TEST_F(OperatorLibrariesTest, PathsResolveOnlyInsideTheModelAndAllowedDirectories) {
  Touch(root_ / "model/ops/liba.so");
  Touch(root_ / "allowed/libb.so");
  Touch(root_ / "outside/libc.so");
  fs::create_symlink(root_ / "outside/libc.so", root_ / "model/escape.so");
  fs::create_symlink(root_ / "allowed/libb.so", root_ / "model/to_allowed.so");
  OperatorLibraries libraries = Make();
  const fs::path model = root_ / "model";
  const fs::path real = fs::canonical(root_);

  EXPECT_EQ(*libraries.Resolve("ops/liba.so", model), real / "model/ops/liba.so");
  EXPECT_EQ(*libraries.Resolve("libb.so", model),
            real / "allowed/libb.so");  // the model's directory first, then these
  EXPECT_EQ(*libraries.Resolve((root_ / "allowed/libb.so").string(), model),
            real / "allowed/libb.so");
  EXPECT_EQ(*libraries.Resolve("to_allowed.so", model),
            real / "allowed/libb.so");  // a link into an allowed place

  auto outside = libraries.Resolve((root_ / "outside/libc.so").string(), model);
  EXPECT_EQ(outside.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(outside.status().message()), HasSubstr("outside the model's directory"));
  EXPECT_EQ(libraries.Resolve("escape.so", model).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto climbing = libraries.Resolve("ops/../../outside/libc.so", model);
  EXPECT_THAT(std::string(climbing.status().message()), HasSubstr("'..' is not allowed"));
  auto missing = libraries.Resolve("libnone.so", model);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()),
              HasSubstr("allowed/libnone.so"));  // where it looked
  EXPECT_EQ(libraries.Resolve("ops", model).status().code(),
            absl::StatusCode::kInvalidArgument);  // a directory
  EXPECT_EQ(libraries.Resolve("", model).status().code(), absl::StatusCode::kInvalidArgument);
}

// One test, in order: loading registers operators in this process for good.
TEST_F(OperatorLibrariesTest, ProbedLoadedOnceSharedRefusedAndRemembered) {
  OperatorLibraries libraries = Make();
  const fs::path model = root_ / "model";
  fs::copy_file(kOpsDir / "libsluice_test_ops.so", root_ / "allowed/libsluice_test_ops.so");
  fs::copy_file(kOpsDir / "libsluice_test_ops.so", root_ / "model/ops/copy.so");
  fs::copy_file(kOpsDir / "libsluice_unresolved_ops.so", root_ / "allowed/libunresolved.so");
  int told = 0;
  libraries.SetListener([&told](const OperatorLibrary&) { ++told; });

  // A library that does not load is refused with the loader's reason, and the refusal is
  // remembered for that file (no second probe: the second answer is immediate).
  auto unresolved = libraries.LoadForModel("libunresolved.so", model, "m");
  EXPECT_EQ(unresolved.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(unresolved.status().message()), HasSubstr("undefined symbol"));
  const auto again_started = std::chrono::steady_clock::now();
  EXPECT_EQ(libraries.LoadForModel("libunresolved.so", model, "m").status(), unresolved.status());
  EXPECT_LT(std::chrono::steady_clock::now() - again_started, std::chrono::milliseconds(200));

  auto loaded = libraries.LoadForModel("libsluice_test_ops.so", model, "first");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_THAT(loaded->operators, ElementsAre("sluice_test::scale_add"));
  EXPECT_THAT(loaded->Namespaces(), ElementsAre("sluice_test"));
  EXPECT_TRUE(loaded->init_hook);
  EXPECT_EQ(loaded->origin, "model first");
  // A second model shares it: nothing is loaded again.
  auto shared = libraries.LoadForModel("libsluice_test_ops.so", model, "second");
  ASSERT_TRUE(shared.ok()) << shared.status();
  EXPECT_EQ(shared->origin, "model first");
  EXPECT_EQ(libraries.List().size(), 1u);
  EXPECT_EQ(told, 1);

  // The same library under another path takes its namespace again: the probe's child aborts, the
  // test process does not.
  auto clash = libraries.LoadForModel("ops/copy.so", model, "third");
  EXPECT_EQ(clash.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(clash.status().message()), HasSubstr("Only a single TORCH_LIBRARY"));
  EXPECT_THAT(std::string(clash.status().message()), HasSubstr("signal 6"));
  EXPECT_EQ(libraries.List().size(), 1u);

  // A loaded file that changes on disk cannot be loaded again.
  fs::last_write_time(
      root_ / "allowed/libsluice_test_ops.so",
      fs::last_write_time(root_ / "allowed/libsluice_test_ops.so") + std::chrono::hours(1));
  auto changed = libraries.LoadForModel("libsluice_test_ops.so", model, "fourth");
  EXPECT_EQ(changed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(changed.status().message()), HasSubstr("changed on disk"));

  // The init hook, once per call, and the fini hook when its state goes.
  const fs::path log = root_ / "hooks.log";
  setenv("SLUICE_TEST_INIT_LOG", log.c_str(), 1);
  {
    std::unique_ptr<ModelInitState> state = libraries.CallInitHook(*loaded, "/models/m/1", 0);
    ASSERT_NE(state, nullptr);
  }
  unsetenv("SLUICE_TEST_INIT_LOG");
  std::stringstream hooks;
  hooks << std::ifstream(log).rdbuf();
  EXPECT_EQ(hooks.str(), "init /models/m/1 0\nfini 0\n");

  EXPECT_THAT(
      FormatOperatorLibraries(libraries.List()),
      HasSubstr("libsluice_test_ops.so (model first): 1 operators in sluice_test, init hook\n"));
  EXPECT_EQ(FormatOperatorLibraries({}), "operator libraries: none\n");
}

TEST_F(OperatorLibrariesTest, TrustedLibrariesNeedNoDirectoryAndMissingOnesAreNotFound) {
  OperatorLibraries libraries = Make();
  auto missing = libraries.LoadTrusted(root_ / "outside/libnone.so", "--operator-library");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("does not exist"));
  EXPECT_TRUE(libraries.List().empty());
}

}  // namespace
}  // namespace sluice
