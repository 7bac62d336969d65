// Pinned model files: SHA-256, the digests manifest, the copy hashed from one descriptor, and
// ModelPinning's answers (pinned and equal, pinned and different, not pinned with and without
// --require-model-digests), on files in a temporary directory.
#include "server/os/file_pinning.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

namespace sluice {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class FilePinningTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/sluice-pinning-test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    root_ = pattern;
    fs::create_directories(root_ / "repo" / "m" / "1");
  }
  void TearDown() override { fs::remove_all(root_); }
  fs::path Write(const fs::path& relative, const std::string& bytes) {
    const fs::path path = root_ / relative;
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }
  std::unique_ptr<ModelPinning> Make(const std::string& manifest, bool require = false) {
    ModelPinning::Options options;
    if (!manifest.empty()) options.manifest = Write("digests", manifest);
    options.repository = root_ / "repo";
    options.require = require;
    options.directory = root_ / "pinned";
    auto made = ModelPinning::Create(options);
    EXPECT_TRUE(made.ok()) << made.status();
    return made.ok() ? *std::move(made) : nullptr;
  }
  fs::path root_;
};

TEST(Sha256Test, KnownDigests) {
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  Sha256 pieces;
  pieces.Update("a", 1);
  pieces.Update("bc", 2);
  EXPECT_EQ(pieces.HexDigest(), Sha256Hex("abc"));
}

TEST(DigestManifestTest, ReadsSha256sumsFormatAndRefusesTheRest) {
  const std::string abc = Sha256Hex("abc");
  auto parsed =
      ParseDigestManifest("# pinned\n\n" + abc + "  m/1/model.pt2\n" + std::string(64, 'A') +
                              " */abs/lib.so\n" + abc + "  m/../m/1/model.pt2\n",
                          "/repo", "digests");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->size(), 2u);
  EXPECT_EQ(parsed->at("/repo/m/1/model.pt2"), abc);
  EXPECT_EQ(parsed->at("/abs/lib.so"), std::string(64, 'a'));  // lower-cased
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"abc  m/1/model.pt2\n", "digests line 1: not a digest and a path"},
      {std::string(63, 'a') + "g  x\n", "not 64 hex digits"},
      {abc + " m/1/model.pt2\n", "not a digest and a path"},
      {abc + "  x\n" + Sha256Hex("") + "  x\n", "line 2: '/repo/x' has two different digests"},
  };
  for (const auto& [text, words] : refused) {
    auto bad = ParseDigestManifest(text, "/repo", "digests");
    ASSERT_FALSE(bad.ok()) << text;
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(bad.status().message()), HasSubstr(words)) << text;
  }
}

TEST_F(FilePinningTest, APinnedFileLoadsFromAPrivateCopyWithItsDigestChecked) {
  const fs::path model = Write("repo/m/1/model.pt2", "package bytes");
  auto pinning = Make(Sha256Hex("package bytes") + "  m/1/model.pt2\n");
  ASSERT_NE(pinning, nullptr);
  struct stat st {};
  ASSERT_EQ(stat(pinning->directory().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  auto path = pinning->Pin(model, "model file");
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_NE(*path, model);
  EXPECT_EQ(path->parent_path(), pinning->directory());
  std::ifstream copy(*path, std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(copy), {}), "package bytes");
  ASSERT_EQ(stat(path->c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0500u);
  // A second pin of the same file is a copy of its own.
  auto again = pinning->Pin(model, "model file");
  ASSERT_TRUE(again.ok());
  EXPECT_NE(*again, *path);
  // The directory goes with the pinning.
  const fs::path directory = pinning->directory();
  pinning.reset();
  EXPECT_FALSE(fs::exists(directory));
}

TEST_F(FilePinningTest, AChangedByteIsRefusedWithBothDigestsAndLeavesNoCopy) {
  const fs::path model = Write("repo/m/1/model.pt2", "package bytes!");  // one byte more
  auto pinning = Make(Sha256Hex("package bytes") + "  m/1/model.pt2\n");
  auto refused = pinning->Pin(model, "model file");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("has SHA-256 " + Sha256Hex("package bytes!") + ", not " +
                        Sha256Hex("package bytes") + " as --model-digests pins it"));
  EXPECT_TRUE(fs::is_empty(pinning->directory()));
  // The manifest is read on each pin: an operator who pins the new bytes loads them.
  Write("digests", Sha256Hex("package bytes!") + "  m/1/model.pt2\n");
  EXPECT_TRUE(pinning->Pin(model, "model file").ok());
}

TEST_F(FilePinningTest, AFileWithoutADigestLoadsAsItIsUnlessDigestsAreRequired) {
  const fs::path model = Write("repo/m/1/model.pt", "torchscript");
  auto lenient = Make(Sha256Hex("other") + "  other/1/model.pt\n");
  auto as_is = lenient->Pin(model, "model file");
  ASSERT_TRUE(as_is.ok());
  EXPECT_EQ(*as_is, model);
  lenient.reset();
  auto strict = Make(Sha256Hex("other") + "  other/1/model.pt\n", /*require=*/true);
  auto refused = strict->Pin(model, "operator library");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("operator library " + model.string() + " has no digest"));
}

TEST_F(FilePinningTest, CreateRefusesWhatCannotBeTrusted) {
  ModelPinning::Options no_manifest;
  no_manifest.require = true;
  no_manifest.directory = root_ / "pinned";
  EXPECT_THAT(std::string(ModelPinning::Create(no_manifest).status().message()),
              HasSubstr("--require-model-digests needs the digests"));
  ModelPinning::Options broken;
  broken.manifest = Write("broken", "not a manifest\n");
  broken.directory = root_ / "pinned";
  EXPECT_EQ(ModelPinning::Create(broken).status().code(), absl::StatusCode::kInvalidArgument);
  ModelPinning::Options open_dir;
  fs::create_directories(root_ / "open");
  fs::permissions(root_ / "open", fs::perms::all);
  open_dir.directory = root_ / "open";
  EXPECT_THAT(std::string(ModelPinning::Create(open_dir).status().message()),
              HasSubstr("mode 0700"));
}

}  // namespace
}  // namespace sluice
