// Durable token high-water marks: reopen, block reservation, and every way a
// data dir can be damaged being a clear error rather than a silent reset.
#include "shardlock/lease/server/internal/token_store.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "shardlock/lease/server/server.h"

namespace shardlock::lease::internal {
namespace {

namespace fs = std::filesystem;

class TokenStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/shardlock-token-store-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    dir_ = root_ + "/data";
  }
  void TearDown() override { fs::remove_all(root_); }

  std::error_code open(std::unique_ptr<TokenStore>& store) {
    detail_.clear();
    return TokenStore::open(dir_, store, detail_);
  }

  static std::string read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
  }

  std::string root_;
  std::string dir_;
  std::string detail_;
};

TEST_F(TokenStoreTest, FreshDirStartsAtZeroAndReopensAboveEveryIssuedToken) {
  std::uint64_t issued = 0;
  {
    std::unique_ptr<TokenStore> store;
    ASSERT_FALSE(open(store)) << detail_;
    EXPECT_EQ(store->floor(), 0u);
    ASSERT_FALSE(store->initialize(4, TokenMode::kPlain, 8, 8, 1000, detail_)) << detail_;
    ShardTokens tokens(store.get(), 2, 0, 8, 8);
    for (int i = 0; i < 21; ++i) issued = tokens.next(detail_);
    EXPECT_EQ(issued, 21u);
  }
  std::unique_ptr<TokenStore> store;
  ASSERT_FALSE(open(store)) << detail_;
  EXPECT_GE(store->floor(), issued);
  EXPECT_LE(store->floor(), issued + 8);  // at most one unused block is skipped
}

TEST_F(TokenStoreTest, ShardCountMayChangeTokensStillRise) {
  {
    std::unique_ptr<TokenStore> store;
    ASSERT_FALSE(open(store));
    ASSERT_FALSE(store->initialize(8, TokenMode::kPlain, 100, 100, 1000, detail_));
    ASSERT_FALSE(store->reserve(7, 5000, 5000, detail_));
  }
  std::unique_ptr<TokenStore> store;
  ASSERT_FALSE(open(store)) << detail_;
  EXPECT_EQ(store->floor(), 5000u);  // the largest mark of any shard
  ASSERT_FALSE(store->initialize(2, TokenMode::kPlain, 5100, 5100, 1000, detail_));
  store.reset();
  ASSERT_FALSE(open(store)) << detail_;
  EXPECT_EQ(store->floor(), 5100u);
}

TEST_F(TokenStoreTest, LeaseBoundIsRemembered) {
  {
    std::unique_ptr<TokenStore> store;
    ASSERT_FALSE(open(store));
    EXPECT_EQ(store->previous_lease_bound_ms(), 0u);
    ASSERT_FALSE(store->initialize(2, TokenMode::kPlain, 10, 10, 120'000, detail_));
  }
  {
    std::unique_ptr<TokenStore> store;
    ASSERT_FALSE(open(store));
    EXPECT_EQ(store->previous_lease_bound_ms(), 120'000u);
    ASSERT_FALSE(store->initialize(2, TokenMode::kPlain, 20, 20, 120'000, detail_));
    ASSERT_FALSE(store->record_lease_bound(500, detail_));
  }
  std::unique_ptr<TokenStore> store;
  ASSERT_FALSE(open(store));
  EXPECT_EQ(store->previous_lease_bound_ms(), 500u);
  EXPECT_EQ(store->floor(), 20u);
}

TEST_F(TokenStoreTest, SecondOwnerIsRefused) {
  std::unique_ptr<TokenStore> first;
  ASSERT_FALSE(open(first));
  std::unique_ptr<TokenStore> second;
  EXPECT_EQ(open(second), make_error_code(ServerError::kDataDirLocked));
  EXPECT_NE(detail_.find("in use"), std::string::npos) << detail_;
  first.reset();
  EXPECT_FALSE(open(second));
}

TEST_F(TokenStoreTest, CorruptFilesAreStartUpErrors) {
  {
    std::unique_ptr<TokenStore> store;
    ASSERT_FALSE(open(store));
    ASSERT_FALSE(store->initialize(3, TokenMode::kPlain, 10, 10, 1000, detail_));
  }
  const std::string shard1 = dir_ + "/shard-00001.hwm";
  const std::string original = read_bytes(shard1);
  auto write = [&](const std::string& path, const std::string& bytes) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  };
  std::unique_ptr<TokenStore> store;

  std::string flipped = original;
  flipped[17] = static_cast<char>(flipped[17] ^ 0x40);  // the mark itself
  write(shard1, flipped);
  EXPECT_EQ(open(store), make_error_code(ServerError::kDataDirCorrupt));
  EXPECT_NE(detail_.find("shard-00001.hwm"), std::string::npos) << detail_;
  EXPECT_NE(detail_.find("checksum"), std::string::npos) << detail_;

  write(shard1, original.substr(0, 20));
  EXPECT_EQ(open(store), make_error_code(ServerError::kDataDirCorrupt));
  EXPECT_NE(detail_.find("size 20"), std::string::npos) << detail_;

  write(shard1, "");
  EXPECT_EQ(open(store), make_error_code(ServerError::kDataDirCorrupt));

  fs::remove(shard1);
  EXPECT_EQ(open(store), make_error_code(ServerError::kDataDirCorrupt));
  EXPECT_NE(detail_.find("missing shard-00001.hwm"), std::string::npos) << detail_;

  write(shard1, original);
  write(dir_ + "/meta", "garbage-garbage-garbage-garbage!");
  EXPECT_EQ(open(store), make_error_code(ServerError::kDataDirCorrupt));
  EXPECT_NE(detail_.find("meta"), std::string::npos) << detail_;

  // Without meta a damaged shard file is still refused.
  fs::remove(dir_ + "/meta");
  write(shard1, flipped);
  EXPECT_EQ(open(store), make_error_code(ServerError::kDataDirCorrupt));
  EXPECT_NE(detail_.find("shard-00001.hwm"), std::string::npos) << detail_;
}

// A crash during the very first start, after the shard files but before
// meta: meta is written before any token is issued and never removed, so
// no token exists yet. The dir opens, tokens start above the marks, and the
// next initialize completes it.
TEST_F(TokenStoreTest, CrashBeforeTheFirstMetaIsNotCorruption) {
  {
    std::unique_ptr<TokenStore> store;
    ASSERT_FALSE(open(store));
    ASSERT_FALSE(store->initialize(3, TokenMode::kPlain, 10, 10, 1000, detail_));
  }
  // The state such a crash leaves: shard files, meta only as a temp file.
  fs::rename(dir_ + "/meta", dir_ + "/meta.tmp");
  fs::remove(dir_ + "/shard-00002.hwm");
  {
    std::unique_ptr<TokenStore> store;
    ASSERT_FALSE(open(store)) << detail_;
    EXPECT_EQ(store->floor(), 10u);
    EXPECT_EQ(store->previous_lease_bound_ms(), 0u);
    ASSERT_FALSE(store->initialize(3, TokenMode::kPlain, 20, 20, 1000, detail_)) << detail_;
  }
  std::unique_ptr<TokenStore> store;
  ASSERT_FALSE(open(store)) << detail_;
  EXPECT_EQ(store->floor(), 20u);
  EXPECT_TRUE(fs::exists(dir_ + "/meta"));
}

TEST_F(TokenStoreTest, LeftoverTempFilesAreIgnoredAndRemoved) {
  {
    std::unique_ptr<TokenStore> store;
    ASSERT_FALSE(open(store));
    ASSERT_FALSE(store->initialize(1, TokenMode::kPlain, 10, 10, 1000, detail_));
  }
  std::ofstream(dir_ + "/shard-00000.hwm.tmp") << "half a write";
  std::unique_ptr<TokenStore> store;
  ASSERT_FALSE(open(store)) << detail_;
  EXPECT_EQ(store->floor(), 10u);
  EXPECT_FALSE(fs::exists(dir_ + "/shard-00000.hwm.tmp"));
}

TEST_F(TokenStoreTest, UnusableDirIsAnError) {
  std::ofstream(dir_) << "a file, not a directory";
  std::unique_ptr<TokenStore> store;
  EXPECT_TRUE(open(store));
  EXPECT_NE(detail_.find(dir_), std::string::npos) << detail_;

  dir_ = root_ + "/missing-parent/data";
  EXPECT_TRUE(open(store));
  EXPECT_NE(detail_.find("cannot create data dir"), std::string::npos) << detail_;
}

TEST_F(TokenStoreTest, UnreadableFileIsAnError) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads files regardless of their mode";
  {
    std::unique_ptr<TokenStore> store;
    ASSERT_FALSE(open(store));
    ASSERT_FALSE(store->initialize(1, TokenMode::kPlain, 10, 10, 1000, detail_));
  }
  ASSERT_EQ(::chmod((dir_ + "/shard-00000.hwm").c_str(), 0), 0);
  std::unique_ptr<TokenStore> store;
  EXPECT_TRUE(open(store));
  EXPECT_NE(detail_.find("cannot open"), std::string::npos) << detail_;
}

// A cluster run's tokens are epoch << 32 | counter, far
// above its raw counter. The block reservation records the largest token its
// block can become, so a later run of either mode knows it.
TEST_F(TokenStoreTest, ComposedTokensAreRecordedAsTheTokenFloor) {
  std::uint64_t issued = 0;
  {
    std::unique_ptr<TokenStore> store;
    ASSERT_FALSE(open(store));
    EXPECT_EQ(store->token_floor(), 0u);
    EXPECT_FALSE(store->used_in_cluster_mode());
    ASSERT_FALSE(store->initialize(2, TokenMode::kCluster, 8, 0, 1000, detail_)) << detail_;
    ShardTokens tokens(store.get(), 1, 0, 0, 8, TokenMode::kCluster);
    tokens.begin_epoch(3);
    for (int i = 0; i < 5; ++i) {
      const std::uint64_t raw = tokens.next(detail_);
      ASSERT_NE(raw, 0u) << detail_;
      issued = (std::uint64_t{3} << 32) | (raw - tokens.epoch_base());
    }
    EXPECT_EQ(issued, (std::uint64_t{3} << 32) | 5);
    // A new epoch reserves a block of its own before its first token.
    tokens.begin_epoch(9);
    const std::uint64_t raw = tokens.next(detail_);
    ASSERT_NE(raw, 0u) << detail_;
    issued = (std::uint64_t{9} << 32) | (raw - tokens.epoch_base());
    EXPECT_EQ(issued, (std::uint64_t{9} << 32) | 1);
  }
  std::unique_ptr<TokenStore> store;
  ASSERT_FALSE(open(store)) << detail_;
  EXPECT_TRUE(store->used_in_cluster_mode());
  EXPECT_GE(store->token_floor(), issued);
  EXPECT_LE(store->token_floor(), issued + 8);  // at most one unused block
  EXPECT_LE(store->floor(), 24u);               // the raw counter stays small
  // A plain run's records keep the floor: never lowered by a later write.
  ASSERT_FALSE(store->initialize(2, TokenMode::kPlain, 30, 30, 1000, detail_));
  ASSERT_FALSE(store->reserve(0, 40, 40, detail_));
  const std::uint64_t floor = store->token_floor();
  store.reset();
  ASSERT_FALSE(open(store)) << detail_;
  EXPECT_EQ(store->token_floor(), floor);
  EXPECT_EQ(store->floor(), 40u);
}

// Files of format 1 (32 bytes, before the token ceiling existed) are plain
// runs' and still open: their ceiling is their mark.
TEST_F(TokenStoreTest, FormatOneShardFilesAreReadAsPlain) {
  {
    std::unique_ptr<TokenStore> store;
    ASSERT_FALSE(open(store));
    ASSERT_FALSE(store->initialize(1, TokenMode::kPlain, 10, 10, 1000, detail_));
  }
  std::string record(32, '\0');
  std::memcpy(record.data(), "SLTOKEN1", 8);
  const std::uint64_t mark = 777;
  for (int i = 0; i < 8; ++i) record[16 + i] = static_cast<char>(mark >> (8 * i));
  const std::uint64_t sum = XXH3_64bits(record.data(), 24);
  for (int i = 0; i < 8; ++i) record[24 + i] = static_cast<char>(sum >> (8 * i));
  std::ofstream(dir_ + "/shard-00000.hwm", std::ios::binary | std::ios::trunc) << record;
  std::unique_ptr<TokenStore> store;
  ASSERT_FALSE(open(store)) << detail_;
  EXPECT_EQ(store->floor(), 777u);
  EXPECT_EQ(store->token_floor(), 777u);
  EXPECT_FALSE(store->used_in_cluster_mode());
}

// A damaged mode or ceiling is refused like a damaged mark.
TEST_F(TokenStoreTest, ADamagedCeilingOrModeIsAStartUpError) {
  {
    std::unique_ptr<TokenStore> store;
    ASSERT_FALSE(open(store));
    ASSERT_FALSE(store->initialize(1, TokenMode::kCluster, 10, 99, 1000, detail_));
  }
  const std::string shard0 = dir_ + "/shard-00000.hwm";
  const std::string original = read_bytes(shard0);
  ASSERT_EQ(original.size(), 40u);
  for (const std::size_t offset : {std::size_t{12}, std::size_t{25}}) {  // mode, ceiling
    std::string damaged = original;
    damaged[offset] = static_cast<char>(damaged[offset] ^ 0x04);
    std::ofstream(shard0, std::ios::binary | std::ios::trunc) << damaged;
    std::unique_ptr<TokenStore> store;
    EXPECT_EQ(open(store), make_error_code(ServerError::kDataDirCorrupt)) << offset;
    EXPECT_NE(detail_.find("shard-00000.hwm"), std::string::npos) << detail_;
    EXPECT_NE(detail_.find("refusing to start"), std::string::npos) << detail_;
  }
}

TEST(ShardTokens, InMemoryCounterRises) {
  ShardTokens tokens;
  std::string detail;
  EXPECT_EQ(tokens.next(detail), 1u);
  EXPECT_EQ(tokens.next(detail), 2u);
  EXPECT_EQ(tokens.last(), 2u);
}

}  // namespace
}  // namespace shardlock::lease::internal
