#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/frontend/restricted_protocols.h"

namespace sluice {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(RestrictedProtocolsTest, ParsesTritonSyntax) {
  auto restriction =
      ParseProtocolRestriction("model-repository, model-config,statistics:Admin-Key=s3cr=t");
  ASSERT_TRUE(restriction.ok()) << restriction.status();
  EXPECT_THAT(restriction->groups,
              ElementsAre(ProtocolGroup::kModelRepository, ProtocolGroup::kModelConfig,
                          ProtocolGroup::kStatistics));
  EXPECT_EQ(restriction->key, "admin-key");  // gRPC metadata keys are lower case
  EXPECT_EQ(restriction->value, "s3cr=t");
  auto shm = ParseProtocolRestriction("shared-memory:k=v");
  ASSERT_TRUE(shm.ok()) << shm.status();
  EXPECT_THAT(shm->groups, ElementsAre(ProtocolGroup::kSharedMemory));
  EXPECT_STREQ(ProtocolGroupName(ProtocolGroup::kSharedMemory), "shared-memory");
  auto trace = ParseProtocolRestriction("trace:k=v");
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_THAT(trace->groups, ElementsAre(ProtocolGroup::kTrace));
}

TEST(RestrictedProtocolsTest, BadValuesSayWhatIsWrong) {
  EXPECT_THAT(ParseProtocolRestriction("model-config").status().message(),
              HasSubstr("missing ':' or '='"));
  EXPECT_THAT(ParseProtocolRestriction("logging:k=v").status().message(),
              HasSubstr("unknown protocol group 'logging'"));
  EXPECT_THAT(ParseProtocolRestriction("health:=v").status().message(), HasSubstr("not a header"));
  EXPECT_THAT(ParseProtocolRestriction("health:key-bin=v").status().message(),
              HasSubstr("not a header"));
  EXPECT_THAT(ParseProtocolRestriction("health:grpc-timeout=v").status().message(),
              HasSubstr("not a header"));
  EXPECT_THAT(ParseProtocolRestriction("health:key=").status().message(),
              HasSubstr("empty header value"));
  auto a = ParseProtocolRestriction("statistics:a=1");
  auto b = ParseProtocolRestriction("inference,statistics:b=2");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_THAT(CheckRestrictionsDistinct({*a, *b}).message(),
              HasSubstr("'statistics' is restricted twice"));
}

TEST(RestrictedProtocolsTest, AccessNeedsTheHeaderWithTheValue) {
  std::vector<ProtocolRestriction> restrictions = {
      *ParseProtocolRestriction("model-config,statistics:admin-key=yes")};
  // A call's headers, as a front end hands them over.
  using Headers = std::multimap<std::string, std::string>;
  auto check = [&](ProtocolGroup group, const Headers& headers) {
    return CheckProtocolAccess(restrictions, group, [&headers](const std::string& key) {
      std::vector<absl::string_view> values;
      auto [begin, end] = headers.equal_range(key);
      for (auto it = begin; it != end; ++it) values.emplace_back(it->second);
      return values;
    });
  };
  const Headers none;
  const Headers right = {{"admin-key", "yes"}};
  const Headers wrong = {{"admin-key", "no"}, {"other", "yes"}};
  EXPECT_TRUE(check(ProtocolGroup::kInference, none).ok());  // not restricted
  EXPECT_TRUE(check(ProtocolGroup::kModelConfig, right).ok());
  Status missing = check(ProtocolGroup::kStatistics, none);
  EXPECT_EQ(missing.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(
      missing.message(),
      HasSubstr("'statistics' protocol is restricted on this server: send the header 'admin-key'"));
  Status wrong_value = check(ProtocolGroup::kModelConfig, wrong);
  EXPECT_EQ(wrong_value.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(wrong_value.message(), ::testing::Not(HasSubstr("yes")));  // never echoes the secret
}

}  // namespace
}  // namespace sluice
