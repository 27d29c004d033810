// Durable token high-water marks: reopen, block reservation, and every way a
// data dir can be damaged being a clear error rather than a silent reset.
#include "shardlock/lease/internal/token_store.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "shardlock/lease/server.h"

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
    ASSERT_FALSE(store->initialize(4, 8, 1000, detail_)) << detail_;
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
    ASSERT_FALSE(store->initialize(8, 100, 1000, detail_));
    ASSERT_FALSE(store->reserve(7, 5000, detail_));
  }
  std::unique_ptr<TokenStore> store;
  ASSERT_FALSE(open(store)) << detail_;
  EXPECT_EQ(store->floor(), 5000u);  // the largest mark of any shard
  ASSERT_FALSE(store->initialize(2, 5100, 1000, detail_));
  store.reset();
  ASSERT_FALSE(open(store)) << detail_;
  EXPECT_EQ(store->floor(), 5100u);
}

TEST_F(TokenStoreTest, LeaseBoundIsRemembered) {
  {
    std::unique_ptr<TokenStore> store;
    ASSERT_FALSE(open(store));
    EXPECT_EQ(store->previous_lease_bound_ms(), 0u);
    ASSERT_FALSE(store->initialize(2, 10, 120'000, detail_));
  }
  {
    std::unique_ptr<TokenStore> store;
    ASSERT_FALSE(open(store));
    EXPECT_EQ(store->previous_lease_bound_ms(), 120'000u);
    ASSERT_FALSE(store->initialize(2, 20, 120'000, detail_));
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
    ASSERT_FALSE(store->initialize(3, 10, 1000, detail_));
  }
  const std::string shard1 = dir_ + "/shard-00001.hwm";
  std::string original;
  {
    std::ifstream in(shard1, std::ios::binary);
    original.assign(std::istreambuf_iterator<char>(in), {});
  }
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
    ASSERT_FALSE(store->initialize(3, 10, 1000, detail_));
  }
  // The state such a crash leaves: shard files, meta only as a temp file.
  fs::rename(dir_ + "/meta", dir_ + "/meta.tmp");
  fs::remove(dir_ + "/shard-00002.hwm");
  {
    std::unique_ptr<TokenStore> store;
    ASSERT_FALSE(open(store)) << detail_;
    EXPECT_EQ(store->floor(), 10u);
    EXPECT_EQ(store->previous_lease_bound_ms(), 0u);
    ASSERT_FALSE(store->initialize(3, 20, 1000, detail_)) << detail_;
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
    ASSERT_FALSE(store->initialize(1, 10, 1000, detail_));
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
    ASSERT_FALSE(store->initialize(1, 10, 1000, detail_));
  }
  ASSERT_EQ(::chmod((dir_ + "/shard-00000.hwm").c_str(), 0), 0);
  std::unique_ptr<TokenStore> store;
  EXPECT_TRUE(open(store));
  EXPECT_NE(detail_.find("cannot open"), std::string::npos) << detail_;
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
