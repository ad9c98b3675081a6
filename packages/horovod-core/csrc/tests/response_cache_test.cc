// The response cache: hits, misses, invalidation, LRU eviction, and bit positions that agree on
// every rank given the same sequence of operations.
#include <gtest/gtest.h>

#include "engine/response_cache.h"

namespace horovod {
namespace {

Request Allreduce(const std::string& name, int64_t elements = 4) {
  Request r;
  r.type = OpType::ALLREDUCE;
  r.name = name;
  r.shape = {elements};
  return r;
}

Response ResponseFor(const Request& r) {
  Response response;
  response.type = r.type;
  response.names = {r.name};
  response.dtype = r.dtype;
  response.tensor_sizes = {NumElements(r.shape)};
  return response;
}

void Put(ResponseCache& cache, const Request& r) { cache.Put(ResponseFor(r), r); }

uint32_t BitOf(const ResponseCache& cache, const Request& r) {
  uint32_t bit = 12345;
  EXPECT_EQ(cache.Find(r, &bit), ResponseCache::Lookup::HIT) << r.name;
  return bit;
}

TEST(ResponseCache, MissHitAndInvalid) {
  ResponseCache cache(4);
  uint32_t bit = 99;
  EXPECT_EQ(cache.Find(Allreduce("a"), &bit), ResponseCache::Lookup::MISS);
  EXPECT_EQ(bit, 99u);
  Put(cache, Allreduce("a"));
  Put(cache, Allreduce("b"));
  EXPECT_EQ(cache.Find(Allreduce("a"), &bit), ResponseCache::Lookup::HIT);
  EXPECT_EQ(bit, 0u);
  EXPECT_EQ(cache.response(bit).names, std::vector<std::string>{"a"});
  EXPECT_EQ(cache.Find(Allreduce("b"), &bit), ResponseCache::Lookup::HIT);
  EXPECT_EQ(bit, 1u);
  // The same name with other parameters: INVALID, pointing at the cached entry.
  Request changed = Allreduce("b", 5);
  EXPECT_EQ(cache.Find(changed, &bit), ResponseCache::Lookup::INVALID);
  EXPECT_EQ(bit, 1u);
  changed = Allreduce("b");
  changed.reduce_op = ReduceOp::MAX;
  EXPECT_EQ(cache.Find(changed, &bit), ResponseCache::Lookup::INVALID);
  EXPECT_EQ(cache.num_entries(), 2u);
  EXPECT_EQ(cache.num_bits(), 2u);
}

TEST(ResponseCache, EntryWithoutOwnRequestIsInvalid) {
  // A joined rank caches a response it did not submit: its own later request cannot hit it.
  ResponseCache cache(4);
  cache.Put(ResponseFor(Allreduce("a")), std::nullopt);
  uint32_t bit = 0;
  EXPECT_EQ(cache.Find(Allreduce("a"), &bit), ResponseCache::Lookup::INVALID);
}

TEST(ResponseCache, EraseFreesTheLowestBitFirst) {
  ResponseCache cache(8);
  for (const char* name : {"a", "b", "c", "d"}) Put(cache, Allreduce(name));
  cache.Erase(2);
  cache.Erase(1);
  EXPECT_FALSE(cache.occupied(1));
  EXPECT_FALSE(cache.occupied(2));
  EXPECT_TRUE(cache.occupied(3));
  uint32_t bit = 0;
  EXPECT_EQ(cache.Find(Allreduce("b"), &bit), ResponseCache::Lookup::MISS);
  Put(cache, Allreduce("e"));
  Put(cache, Allreduce("f"));
  EXPECT_EQ(BitOf(cache, Allreduce("e")), 1u);
  EXPECT_EQ(BitOf(cache, Allreduce("f")), 2u);
  EXPECT_EQ(cache.num_bits(), 4u);
  cache.Erase(1);
  cache.Erase(1);  // erasing a free bit is harmless
  EXPECT_EQ(cache.num_entries(), 3u);
}

TEST(ResponseCache, PutOfACachedNameReplacesIt) {
  ResponseCache cache(4);
  Put(cache, Allreduce("a"));
  Put(cache, Allreduce("b"));
  Put(cache, Allreduce("a", 9));  // renegotiated with a new shape
  EXPECT_EQ(cache.num_entries(), 2u);
  uint32_t bit = 0;
  EXPECT_EQ(cache.Find(Allreduce("a", 9), &bit), ResponseCache::Lookup::HIT);
  EXPECT_EQ(bit, 0u);  // its old bit was freed and is the lowest free one
  EXPECT_EQ(cache.response(bit).tensor_sizes, std::vector<int64_t>{9});
  EXPECT_EQ(cache.Find(Allreduce("a", 4), &bit), ResponseCache::Lookup::INVALID);
}

TEST(ResponseCache, FullCacheEvictsTheLeastRecentlyUsed) {
  ResponseCache cache(3);
  for (const char* name : {"a", "b", "c"}) Put(cache, Allreduce(name));
  cache.Touch(BitOf(cache, Allreduce("a")));  // b is now the least recently used
  Put(cache, Allreduce("d"));
  uint32_t bit = 0;
  EXPECT_EQ(cache.Find(Allreduce("b"), &bit), ResponseCache::Lookup::MISS);
  EXPECT_EQ(BitOf(cache, Allreduce("d")), 1u);  // took b's position
  EXPECT_EQ(cache.num_bits(), 3u);
  EXPECT_EQ(cache.num_entries(), 3u);
  Put(cache, Allreduce("e"));  // c is the oldest now
  EXPECT_EQ(cache.Find(Allreduce("c"), &bit), ResponseCache::Lookup::MISS);
  EXPECT_EQ(BitOf(cache, Allreduce("e")), 2u);
  EXPECT_EQ(BitOf(cache, Allreduce("a")), 0u);
}

TEST(ResponseCache, CapacityZeroCachesNothing) {
  ResponseCache cache(0);
  Put(cache, Allreduce("a"));
  uint32_t bit = 0;
  EXPECT_EQ(cache.Find(Allreduce("a"), &bit), ResponseCache::Lookup::MISS);
  EXPECT_EQ(cache.num_bits(), 0u);
}

// Ranks apply the same Put/Touch/Erase sequence, each with its own requests (a rank that did not
// submit a tensor caches it without one): every name must sit at the same bit everywhere.
TEST(ResponseCache, BitPositionsAgreeAcrossRanks) {
  const int kRanks = 3;
  std::vector<ResponseCache> caches(kRanks, ResponseCache(5));
  uint64_t state = 12345;
  auto next = [&state](uint64_t n) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (state >> 33) % n;
  };
  for (int step = 0; step < 500; ++step) {
    const std::string name = "t" + std::to_string(next(9));
    const uint64_t action = next(3);
    for (int rank = 0; rank < kRanks; ++rank) {
      ResponseCache& cache = caches[rank];
      Request own = Allreduce(name, 1 + static_cast<int64_t>(name.back()));
      if (action == 0) {
        cache.Put(ResponseFor(own), rank == step % kRanks ? std::optional<Request>() : std::optional<Request>(own));
      } else {
        uint32_t bit = 0;
        if (cache.Find(own, &bit) != ResponseCache::Lookup::MISS) {
          if (action == 1) cache.Touch(bit); else cache.Erase(bit);
        }
      }
    }
    for (int rank = 1; rank < kRanks; ++rank) {
      ASSERT_EQ(caches[rank].num_bits(), caches[0].num_bits()) << "step " << step;
      ASSERT_EQ(caches[rank].num_entries(), caches[0].num_entries()) << "step " << step;
      for (uint32_t bit = 0; bit < caches[0].num_bits(); ++bit) {
        ASSERT_EQ(caches[rank].occupied(bit), caches[0].occupied(bit)) << "step " << step << " bit " << bit;
        if (caches[0].occupied(bit)) {
          ASSERT_EQ(caches[rank].response(bit).names, caches[0].response(bit).names) << "step " << step;
        }
      }
    }
  }
  EXPECT_LE(caches[0].num_bits(), 5u);
  EXPECT_EQ(caches[0].num_bits(), 5u);  // the sequence fills the cache
}

}  // namespace
}  // namespace horovod
