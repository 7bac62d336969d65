// The response cache alone: keys, confirmation on the whole key, the byte bound and LRU order,
// namespaces, and the sinks that record and replay answers.
#include "server/manager/response_cache.h"

#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace sluice {
namespace {

using ::testing::HasSubstr;

size_t cache_page() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }

// Every key lands in one bucket: only the whole-key comparison tells requests apart.
uint64_t Colliding(absl::string_view) { return 42; }

struct Input {
  std::string name;
  DataType dtype = DataType::kInt32;
  Shape shape;
  std::string bytes;
};

InferRequest Request(const std::vector<Input>& inputs, std::vector<std::string> outputs = {}) {
  InferRequest request;
  for (const Input& input : inputs)
    request.AddOwnedInput(input.name, input.dtype, input.shape, input.bytes);
  request.requested_outputs = std::move(outputs);
  return request;
}

std::string Int32s(std::vector<int32_t> values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(int32_t));
}

// One output "y" (INT8, its bytes' length) to insert: views of storage it keeps.
struct Answer {
  explicit Answer(std::string text)
      : bytes(std::move(text)), shape{static_cast<int64_t>(bytes.size())} {}
  std::vector<OutputView> views() const { return {{"y", DataType::kInt8, shape, bytes}}; }
  std::string bytes;
  Shape shape;
};

// The one output's bytes of a hit, written through a TensorSink; "" for no hit.
std::string Read(const ResponseCache::Hit& hit) {
  if (!hit) return "";
  TensorSink sink;
  EXPECT_TRUE(hit.WriteTo(&sink).ok());
  EXPECT_EQ(sink.outputs().size(), 1u);
  EXPECT_EQ(sink.outputs()[0].name, "y");
  return sink.outputs()[0].data;
}

class Recorder final : public ResponseCacheObserver {
 public:
  void OnResponseCacheChanged(const ResponseCacheStats& stats) override { seen.push_back(stats); }
  std::vector<ResponseCacheStats> seen;
};

TEST(ResponseCacheTest, KeysCoverEveryPartOfTheRequestButNotTheOrderOfInputs) {
  ResponseCache cache(1 << 20);
  const uint64_t space = cache.OpenNamespace();
  const InferRequest base = Request(
      {{"a", DataType::kInt32, {1, 2}, Int32s({1, 2})}, {"b", DataType::kInt32, {1}, Int32s({3})}});
  const ResponseCache::Key key = cache.MakeKey(space, base);
  EXPECT_EQ(key.space, space);
  // The same inputs listed the other way round: the same request.
  const InferRequest swapped = Request(
      {{"b", DataType::kInt32, {1}, Int32s({3})}, {"a", DataType::kInt32, {1, 2}, Int32s({1, 2})}});
  EXPECT_EQ(cache.MakeKey(space, swapped).bytes, key.bytes);
  EXPECT_EQ(cache.MakeKey(space, swapped).hash, key.hash);

  const std::vector<InferRequest> different = [&] {
    std::vector<InferRequest> requests;
    requests.push_back(Request({{"a", DataType::kInt32, {1, 2}, Int32s({1, 9})},
                                {"b", DataType::kInt32, {1}, Int32s({3})}}));
    requests.push_back(Request({{"a", DataType::kInt32, {2, 1}, Int32s({1, 2})},
                                {"b", DataType::kInt32, {1}, Int32s({3})}}));
    requests.push_back(Request({{"a", DataType::kFp32, {1, 2}, Int32s({1, 2})},
                                {"b", DataType::kInt32, {1}, Int32s({3})}}));
    requests.push_back(Request({{"c", DataType::kInt32, {1, 2}, Int32s({1, 2})},
                                {"b", DataType::kInt32, {1}, Int32s({3})}}));
    requests.push_back(Request({{"a", DataType::kInt32, {1, 2}, Int32s({1, 2})},
                                {"b", DataType::kInt32, {1}, Int32s({3})}},
                               {"y"}));
    requests.push_back(Request({{"a", DataType::kInt32, {1, 2}, Int32s({1, 2})}}));
    // Bytes moved from one input to the next: length prefixes keep the two apart.
    requests.push_back(Request({{"a", DataType::kInt32, {1, 2}, Int32s({1, 2}) + Int32s({3})},
                                {"b", DataType::kInt32, {1}, ""}}));
    return requests;
  }();
  for (size_t i = 0; i < different.size(); ++i) {
    EXPECT_NE(cache.MakeKey(space, different[i]).bytes, key.bytes) << "variant " << i;
  }
  // The requested outputs' order changes the answer's order: a different request.
  EXPECT_NE(
      cache.MakeKey(space, Request({{"a", DataType::kInt32, {1}, Int32s({1})}}, {"y", "z"})).bytes,
      cache.MakeKey(space, Request({{"a", DataType::kInt32, {1}, Int32s({1})}}, {"z", "y"})).bytes);
  // Naming every output in config order asks for what naming none does.
  const InferRequest none = Request({{"a", DataType::kInt32, {1}, Int32s({1})}});
  const InferRequest all = Request({{"a", DataType::kInt32, {1}, Int32s({1})}}, {"y", "z"});
  EXPECT_EQ(cache.MakeKey(space, all, {"y", "z"}).bytes,
            cache.MakeKey(space, none, {"y", "z"}).bytes);
  EXPECT_NE(cache.MakeKey(space, all).bytes, cache.MakeKey(space, none).bytes);
  EXPECT_NE(cache
                .MakeKey(space, Request({{"a", DataType::kInt32, {1}, Int32s({1})}}, {"z", "y"}),
                         {"y", "z"})
                .bytes,
            cache.MakeKey(space, none, {"y", "z"}).bytes);
  // Another version (namespace): never the same key.
  EXPECT_NE(cache.MakeKey(cache.OpenNamespace(), base).bytes, key.bytes);
}

TEST(ResponseCacheTest, FindsWhatWasInsertedAndConfirmsOnTheWholeKey) {
  ResponseCache cache(1 << 20, &Colliding);
  const uint64_t space = cache.OpenNamespace();
  const ResponseCache::Key one =
      cache.MakeKey(space, Request({{"x", DataType::kInt32, {1}, Int32s({1})}}));
  const ResponseCache::Key two =
      cache.MakeKey(space, Request({{"x", DataType::kInt32, {1}, Int32s({2})}}));
  const ResponseCache::Key three =
      cache.MakeKey(space, Request({{"x", DataType::kInt32, {1}, Int32s({3})}}));
  ASSERT_EQ(one.hash, two.hash);  // the colliding hasher
  EXPECT_FALSE(cache.Find(one));
  EXPECT_TRUE(cache.Insert(one, Answer("one").views()));
  EXPECT_TRUE(cache.Insert(two, Answer("two").views()));
  EXPECT_EQ(Read(cache.Find(one)), "one");
  EXPECT_EQ(Read(cache.Find(two)), "two");
  EXPECT_FALSE(cache.Find(three));  // same hash, another request: no answer
  // A second answer for a key already there (two identical requests that both missed) is not kept.
  EXPECT_FALSE(cache.Insert(one, Answer("again").views()));
  EXPECT_EQ(Read(cache.Find(one)), "one");
  const ResponseCacheStats stats = cache.Stats();
  EXPECT_EQ(stats.entries, 2u);
  EXPECT_EQ(stats.insertions, 2u);
  EXPECT_EQ(stats.bytes, cache.segment_bytes());                          // one segment mapped
  EXPECT_GT(stats.entry_bytes, one.bytes.size() + two.bytes.size() + 6);  // keys and outputs count
}

TEST(ResponseCacheTest, StaysWithinItsBoundOldestSegmentsOutFirst) {
  Recorder recorder;
  const size_t page = cache_page();
  ResponseCache cache(16 * page, nullptr, &recorder);  // sixteen one-page segments
  ASSERT_EQ(cache.segment_bytes(), page);
  const uint64_t space = cache.OpenNamespace();
  auto key = [&](int32_t i) {
    return cache.MakeKey(space, Request({{"x", DataType::kInt32, {1}, Int32s({i})}}));
  };
  const Answer answer(std::string(page / 4, 'a'));  // three entries a page
  for (int32_t i = 0; i < 200; ++i) ASSERT_TRUE(cache.Insert(key(i), answer.views()));
  for (const ResponseCacheStats& seen : recorder.seen) EXPECT_LE(seen.bytes, seen.byte_limit);
  const ResponseCacheStats stats = cache.Stats();
  EXPECT_EQ(stats.bytes, 16 * page);
  EXPECT_GE(stats.entries, 15u * 3);
  EXPECT_LE(stats.entries, 16u * 3);
  EXPECT_EQ(stats.evictions, 200 - stats.entries);
  EXPECT_LE(stats.entry_bytes, stats.bytes);
  EXPECT_EQ(Read(cache.Find(key(199))), answer.bytes);  // the newest are there
  EXPECT_EQ(Read(cache.Find(key(160))), answer.bytes);
  EXPECT_FALSE(cache.Find(key(0)));  // the oldest went first
  EXPECT_FALSE(cache.Find(key(100)));
}

TEST(ResponseCacheTest, AnAnswerUsedSinceItWasWrittenGetsASecondChance) {
  const size_t page = cache_page();
  ResponseCache cache(4 * page);  // four one-page segments
  const uint64_t space = cache.OpenNamespace();
  auto key = [&](int32_t i) {
    return cache.MakeKey(space, Request({{"x", DataType::kInt32, {1}, Int32s({i})}}));
  };
  const Answer answer(std::string(page / 4, 'a'));
  for (int32_t i = 0; i < 3; ++i)
    ASSERT_TRUE(cache.Insert(key(i), answer.views()));  // the first segment
  ASSERT_TRUE(cache.Find(key(1)));  // used: 1 survives its segment's eviction, 0 and 2 do not
  for (int32_t i = 3; i < 13; ++i) ASSERT_TRUE(cache.Insert(key(i), answer.views()));
  EXPECT_FALSE(cache.Find(key(0)));
  EXPECT_FALSE(cache.Find(key(2)));
  EXPECT_EQ(Read(cache.Find(key(1))), answer.bytes);
  EXPECT_LE(cache.Stats().bytes, 4 * page);
}

TEST(ResponseCacheTest, AnEntryLargerThanASegmentGetsItsOwnAndOneLargerThanTheCacheIsNotKept) {
  const size_t page = cache_page();
  Recorder recorder;
  ResponseCache cache(16 * page, nullptr, &recorder);
  const uint64_t space = cache.OpenNamespace();
  auto key = [&](int32_t i) {
    return cache.MakeKey(space, Request({{"x", DataType::kInt32, {1}, Int32s({i})}}));
  };
  const Answer large(std::string(3 * page, 'l'));
  ASSERT_TRUE(cache.Insert(key(1), large.views()));
  EXPECT_EQ(Read(cache.Find(key(1))), large.bytes);
  EXPECT_EQ(cache.Stats().bytes, 4 * page);  // rounded up to pages
  EXPECT_FALSE(cache.Insert(key(2), Answer(std::string(16 * page, 'h')).views()));
  EXPECT_EQ(cache.Stats().too_large, 1u);
  EXPECT_EQ(recorder.seen.back().too_large, 1u);
  EXPECT_EQ(Read(cache.Find(key(1))), large.bytes);  // nothing was evicted for it

  ResponseCache tiny(page - 1);  // smaller than a page: holds nothing, says so
  EXPECT_FALSE(tiny.Insert(
      tiny.MakeKey(tiny.OpenNamespace(), Request({{"x", DataType::kInt32, {1}, Int32s({1})}})),
      Answer("a").views()));
  EXPECT_EQ(tiny.Stats().too_large, 1u);
}

TEST(ResponseCacheTest, AnEvictedAnswerStaysWholeForTheReaderThatHasIt) {
  const size_t page = cache_page();
  ResponseCache cache(2 * page);
  const uint64_t space = cache.OpenNamespace();
  auto key = [&](int32_t i) {
    return cache.MakeKey(space, Request({{"x", DataType::kInt32, {1}, Int32s({i})}}));
  };
  const Answer first(std::string(page / 2, 'a'));
  ASSERT_TRUE(cache.Insert(key(0), first.views()));
  {
    ResponseCache::Hit held = cache.Find(key(0));
    ASSERT_TRUE(held);
    // Enough to evict the held entry's segment twice over (it was used: its second chance ends
    // when the newest segment has no room for it).
    for (int32_t i = 1; i < 20; ++i)
      cache.Insert(key(i), Answer(std::string(page / 2, 'b')).views());
    EXPECT_FALSE(cache.Find(key(0)));
    EXPECT_EQ(Read(held), first.bytes);        // its segment stays mapped for it
    EXPECT_LE(cache.Stats().bytes, 2 * page);  // and still counts
  }
  EXPECT_LE(cache.Stats().bytes, 2 * page);
}

// When the segments being read hold too much for a new one, the insertion fails and evicts
// nothing: a big answer or a few concurrent hits never empty the cache for nothing.
TEST(ResponseCacheTest, AnInsertionThatCannotMakeRoomEvictsNothing) {
  const size_t page = cache_page();
  Recorder recorder;
  ResponseCache cache(2 * page, nullptr, &recorder);  // two one-page segments
  const uint64_t space = cache.OpenNamespace();
  auto key = [&](int32_t i) {
    return cache.MakeKey(space, Request({{"x", DataType::kInt32, {1}, Int32s({i})}}));
  };
  const Answer answer(std::string(page * 2 / 3, 'a'));  // one a page
  ASSERT_TRUE(cache.Insert(key(0), answer.views()));
  ASSERT_TRUE(cache.Insert(key(1), answer.views()));
  {
    ResponseCache::Hit first = cache.Find(key(0));
    ResponseCache::Hit second = cache.Find(key(1));
    ASSERT_TRUE(first && second);
    EXPECT_FALSE(cache.Insert(key(2), answer.views()));
    EXPECT_EQ(cache.Stats().entries, 2u);
    EXPECT_EQ(cache.Stats().evictions, 0u);
    EXPECT_EQ(recorder.seen.back().entries, 2u);
  }
  EXPECT_EQ(Read(cache.Find(key(0))), answer.bytes);
  EXPECT_EQ(Read(cache.Find(key(1))), answer.bytes);
  // Nothing read any more: the oldest goes (1 was used after 0: 0 is the older segment).
  ASSERT_TRUE(cache.Insert(key(2), answer.views()));
  EXPECT_LE(cache.Stats().bytes, 2 * page);
  EXPECT_EQ(Read(cache.Find(key(2))), answer.bytes);
}

TEST(ResponseCacheTest, ClosingANamespaceDropsItsEntriesOnly) {
  Recorder recorder;
  const size_t page = cache_page();
  ResponseCache cache(16 * page, nullptr, &recorder);
  const uint64_t old_version = cache.OpenNamespace();
  const uint64_t other_model = cache.OpenNamespace();
  const InferRequest request = Request({{"x", DataType::kInt32, {1}, Int32s({1})}});
  const ResponseCache::Key in_old = cache.MakeKey(old_version, request);
  const ResponseCache::Key in_other = cache.MakeKey(other_model, request);
  // Six of the old version's entries fill two segments (three a page); its seventh and the other
  // model's one share the second.
  const Answer answer(std::string(page / 4, 'a'));
  for (int32_t i = 0; i < 6; ++i) {
    ASSERT_TRUE(cache.Insert(
        cache.MakeKey(old_version, Request({{"x", DataType::kInt32, {1}, Int32s({100 + i})}})),
        answer.views()));
  }
  ASSERT_TRUE(cache.Insert(in_old, Answer("old").views()));
  ASSERT_TRUE(cache.Insert(in_other, Answer("other").views()));
  EXPECT_EQ(cache.Stats().bytes, 2 * page);
  cache.CloseNamespace(old_version);
  EXPECT_FALSE(cache.Find(in_old));
  EXPECT_EQ(Read(cache.Find(in_other)), "other");
  EXPECT_EQ(cache.Stats().entries, 1u);
  EXPECT_EQ(cache.Stats().bytes, page);  // the segment left without live entries is unmapped
  EXPECT_EQ(recorder.seen.back().entries, 1u);
  EXPECT_EQ(cache.Stats().evictions, 0u);  // dropped with its version, not evicted for room
  // A request of the closed version that finishes later: its answer is not kept.
  EXPECT_FALSE(cache.Insert(in_old, Answer("late").views()));
  EXPECT_FALSE(cache.Find(in_old));
  cache.CloseNamespace(old_version);  // idempotent
  EXPECT_EQ(cache.Stats().entries, 1u);
}

TEST(ResponseCacheTest, RecordingSinkViewsWhatWasWrittenAndAHitReplaysIt) {
  TensorSink first;
  RecordingSink recording(&first);
  const Shape shape = {2};
  const std::string name_a = "a", name_b = "b";
  StatusOr<char*> a = recording.Allocate({name_a, DataType::kInt32, shape, 8, MemoryType::kCpu});
  ASSERT_TRUE(a.ok());
  std::memcpy(*a, Int32s({7, 8}).data(), 8);
  StatusOr<char*> b = recording.Allocate({name_b, DataType::kInt8, {3}, 3, MemoryType::kCpu});
  ASSERT_TRUE(b.ok());
  std::memcpy(*b, "xyz", 3);
  ResponseCache cache(1 << 20);
  const ResponseCache::Key key =
      cache.MakeKey(cache.OpenNamespace(), Request({{"x", DataType::kInt32, {1}, Int32s({1})}}));
  ASSERT_TRUE(cache.Insert(key, recording.Outputs()));

  ResponseCache::Hit hit = cache.Find(key);
  ASSERT_TRUE(hit);
  TensorSink replay;
  ASSERT_TRUE(hit.WriteTo(&replay).ok());
  ASSERT_EQ(replay.outputs().size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(replay.outputs()[i].name, first.outputs()[i].name);
    EXPECT_EQ(replay.outputs()[i].dtype, first.outputs()[i].dtype);
    EXPECT_EQ(replay.outputs()[i].shape, first.outputs()[i].shape);
    EXPECT_EQ(replay.outputs()[i].data, first.outputs()[i].data);
  }
  EXPECT_EQ(replay.outputs()[1].data, "xyz");

  // A sink that refuses (a shared-memory slice too small): its reason comes back as it is.
  class Refusing final : public OutputSink {
   public:
    StatusOr<char*> Allocate(const OutputDescription& output) override {
      return absl::InvalidArgumentError("output '" + output.name + "' does not fit");
    }
  } refusing;
  Status refused = hit.WriteTo(&refusing);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("output 'a' does not fit"));
  RecordingSink refused_recording(&refusing);
  EXPECT_FALSE(
      refused_recording.Allocate({name_a, DataType::kInt32, shape, 8, MemoryType::kCpu}).ok());
  EXPECT_TRUE(refused_recording.Outputs().empty());
}

// Readers, writers and a closing namespace at once (run under ThreadSanitizer in CI's sanitizer
// build): the bound holds throughout and every answer found is the one inserted for its key.
TEST(ResponseCacheTest, ConcurrentUseKeepsAnswersWithTheirKeys) {
  const size_t page = cache_page();
  ResponseCache cache(
      4 * page, &Colliding);  // small: segments are evicted, compacted and reused all the time
  const uint64_t space = cache.OpenNamespace();
  const uint64_t closing = cache.OpenNamespace();
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int32_t i = 0; i < 300; ++i) {
        const int32_t value = (i * 7 + t) % 50;
        const ResponseCache::Key key = cache.MakeKey(
            t == 3 ? closing : space, Request({{"x", DataType::kInt32, {1}, Int32s({value})}}));
        const std::string want = std::to_string(value) + std::string(page / 8, 'v');
        if (ResponseCache::Hit hit = cache.Find(key)) {
          if (Read(hit) != want) ++wrong;
        } else {
          cache.Insert(key, Answer(want).views());
        }
        if (t == 3 && i == 150) cache.CloseNamespace(closing);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_LE(cache.Stats().bytes, 4 * page);
  EXPECT_GT(cache.Stats().evictions, 0u);
}

}  // namespace
}  // namespace sluice
