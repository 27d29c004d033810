// maps_to_adopt(): the maps a node adopts after a read of etcd, with the
// ones its watch missed read back from the map key's history,
// without etcd: the history is a list of puts.
#include "map_history.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace shardlock::cluster {
namespace {

// The map key's puts, in revision order, and a reader over them that counts
// its calls and can forget everything below a compaction revision.
class History {
 public:
  RevisedMap put(std::int64_t revision, std::uint64_t epoch) {
    RevisedMap m{ClusterMap{epoch, {ClusterMember{"n1", "127.0.0.1:7001", 1, 9}}}, revision};
    puts_.push_back(m);
    return m;
  }
  void compact(std::int64_t revision) { compacted_below_ = revision; }

  ReadMapBefore reader() {
    return [this](std::int64_t revision) -> std::optional<RevisedMap> {
      ++reads_;
      // etcd's Range at revision - 1: refused when compacted.
      if (revision - 1 < compacted_below_) return std::nullopt;
      std::optional<RevisedMap> found;
      for (const RevisedMap& m : puts_) {
        if (m.mod_revision < revision) found = m;
      }
      return found;
    };
  }
  [[nodiscard]] int reads() const { return reads_; }

 private:
  std::vector<RevisedMap> puts_;
  std::int64_t compacted_below_ = 0;
  int reads_ = 0;
};

std::vector<std::uint64_t> epochs(const std::vector<RevisedMap>& maps) {
  std::vector<std::uint64_t> out;
  for (const RevisedMap& m : maps) out.push_back(m.map.epoch);
  return out;
}

TEST(MapHistoryTest, MapsTheWatchMissedAreReadBackAndAdoptedInOrder) {
  History h;
  h.put(10, 4);
  h.put(14, 5);
  h.put(15, 6);
  const RevisedMap published = h.put(20, 7);
  const auto maps = maps_to_adopt(4, {}, published, kMaxMapHistoryReads, h.reader());
  EXPECT_EQ(epochs(maps), (std::vector<std::uint64_t>{5, 6, 7}));
  EXPECT_EQ(maps.front().mod_revision, 14);
  EXPECT_EQ(h.reads(), 2);
}

TEST(MapHistoryTest, WatchedMapsAreUsedAndOnlyTheGapBetweenThemIsRead) {
  History h;
  h.put(10, 4);
  const RevisedMap five = h.put(14, 5);
  h.put(15, 6);
  const RevisedMap published = h.put(20, 7);
  // The watch delivered 5 (and a stale 4 and a duplicate of 7), not 6.
  const auto maps = maps_to_adopt(4, {RevisedMap{ClusterMap{4, {}}, 10}, five, published},
                                  published, kMaxMapHistoryReads, h.reader());
  EXPECT_EQ(epochs(maps), (std::vector<std::uint64_t>{5, 6, 7}));
  EXPECT_EQ(h.reads(), 1);
}

TEST(MapHistoryTest, NothingIsReadWithoutAGapOrOnAFirstMap) {
  History h;
  h.put(10, 4);
  const RevisedMap published = h.put(14, 5);
  EXPECT_EQ(epochs(maps_to_adopt(4, {}, published, kMaxMapHistoryReads, h.reader())),
            (std::vector<std::uint64_t>{5}));
  // A first map: whatever came before is no history of this node's.
  EXPECT_EQ(epochs(maps_to_adopt(0, {}, published, kMaxMapHistoryReads, h.reader())),
            (std::vector<std::uint64_t>{5}));
  EXPECT_EQ(h.reads(), 0);
}

// A node's first read after a start: the watch had delivered an older map
// (adopted first, as the node's first), so the maps after it are read back
// too, or the node would jump from it (simulation seed 108 on the release
// build: a restarted node adopted 4 and then 6).
TEST(MapHistoryTest, OnAFirstMapTheMapsAfterTheOldestWatchedOneAreReadBack) {
  History h;
  const RevisedMap four = h.put(10, 4);
  h.put(14, 5);
  const RevisedMap published = h.put(20, 6);
  EXPECT_EQ(epochs(maps_to_adopt(0, {four}, published, kMaxMapHistoryReads, h.reader())),
            (std::vector<std::uint64_t>{4, 5, 6}));
}

TEST(MapHistoryTest, AMapPutAgainAtTheSameEpochIsWalkedThrough) {
  History h;
  h.put(10, 4);
  h.put(12, 5);
  h.put(13, 5);  // the same epoch put again (a lost CAS answer retried)
  const RevisedMap published = h.put(20, 6);
  EXPECT_EQ(epochs(maps_to_adopt(4, {}, published, kMaxMapHistoryReads, h.reader())),
            (std::vector<std::uint64_t>{5, 6}));
}

TEST(MapHistoryTest, ACompactedHistoryLeavesTheGapForTheActivationToTreatAsMissing) {
  History h;
  h.put(10, 4);
  h.put(14, 5);
  h.put(15, 6);
  const RevisedMap published = h.put(20, 7);
  h.compact(15);  // 6 still readable, 5 not
  EXPECT_EQ(epochs(maps_to_adopt(4, {}, published, kMaxMapHistoryReads, h.reader())),
            (std::vector<std::uint64_t>{6, 7}));
}

TEST(MapHistoryTest, PublishedEpochsThatJumpedAreNotAGapToFill) {
  History h;
  h.put(10, 4);
  // The next map was put above every epoch its publisher had seen.
  const RevisedMap published = h.put(20, 9);
  EXPECT_EQ(epochs(maps_to_adopt(4, {}, published, kMaxMapHistoryReads, h.reader())),
            (std::vector<std::uint64_t>{9}));
  EXPECT_EQ(h.reads(), 1);
}

TEST(MapHistoryTest, TheReadsAreBounded) {
  History h;
  h.put(1, 1);
  for (std::int64_t e = 2; e <= 40; ++e) h.put(e, static_cast<std::uint64_t>(e));
  const RevisedMap published = h.put(41, 41);
  const auto maps = maps_to_adopt(1, {}, published, 3, h.reader());
  EXPECT_EQ(epochs(maps), (std::vector<std::uint64_t>{38, 39, 40, 41}));
  EXPECT_EQ(h.reads(), 3);
}

}  // namespace
}  // namespace shardlock::cluster
