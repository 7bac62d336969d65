// Reading PEM files named by a flag (server/os/pem.h).
#include "server/os/pem.h"

#include <filesystem>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace sluice {
namespace {

TEST(PemTest, ReadsPemAndNamesTheFlagOnErrors) {
  const auto directory = std::filesystem::temp_directory_path() / "sluice_pem_test";
  std::filesystem::create_directories(directory);
  std::ofstream(directory / "good.pem")
      << "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
  std::ofstream(directory / "bad.pem") << "not a certificate";
  auto good = ReadPemFile((directory / "good.pem").string(), "--grpc-server-cert");
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_THAT(*good, ::testing::HasSubstr("BEGIN CERTIFICATE"));
  EXPECT_THAT(
      ReadPemFile((directory / "bad.pem").string(), "--grpc-server-cert").status().message(),
      ::testing::HasSubstr("--grpc-server-cert: " + (directory / "bad.pem").string() +
                           " is not a PEM file"));
  EXPECT_THAT(ReadPemFile((directory / "none.pem").string(), "--grpc-root-cert").status().message(),
              ::testing::HasSubstr("--grpc-root-cert: cannot read"));
  EXPECT_THAT(ReadPemFile("", "--grpc-server-key").status().message(),
              ::testing::HasSubstr("--grpc-server-key is required"));
  std::filesystem::remove_all(directory);
}

}  // namespace
}  // namespace sluice
