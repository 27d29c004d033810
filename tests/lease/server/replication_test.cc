// Primary-backup replication's pure part (server/internal/replication.h):
// the node-to-node codec and the two ends of a stream, driven with an
// injected clock and datagrams handed over (or lost) by hand.
#include "shardlock/lease/server/internal/replication.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace shardlock::lease::internal::replication {
namespace {

constexpr std::int64_t kMs = 1'000'000;

Entry grant(std::uint32_t bucket, std::string key, std::uint64_t token, std::uint64_t owner_lo = 7,
            std::uint64_t request_id = 100) {
  Entry e;
  e.kind = EntryKind::kGrant;
  e.bucket = bucket;
  e.key = std::move(key);
  e.owner = ClientId{owner_lo, 0xABCD};
  e.token = token;
  e.request_id = request_id;
  e.mode = LeaseMode::kExclusive;
  e.ttl_ms = 2000;
  return e;
}

Entry release(std::uint32_t bucket, std::string key, std::uint64_t token,
              std::uint64_t owner_lo = 7) {
  Entry e;
  e.kind = EntryKind::kRelease;
  e.bucket = bucket;
  e.key = std::move(key);
  e.owner = ClientId{owner_lo, 0xABCD};
  e.token = token;
  return e;
}

Entry marker(EntryKind kind, std::uint32_t bucket) {
  Entry e;
  e.kind = kind;
  e.bucket = bucket;
  return e;
}

std::vector<Entry> one_of_each() {
  Entry shared = grant(9, "orders/1", 0x500000001, 3, 41);
  shared.mode = LeaseMode::kShared;
  Entry permit = grant(65535, std::string(kMaxKeyLength, 'k'), 0x500000002, 4, 42);
  permit.mode = LeaseMode::kPermit;
  permit.permits = 3;
  permit.value = std::string(kMaxHolderValueLength, 'v');  // the longest holder value
  Entry leader = grant(9, "leader/db", 0x500000003, 5, 43);
  leader.value = "10.0.0.7:5432";
  return {marker(EntryKind::kResetBucket, 9),
          shared,
          permit,
          leader,
          release(9, "orders/1", 0x500000001, 3),
          marker(EntryKind::kBucketCaughtUp, 9)};
}

// Appends a snapshot of `bucket` holding one grant of `key`.
void snapshot_of(PrimaryStream& primary, std::uint32_t bucket, const std::string& key,
                 std::uint64_t token) {
  (void)primary.append(marker(EntryKind::kResetBucket, bucket));
  (void)primary.append(grant(bucket, key, token));
  (void)primary.append(marker(EntryKind::kBucketCaughtUp, bucket));
}

// Hands every datagram in `wire` to the backup (or skips those `lost`
// says), and every ack back to the primary, all at `now`.
void deliver(PrimaryStream& primary, BackupStream& backup,
             const std::vector<std::vector<std::uint8_t>>& wire, std::int64_t now,
             const std::vector<bool>& lost = {}) {
  for (std::size_t i = 0; i < wire.size(); ++i) {
    if (i < lost.size() && lost[i]) continue;
    ReplicateHeader header;
    std::vector<Entry> entries;
    ASSERT_TRUE(decode_replicate(wire[i], header, entries));
    const Ack ack = backup.on_replicate(header, entries, now);
    std::vector<std::uint8_t> bytes;
    encode_ack(ack, bytes);
    Ack decoded;
    ASSERT_TRUE(decode_ack(bytes, decoded));
    ASSERT_EQ(decoded, ack);
    primary.on_ack(decoded, now);
  }
}

TEST(ReplicationCodec, EveryEntryKindRoundTrips) {
  const std::vector<Entry> entries = one_of_each();
  const ReplicateHeader header{0x1234, 17, 5, 123456789, false, Addressing{1, 2, 3, 4}};
  std::vector<std::uint8_t> bytes;
  ASSERT_EQ(encode_replicate(header, entries, bytes), entries.size());
  ReplicateHeader h;
  std::vector<Entry> back;
  ASSERT_TRUE(decode_replicate(bytes, h, back));
  EXPECT_EQ(h, header);
  EXPECT_EQ(back, entries);

  const Ack ack{0x1234, 9, 123456789, 250, Addressing{4, 5, 6, 7}};
  encode_ack(ack, bytes);
  EXPECT_EQ(bytes.size(), kAckHeaderSize);
  Ack a;
  ASSERT_TRUE(decode_ack(bytes, a));
  EXPECT_EQ(a, ack);
}

// Version 1 datagrams named neither end; a node of this version refuses them
// rather than match them by address.
TEST(ReplicationCodec, AnUnaddressedVersionOneDatagramIsRefused) {
  std::vector<std::uint8_t> bytes;
  ASSERT_EQ(encode_replicate(ReplicateHeader{1, 1, 1, 0}, std::vector{grant(1, "k", 2)}, bytes),
            1U);
  bytes[4] = 1;  // the version byte
  ReplicateHeader h;
  std::vector<Entry> back;
  EXPECT_FALSE(decode_replicate(bytes, h, back));
  encode_ack(Ack{1, 1, 1, 1}, bytes);
  bytes[4] = 1;
  Ack a;
  EXPECT_FALSE(decode_ack(bytes, a));
}

// Version 2 datagrams named no receiver process (Addressing::
// receiver_incarnation), so a replayed stream opening reached a backup that
// had restarted since: a node of this version refuses them, in their own
// shape (8 bytes shorter, version 2) or with this version's, and never
// crashes on one (a rolling upgrade sends it them: docs/cluster.md,
// "Upgrades").
TEST(ReplicationCodec, AVersionTwoDatagramIsRefused) {
  constexpr std::size_t kVersionTwoReplicateHeader = 64;
  constexpr std::size_t kVersionTwoAck = 60;
  std::vector<std::uint8_t> bytes;
  ASSERT_EQ(encode_replicate(ReplicateHeader{1, 1, 1, 0, false, Addressing{1, 2, 3, 4}},
                             std::vector{grant(1, "k", 2)}, bytes),
            1U);
  std::vector<std::uint8_t> two = bytes;
  two.erase(two.begin() + kVersionTwoReplicateHeader, two.begin() + kReplicateHeaderSize);
  two[4] = 2;
  ReplicateHeader h;
  std::vector<Entry> back;
  EXPECT_FALSE(decode_replicate(two, h, back));
  EXPECT_TRUE(back.empty());
  bytes[4] = 2;
  EXPECT_FALSE(decode_replicate(bytes, h, back));
  // A version 2 heartbeat is shorter than this version's header.
  std::vector<std::uint8_t> heartbeat;
  ASSERT_EQ(encode_replicate(ReplicateHeader{1, 1, 1, 0}, {}, heartbeat), 0U);
  heartbeat.resize(kVersionTwoReplicateHeader);
  heartbeat[4] = 2;
  EXPECT_FALSE(decode_replicate(heartbeat, h, back));

  std::vector<std::uint8_t> ack;
  encode_ack(Ack{1, 1, 1, 1, Addressing{1, 2, 3, 4}}, ack);
  std::vector<std::uint8_t> ack_two(ack.begin(), ack.begin() + kVersionTwoAck);
  ack_two[4] = 2;
  Ack a;
  EXPECT_FALSE(decode_ack(ack_two, a));
  ack[4] = 2;
  EXPECT_FALSE(decode_ack(ack, a));
  // A version 2 REPLICATE that carries a version 2 ack (kFlagCarriesAck).
  std::vector<std::uint8_t> carrying = two;
  carrying[kHeaderFlagsOffset] |= kFlagCarriesAck;
  carrying.insert(carrying.end(), ack_two.begin(), ack_two.end());
  std::optional<Ack> carried;
  EXPECT_FALSE(decode_replicate(carrying, h, back, nullptr, &carried));
  EXPECT_FALSE(carried.has_value());
}

// Both processes ride in every datagram, each in its own 8 bytes after the
// node tags, so neither can be taken for the other.
TEST(ReplicationCodec, TheReceiversIncarnationTravelsInBothDirections) {
  std::vector<std::uint8_t> bytes;
  const Addressing addressing{0x11, 0x22, 0x33, 0x44};
  ASSERT_EQ(encode_replicate(ReplicateHeader{5, 1, 1, 0, false, addressing}, {}, bytes), 0U);
  ASSERT_EQ(bytes.size(), kReplicateHeaderSize);
  EXPECT_EQ(bytes[kReplicateHeaderSize - 8], 0x44);  // receiver_incarnation, last
  EXPECT_EQ(bytes[kReplicateHeaderSize - 16], 0x33);
  ReplicateHeader h;
  std::vector<Entry> back;
  ASSERT_TRUE(decode_replicate(bytes, h, back));
  EXPECT_EQ(h.addressing, addressing);
  encode_ack(Ack{5, 0, 0, 0, addressing, true}, bytes);
  ASSERT_EQ(bytes.size(), kAckHeaderSize);
  EXPECT_EQ(bytes[kAckHeaderSize - 8], 0x44);
  Ack a;
  ASSERT_TRUE(decode_ack(bytes, a));
  EXPECT_EQ(a.addressing, addressing);
  EXPECT_TRUE(a.refused);
  // Carried in a REPLICATE, the ack keeps its own.
  ASSERT_EQ(encode_replicate(ReplicateHeader{5, 1, 1, 0, false, addressing}, {}, bytes), 0U);
  const Addressing back_again{0x22, 0x11, 0x44, 0x33};
  ASSERT_TRUE(append_ack(bytes, Ack{9, 0, 0, 250, back_again}));
  std::optional<Ack> carried;
  ASSERT_TRUE(decode_replicate(bytes, h, back, nullptr, &carried));
  ASSERT_TRUE(carried.has_value());
  EXPECT_EQ(carried->addressing, back_again);
  EXPECT_EQ(h.addressing, addressing);
}

TEST(ReplicationCodec, EveryTruncationAndTrailingByteIsRejected) {
  const std::vector<Entry> entries = one_of_each();
  std::vector<std::uint8_t> bytes;
  ASSERT_EQ(encode_replicate(ReplicateHeader{1, 1, 1, 0}, entries, bytes), entries.size());
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    ReplicateHeader h;
    std::vector<Entry> back;
    EXPECT_FALSE(decode_replicate(std::span(bytes).first(n), h, back)) << n;
    EXPECT_TRUE(back.empty());
  }
  bytes.push_back(0);
  ReplicateHeader h;
  std::vector<Entry> back;
  EXPECT_FALSE(decode_replicate(bytes, h, back));

  std::vector<std::uint8_t> ack;
  encode_ack(Ack{1, 1, 1, 1}, ack);
  for (std::size_t n = 0; n < ack.size(); ++n) {
    Ack a;
    EXPECT_FALSE(decode_ack(std::span(ack).first(n), a)) << n;
  }
}

TEST(ReplicationCodec, ThePrimarysSettledFlagTravelsAndABackupRemembersItPerStream) {
  std::vector<std::uint8_t> bytes;
  ASSERT_EQ(
      encode_replicate(ReplicateHeader{7, 1, 1, 0, true}, std::vector{grant(1, "k", 2)}, bytes),
      1U);
  EXPECT_EQ(bytes[5], kFlagPrimarySettled);
  ReplicateHeader header;
  std::vector<Entry> entries;
  ASSERT_TRUE(decode_replicate(bytes, header, entries));
  EXPECT_TRUE(header.settled);
  // The backup: unsettled until a datagram of the stream says so, and a new
  // stream starts unsettled again (a restarted primary).
  BackupStream backup(StreamTiming{}, 0);
  (void)backup.on_replicate(ReplicateHeader{7, 1, 1, 0}, entries, 0);
  EXPECT_FALSE(backup.primary_settled());
  (void)backup.on_replicate(ReplicateHeader{7, 1, 2, 0, true}, {}, 0);
  EXPECT_TRUE(backup.primary_settled());
  (void)backup.on_replicate(ReplicateHeader{8, 1, 1, 0}, {}, 0);
  EXPECT_FALSE(backup.primary_settled());
  // The primary says it once its process is past its lock-delay.
  PrimaryStream primary(9, StreamTiming{});
  std::vector<std::vector<std::uint8_t>> wire;
  primary.poll(StreamTiming{}.heartbeat_ns, 1, wire, /*settled=*/true);
  ASSERT_EQ(wire.size(), 1u);
  ASSERT_TRUE(decode_replicate(wire[0], header, entries));
  EXPECT_TRUE(header.settled);
}

TEST(ReplicationCodec, AStreamAfterTheOneABackupStoppedPromisingIsFollowedWithNothingBefore) {
  // A backup that took some of a live primary's buckets over follows the
  // rest on a new stream: the old one is answered "nothing applied", with no
  // lease, so the primary starts a new stream (and its snapshots).
  BackupStream fresh(StreamTiming{}, 0, /*after_stream=*/5);
  const Ack old =
      fresh.on_replicate(ReplicateHeader{5, 1, 9, 100}, std::vector{grant(1, "k", 2)}, 1'000);
  EXPECT_EQ(old.applied, 0u);
  EXPECT_EQ(old.lease_ms, 0u);
  EXPECT_TRUE(fresh.holders(1, "k").empty());
  PrimaryStream primary(5, StreamTiming{});
  (void)primary.append(grant(1, "k", 2));
  std::vector<std::vector<std::uint8_t>> wire;
  primary.poll(0, 1, wire);
  primary.on_ack(Ack{5, 1, 0, 250}, 1);  // applied before
  primary.on_ack(Ack{5, 0, 1, 0}, 2);    // the fresh stream's answer
  EXPECT_TRUE(primary.resync_requested());
  const Ack next = fresh.on_replicate(ReplicateHeader{6, 1, 1, 200}, {}, 2'000);
  EXPECT_GT(next.lease_ms, 0u);
}

TEST(ReplicationCodec, ABackupRefusesAStreamItStoppedPromisingEvenWhenNothingOfItWasAcknowledged) {
  // The case above, but the primary has had no entry of the stream
  // acknowledged yet (the backup that retired it saw its first datagrams
  // after a gap, under load): "nothing applied" is then no news to it, so
  // the answer says outright that the stream is refused. Without that the
  // primary kept sending the old stream, every reply it held waited for
  // this backup for good, and the buckets it backs up there went without a
  // primary lease (e2e start-ups: "n2 does not grant: unreachable").
  BackupStream fresh(StreamTiming{}, 0, /*after_stream=*/5);
  const Ack refused =
      fresh.on_replicate(ReplicateHeader{5, 1, 9, 100}, std::vector{grant(1, "k", 2)}, 1'000);
  EXPECT_TRUE(refused.refused);
  EXPECT_EQ(refused.applied, 0u);
  EXPECT_EQ(refused.lease_ms, 0u);
  // It travels.
  std::vector<std::uint8_t> bytes;
  encode_ack(refused, bytes);
  Ack decoded;
  ASSERT_TRUE(decode_ack(bytes, decoded));
  EXPECT_EQ(decoded, refused);
  PrimaryStream primary(5, StreamTiming{});
  (void)primary.append(grant(1, "k", 2));
  std::vector<std::vector<std::uint8_t>> wire;
  primary.poll(0, 1, wire);
  primary.on_ack(Ack{5, 0, 0, 0}, 1);  // "nothing applied" alone: no news
  EXPECT_FALSE(primary.resync_requested());
  primary.on_ack(decoded, 200);
  EXPECT_TRUE(primary.resync_requested());
  // A stream the backup follows is never refused, nor is one of a frozen
  // backup (its promise ran out: it may have taken the buckets over, and
  // follows no new stream, so a restart would only repeat).
  BackupStream follows(StreamTiming{}, 0);
  EXPECT_FALSE(follows.on_replicate(ReplicateHeader{7, 1, 1, 0}, {}, 0).refused);
  follows.stop_promising();
  const std::int64_t later = 10 * static_cast<std::int64_t>(StreamTiming{}.lease_ms) * 1'000'000;
  ASSERT_TRUE(follows.promise_expired(later));
  EXPECT_FALSE(follows.on_replicate(ReplicateHeader{8, 1, 1, later}, {}, later).refused);
}

TEST(ReplicationFlow, ASnapshotOfManyBucketsGoesOutInBoundedBurstsWithinTheWindow) {
  // Markers for 20000 buckets: hundreds of datagrams. A poll sends at most
  // max_datagrams_per_poll of them, new entries stop at max_in_flight
  // unacknowledged, and a retransmission resends a bounded burst from the
  // oldest.
  StreamTiming timing;
  timing.max_datagrams_per_poll = 8;
  timing.max_in_flight = 1000;
  PrimaryStream primary(1, timing);
  for (std::uint32_t b = 0; b < 20000; ++b) {
    Entry e;
    e.kind = EntryKind::kResetBucket;
    e.bucket = b;
    (void)primary.append(e);
  }
  BackupStream backup(timing, 0);
  std::vector<std::vector<std::uint8_t>> wire;
  std::uint64_t highest_sent = 0;
  ReplicateHeader header;
  std::vector<Entry> entries;
  for (int poll = 0; poll < 4; ++poll) {
    wire.clear();
    primary.poll(poll, 1, wire);
    EXPECT_LE(wire.size(), 8u);
    for (const auto& d : wire) {
      ASSERT_TRUE(decode_replicate(d, header, entries));
      highest_sent = std::max<std::uint64_t>(highest_sent, header.first_seq + entries.size() - 1);
    }
  }
  // Nothing acknowledged: no datagram begins past the window (the last one
  // begun inside it is filled: a datagram holds about 70 markers).
  EXPECT_LT(highest_sent, 1000u + 100u);
  EXPECT_GT(highest_sent, 100u);
  // A retransmission starts over from the oldest, in a burst as bounded.
  wire.clear();
  primary.poll(timing.retransmit_ns + 10, 1, wire);
  ASSERT_FALSE(wire.empty());
  EXPECT_LE(wire.size(), 8u);
  ASSERT_TRUE(decode_replicate(wire[0], header, entries));
  EXPECT_EQ(header.first_seq, 1u);
  // Acknowledged as it goes, the whole snapshot gets through.
  std::int64_t now = timing.retransmit_ns + 10;
  for (int round = 0; round < 10000 && backup.applied() < 20000; ++round) {
    for (const auto& d : wire) {
      ASSERT_TRUE(decode_replicate(d, header, entries));
      primary.on_ack(backup.on_replicate(header, entries, now), now);
    }
    wire.clear();
    primary.poll(++now, 1, wire);
  }
  EXPECT_EQ(backup.applied(), 20000u);
}

TEST(ReplicationCodec, ACaughtUpMarkCarriesWhetherThePrimaryHadTheBucketActive) {
  Entry active;
  active.kind = EntryKind::kBucketCaughtUp;
  active.bucket = 9;
  active.owner_active = true;
  Entry reset;
  reset.kind = EntryKind::kResetBucket;
  reset.bucket = 9;
  Entry plain = active;
  plain.owner_active = false;
  std::vector<std::uint8_t> bytes;
  ASSERT_EQ(encode_replicate(ReplicateHeader{1, 1, 1, 0}, std::vector{reset, active}, bytes), 2U);
  ReplicateHeader header;
  std::vector<Entry> entries;
  ASSERT_TRUE(decode_replicate(bytes, header, entries));
  ASSERT_EQ(entries.size(), 2U);
  EXPECT_EQ(entries[1], active);
  BackupStream backup(StreamTiming{}, 0);
  (void)backup.on_replicate(header, entries, 0);
  EXPECT_TRUE(backup.owner_active(9));
  // A new snapshot of the bucket starts over, and says it again or not.
  ASSERT_EQ(encode_replicate(ReplicateHeader{1, 1, 3, 0}, std::vector{reset}, bytes), 1U);
  ASSERT_TRUE(decode_replicate(bytes, header, entries));
  (void)backup.on_replicate(header, entries, 0);
  EXPECT_FALSE(backup.owner_active(9));
  ASSERT_EQ(encode_replicate(ReplicateHeader{1, 1, 4, 0}, std::vector{plain}, bytes), 1U);
  ASSERT_TRUE(decode_replicate(bytes, header, entries));
  EXPECT_EQ(entries[0], plain);
  (void)backup.on_replicate(header, entries, 0);
  EXPECT_TRUE(backup.caught_up(9));
  EXPECT_FALSE(backup.owner_active(9));
}

// A primary that activates a bucket after its backup's
// snapshot says so with a mark of its own, so the backup (a learner waiting
// to be promoted) knows a takeover of it is complete. The mark counts only
// on a caught-up bucket: it never stands in for the snapshot's end.
TEST(ReplicationCodec, AnActivationMarkMakesACaughtUpBucketsOwnerActiveAndNothingElse) {
  std::vector<std::uint8_t> bytes;
  ReplicateHeader header;
  std::vector<Entry> entries;
  BackupStream backup(StreamTiming{}, 0);
  const auto apply = [&](std::uint64_t seq, const std::vector<Entry>& batch) {
    ASSERT_EQ(encode_replicate(ReplicateHeader{1, 1, seq, 0}, batch, bytes), batch.size());
    ASSERT_TRUE(decode_replicate(bytes, header, entries));
    ASSERT_EQ(entries, batch);  // the kind survives the wire
    (void)backup.on_replicate(header, entries, 0);
  };
  // Bucket 9 mid-snapshot, bucket 4 never seen: the mark is ignored.
  apply(1, {marker(EntryKind::kResetBucket, 9), marker(EntryKind::kBucketActivated, 9),
            marker(EntryKind::kBucketActivated, 4)});
  EXPECT_FALSE(backup.caught_up(9));
  EXPECT_FALSE(backup.owner_active(9));
  EXPECT_FALSE(backup.caught_up(4));
  // The snapshot ends with the primary not yet granting the bucket...
  apply(4, {marker(EntryKind::kBucketCaughtUp, 9)});
  EXPECT_TRUE(backup.caught_up(9));
  EXPECT_FALSE(backup.owner_active(9));
  // ...and then it activates it.
  apply(5, {marker(EntryKind::kBucketActivated, 9)});
  EXPECT_TRUE(backup.caught_up(9));
  EXPECT_TRUE(backup.owner_active(9));
  EXPECT_FALSE(backup.caught_up(4));
}

TEST(ReplicationCodec, MalformedFieldsAreRejected) {
  std::vector<std::uint8_t> good;
  ASSERT_EQ(encode_replicate(ReplicateHeader{1, 1, 1, 0}, std::vector{grant(1, "k", 2)}, good), 1U);
  const auto rejected = [](std::vector<std::uint8_t> bytes) {
    ReplicateHeader h;
    std::vector<Entry> e;
    return !decode_replicate(bytes, h, e);
  };
  auto bad = good;
  bad[0] ^= 1;  // magic
  EXPECT_TRUE(rejected(bad));
  bad = good;
  bad[4] = kReplicationVersion + 1;  // version
  EXPECT_TRUE(rejected(bad));
  bad = good;
  bad[5] = 4;  // an unknown flag (1 is kFlagAuthenticated, 2 kFlagPrimarySettled)
  EXPECT_TRUE(rejected(bad));
  bad = good;
  bad[6] = 0xFF;  // a count the bytes cannot hold (refused before any allocation)
  bad[7] = 0xFF;
  EXPECT_TRUE(rejected(bad));
  bad = good;
  bad[kReplicateHeaderSize] = 9;  // entry kind
  EXPECT_TRUE(rejected(bad));
  bad = good;
  bad[kReplicateHeaderSize + 5] = 0;  // key length 0
  bad[kReplicateHeaderSize + 6] = 0;
  EXPECT_TRUE(rejected(bad));
  bad = good;
  bad[bad.size() - 9] = 3;  // mode
  EXPECT_TRUE(rejected(bad));
  bad = good;
  for (std::size_t i = 8; i < 16; ++i) bad[i] = 0;  // stream 0
  EXPECT_TRUE(rejected(bad));

  // A key too long is never encoded, so it cannot stall a stream either.
  PrimaryStream primary(1, StreamTiming{});
  EXPECT_EQ(primary.append(grant(1, std::string(kMaxKeyLength + 1, 'x'), 1)), 0U);
  EXPECT_EQ(primary.append(grant(1, "", 1)), 0U);
  EXPECT_EQ(primary.append(grant(1, "fine", 1)), 1U);
}

TEST(ReplicationCodec, ADatagramCarriesWhatFitsAndTheRestFollows) {
  PrimaryStream primary(1, StreamTiming{});
  BackupStream backup(StreamTiming{}, 0);
  for (std::uint64_t i = 0; i < 200; ++i) {
    (void)primary.append(
        grant(static_cast<std::uint32_t>(i % 7), "key/" + std::to_string(i), i + 1));
  }
  std::vector<std::vector<std::uint8_t>> wire;
  primary.poll(0, 1, wire);
  ASSERT_GT(wire.size(), 1U);
  for (const auto& d : wire) EXPECT_LE(d.size(), kMaxReplicationDatagram);
  deliver(primary, backup, wire, 0);
  EXPECT_EQ(primary.applied(), 200U);
  EXPECT_EQ(backup.holder_count(), 200U);
  EXPECT_EQ(primary.unacknowledged(), 0U);
}

// A grant with a holder value travels as wire kind 5 with the
// value after the grant's fields; one without stays kind 1, byte for byte
// what the codec wrote before values, so a stream without values is
// unchanged for a backup that predates them.
TEST(ReplicationCodec, AHolderValueTravelsWithItsGrant) {
  std::vector<std::uint8_t> plain;
  ASSERT_EQ(encode_replicate(ReplicateHeader{1, 1, 1, 0}, std::vector{grant(1, "k", 2)}, plain),
            1U);
  EXPECT_EQ(plain[kReplicateHeaderSize], 1);  // kGrant
  Entry with = grant(1, "k", 2);
  with.value = "host-a:7420 pid 99";
  std::vector<std::uint8_t> valued;
  ASSERT_EQ(encode_replicate(ReplicateHeader{1, 1, 1, 0}, std::vector{with}, valued), 1U);
  EXPECT_EQ(valued[kReplicateHeaderSize], 5);
  EXPECT_EQ(valued.size(), plain.size() + 2 + with.value.size());
  EXPECT_TRUE(std::equal(plain.begin() + kReplicateHeaderSize + 1, plain.end(),
                         valued.begin() + kReplicateHeaderSize + 1));
  ReplicateHeader h;
  std::vector<Entry> back;
  ASSERT_TRUE(decode_replicate(valued, h, back));
  ASSERT_EQ(back.size(), 1U);
  EXPECT_EQ(back[0], with);

  const auto rejected = [](std::vector<std::uint8_t> bytes) {
    ReplicateHeader header;
    std::vector<Entry> e;
    return !decode_replicate(bytes, header, e);
  };
  auto empty = plain;  // kind 5 with a value of 0 bytes
  empty[kReplicateHeaderSize] = 5;
  empty.push_back(0);
  empty.push_back(0);
  EXPECT_TRUE(rejected(empty));
  auto too_long = plain;
  too_long[kReplicateHeaderSize] = 5;
  too_long.push_back(static_cast<std::uint8_t>(kMaxHolderValueLength + 1));
  too_long.push_back(static_cast<std::uint8_t>((kMaxHolderValueLength + 1) >> 8));
  too_long.insert(too_long.end(), kMaxHolderValueLength + 1, 'v');
  EXPECT_TRUE(rejected(too_long));
  auto release_with_value = plain;  // only a grant carries a value
  release_with_value[kReplicateHeaderSize] = 6;
  EXPECT_TRUE(rejected(release_with_value));

  PrimaryStream primary(1, StreamTiming{});
  Entry huge = grant(1, "k", 3);
  huge.value = std::string(kMaxHolderValueLength + 1, 'v');
  EXPECT_EQ(primary.append(huge), 0U);

  // The backup keeps the value with the holder, for a takeover.
  BackupStream backup(StreamTiming{}, 0);
  PrimaryStream stream(1, StreamTiming{});
  (void)stream.append(with);
  std::vector<std::vector<std::uint8_t>> wire;
  stream.poll(0, 1, wire);
  deliver(stream, backup, wire, 0);
  const auto holders = backup.holders(1, "k");
  ASSERT_EQ(holders.size(), 1U);
  EXPECT_EQ(holders[0].value, with.value);
}

TEST(ReplicationStream, AGrantIsAnsweredOnlyOnceTheBackupHasIt) {
  PrimaryStream primary(1, StreamTiming{});
  BackupStream backup(StreamTiming{}, 0);
  HeldReplies<std::string> held;
  const std::uint64_t seq = primary.append(grant(3, "a", 11));
  held.hold({{0, seq}}, "GRANTED a");
  std::vector<std::string> ready;
  const auto applied = [&](std::size_t) { return primary.applied(); };
  held.release(applied, ready);
  EXPECT_TRUE(ready.empty());

  std::vector<std::vector<std::uint8_t>> wire;
  primary.poll(0, 1, wire);
  ASSERT_EQ(wire.size(), 1U);
  deliver(primary, backup, wire, 1 * kMs);
  held.release(applied, ready);
  ASSERT_EQ(ready, std::vector<std::string>{"GRANTED a"});
  EXPECT_EQ(backup.holders(3, "a").size(), 1U);
  EXPECT_EQ(held.size(), 0U);
}

TEST(ReplicationStream, AReplyWaitsForEveryBackup) {
  PrimaryStream to_b(1, StreamTiming{});
  PrimaryStream to_c(2, StreamTiming{});
  BackupStream b(StreamTiming{}, 0);
  BackupStream c(StreamTiming{}, 0);
  HeldReplies<int> held;
  held.hold({{0, to_b.append(grant(1, "x", 5))}, {1, to_c.append(grant(1, "x", 5))}}, 1);
  std::vector<std::vector<std::uint8_t>> wire;
  to_b.poll(0, 1, wire);
  deliver(to_b, b, wire, 0);
  std::vector<int> ready;
  const auto applied = [&](std::size_t s) { return s == 0 ? to_b.applied() : to_c.applied(); };
  held.release(applied, ready);
  EXPECT_TRUE(ready.empty());
  wire.clear();
  to_c.poll(0, 1, wire);
  deliver(to_c, c, wire, 0);
  held.release(applied, ready);
  EXPECT_EQ(ready, std::vector<int>{1});
}

TEST(ReplicationStream, ABackupThatMissedPartOfTheStreamAppliesNothingPastTheGap) {
  const StreamTiming timing;
  PrimaryStream primary(1, timing);
  BackupStream backup(timing, 0);
  std::vector<std::vector<std::uint8_t>> wire;
  primary.poll(0, 1, wire);  // the stream's first heartbeat
  deliver(primary, backup, wire, 0);
  wire.clear();
  (void)primary.append(grant(1, "first", 1));
  primary.poll(0, 1, wire);
  (void)primary.append(grant(1, "second", 2));
  primary.poll(1 * kMs, 1, wire);
  ASSERT_EQ(wire.size(), 2U);
  deliver(primary, backup, wire, 2 * kMs, /*lost=*/{true, false});
  // The second arrived without the first: not applied, and the ack says so.
  EXPECT_EQ(backup.applied(), 0U);
  EXPECT_TRUE(backup.holders(1, "second").empty());
  EXPECT_EQ(backup.gaps(), 1U);
  EXPECT_EQ(primary.applied(), 0U);

  // Nothing is resent before the retransmission interval...
  wire.clear();
  primary.poll(2 * kMs + timing.retransmit_ns / 2, 1, wire);
  EXPECT_TRUE(wire.empty());
  // ...and then everything unacknowledged, from the oldest.
  primary.poll(timing.retransmit_ns + 1 * kMs, 1, wire);
  ASSERT_FALSE(wire.empty());
  deliver(primary, backup, wire, timing.retransmit_ns + 2 * kMs);
  EXPECT_EQ(backup.applied(), 2U);
  EXPECT_EQ(primary.applied(), 2U);
  EXPECT_EQ(backup.holders(1, "first").size(), 1U);
  EXPECT_EQ(backup.holders(1, "second").size(), 1U);
  EXPECT_EQ(primary.retransmissions(), 1U);

  // A duplicate of what was applied changes nothing.
  deliver(primary, backup, wire, timing.retransmit_ns + 3 * kMs);
  EXPECT_EQ(backup.holder_count(), 2U);
}

// A backup too slow to answer within retransmit_ns (starved, or
// sanitizer-built on busy cores) was sent the whole window again every
// 20 ms, while heartbeats kept its lease up: each retransmission without
// progress now doubles the wait before the next, up to max_retransmit_ns,
// and an ack that moves on brings it back.
TEST(ReplicationStream, RetransmissionsWithoutProgressBackOffAndAnAckResetsThem) {
  StreamTiming timing;
  timing.heartbeat_ns = 1000 * kMs;  // out of the way: only entries are counted
  const std::int64_t rto = timing.retransmit_ns;
  PrimaryStream primary(1, timing);
  BackupStream backup(timing, 0);
  std::vector<std::vector<std::uint8_t>> wire;
  (void)primary.append(grant(1, "slow", 1));
  primary.poll(0, 1, wire);
  ASSERT_EQ(wire.size(), 1U);  // sent, never answered
  // Retransmitted after rto, then after 2, 4, 8 x rto, then every
  // max_retransmit_ns.
  std::vector<std::int64_t> resent_at;
  for (std::int64_t now = 1 * kMs; now <= 700 * kMs; now += 1 * kMs) {
    wire.clear();
    primary.poll(now, 1, wire);
    if (!wire.empty()) resent_at.push_back(now);
  }
  const std::vector<std::int64_t> expected = {rto,
                                              3 * rto,
                                              7 * rto,
                                              15 * rto,
                                              15 * rto + timing.max_retransmit_ns,
                                              15 * rto + 2 * timing.max_retransmit_ns};
  EXPECT_EQ(resent_at, expected);
  EXPECT_EQ(primary.retransmissions(), expected.size());
  // The last one gets through: acknowledged, the timeout is rto again.
  std::int64_t now = expected.back();
  wire.clear();
  primary.poll(now, 1, wire);
  ASSERT_TRUE(wire.empty());
  // (the last retransmission is re-made to deliver it)
  primary.poll(now + timing.max_retransmit_ns, 1, wire);
  ASSERT_EQ(wire.size(), 1U);
  now += timing.max_retransmit_ns;
  deliver(primary, backup, wire, now);
  EXPECT_EQ(primary.applied(), 1U);
  (void)primary.append(grant(1, "next", 2));
  wire.clear();
  primary.poll(now, 1, wire);
  ASSERT_EQ(wire.size(), 1U);  // lost
  wire.clear();
  primary.poll(now + rto - 1, 1, wire);
  EXPECT_TRUE(wire.empty());
  primary.poll(now + rto, 1, wire);
  EXPECT_EQ(wire.size(), 1U) << "resent after rto, not the backed-off timeout";
}

TEST(ReplicationStream, ThePrimaryLeaseRunsFromTheSendNotTheAnswer) {
  StreamTiming timing;
  timing.lease_ms = 250;
  PrimaryStream primary(1, timing);
  BackupStream backup(timing, 0);
  EXPECT_FALSE(primary.holds_lease(0));
  std::vector<std::vector<std::uint8_t>> wire;
  primary.poll(0, 1, wire);  // a heartbeat, sent at 0
  ASSERT_EQ(wire.size(), 1U);
  deliver(primary, backup, wire, 200 * kMs);  // answered 200 ms later
  // 250 ms from the send, less the drift margin: not from the answer.
  EXPECT_TRUE(primary.holds_lease(200 * kMs));
  EXPECT_LT(primary.lease_until_ns(), 250 * kMs);
  EXPECT_GT(primary.lease_until_ns(), 240 * kMs);
  // The backup promised from its receipt, later than the send.
  EXPECT_EQ(backup.promised_until_ns(), 450 * kMs);
}

TEST(ReplicationStream, APrimaryLeaseThatExpiresMidGrantHoldsTheAnswerUntilTheBackupHasIt) {
  StreamTiming timing;
  timing.lease_ms = 250;
  PrimaryStream primary(1, timing);
  BackupStream backup(timing, 0);
  std::vector<std::vector<std::uint8_t>> wire;
  primary.poll(0, 1, wire);
  deliver(primary, backup, wire, 1 * kMs);
  ASSERT_TRUE(primary.holds_lease(100 * kMs));

  // A grant is made while the lease holds; its datagram is lost, and the
  // lease runs out before any answer.
  HeldReplies<int> held;
  held.hold({{0, primary.append(grant(2, "k", 3))}}, 42);
  wire.clear();
  primary.poll(100 * kMs, 1, wire);
  const std::int64_t late = 300 * kMs;
  EXPECT_FALSE(primary.holds_lease(late));  // no renewals and no grants now
  std::vector<int> ready;
  held.release([&](std::size_t) { return primary.applied(); }, ready);
  EXPECT_TRUE(ready.empty());

  // The retransmission reaches the backup: the grant is there, so it may be
  // answered, and the new lease runs from the retransmission's send.
  wire.clear();
  primary.poll(late, 1, wire);
  ASSERT_FALSE(wire.empty());
  deliver(primary, backup, wire, late + 1 * kMs);
  held.release([&](std::size_t) { return primary.applied(); }, ready);
  EXPECT_EQ(ready, std::vector<int>{42});
  EXPECT_TRUE(primary.holds_lease(late + 100 * kMs));
  EXPECT_EQ(backup.holders(2, "k").size(), 1U);
}

TEST(ReplicationStream, TheBackupsPromiseOutlastsThePrimarysLeaseWhateverTheDelays) {
  std::mt19937_64 rng(5);
  StreamTiming timing;
  PrimaryStream primary(1, timing);
  BackupStream backup(timing, 0);
  std::int64_t now = 0;
  for (int round = 0; round < 2000; ++round) {
    now += static_cast<std::int64_t>(rng() % (80 * kMs));
    std::vector<std::vector<std::uint8_t>> wire;
    if (rng() % 3 == 0) (void)primary.append(grant(1, "k" + std::to_string(round), 1 + round));
    primary.poll(now, 1, wire);
    for (const auto& d : wire) {
      if (rng() % 4 == 0) continue;  // lost
      ReplicateHeader h;
      std::vector<Entry> e;
      ASSERT_TRUE(decode_replicate(d, h, e));
      const std::int64_t arrival = now + static_cast<std::int64_t>(rng() % (300 * kMs));
      const Ack ack = backup.on_replicate(h, e, arrival);
      if (rng() % 4 == 0) continue;  // the ack is lost
      const std::int64_t answer = arrival + static_cast<std::int64_t>(rng() % (300 * kMs));
      primary.on_ack(ack, answer);
      // Same clock here: whatever the delays, the primary stops first.
      ASSERT_LE(primary.lease_until_ns(), backup.promised_until_ns());
    }
  }
}

TEST(ReplicationStream, AfterStopPromisingThePrimaryLosesItsLeaseAndTheBackupMayTakeOver) {
  StreamTiming timing;
  PrimaryStream primary(1, timing);
  BackupStream backup(timing, 0);
  std::vector<std::vector<std::uint8_t>> wire;
  (void)primary.append(grant(4, "held", 9));
  primary.poll(0, 1, wire);
  deliver(primary, backup, wire, 1 * kMs);
  backup.stop_promising();
  EXPECT_FALSE(backup.promise_expired(100 * kMs));
  wire.clear();
  primary.poll(100 * kMs, 1, wire);  // heartbeats keep coming...
  deliver(primary, backup, wire, 101 * kMs);
  // ...but the acknowledgements grant nothing more.
  EXPECT_FALSE(primary.holds_lease(backup.promised_until_ns()));
  EXPECT_LE(primary.lease_until_ns(), 251 * kMs);
  EXPECT_TRUE(backup.promise_expired(251 * kMs));
  const auto inherited = backup.bucket_holders(4);
  ASSERT_EQ(inherited.size(), 1U);
  EXPECT_EQ(inherited[0].first, "held");
  EXPECT_EQ(inherited[0].second.token, 9U);
  EXPECT_EQ(inherited[0].second.request_id, 100U);
}

// A grant made under the primary lease whose REPLICATE was
// lost reaches the backup only after the backup's promise ran out and it
// took the bucket over without it. The backup is frozen by then: it neither
// applies nor acknowledges it, so the primary never answers the grant.
TEST(ReplicationStream, AFrozenBackupNeitherAppliesNorAcknowledgesALateGrant) {
  StreamTiming timing;
  PrimaryStream primary(1, timing);
  BackupStream backup(timing, 0);
  std::vector<std::vector<std::uint8_t>> wire;
  primary.poll(0, 1, wire);
  deliver(primary, backup, wire, 0);  // a heartbeat: the primary holds a lease
  ASSERT_TRUE(primary.holds_lease(10 * kMs));
  (void)primary.append(grant(4, "late", 9));
  wire.clear();
  primary.poll(10 * kMs, 1, wire);  // lost: a one-way cut
  backup.stop_promising();          // the backup evicts the primary
  ASSERT_TRUE(backup.promise_expired(300 * kMs));
  ASSERT_TRUE(backup.bucket_holders(4).empty()) << "taken over without the late grant";
  // The cut heals: the primary's retransmission arrives.
  wire.clear();
  primary.poll(310 * kMs, 1, wire);
  ASSERT_FALSE(wire.empty());
  deliver(primary, backup, wire, 311 * kMs);
  EXPECT_TRUE(backup.bucket_holders(4).empty()) << "applied after the takeover";
  EXPECT_EQ(backup.applied(), 0U);
  EXPECT_EQ(primary.applied(), 0U) << "the grant's held answer would be let out";
  EXPECT_FALSE(primary.holds_lease(311 * kMs));
}

// The primary's half of hole 1: an ack that lends no lease, for a datagram
// sent after the primary's lease had ended (a backup that predates the
// freeze, or one that has just stopped promising), releases nothing.
TEST(ReplicationStream, AnAckWithoutALeaseForADatagramSentPastTheLeaseReleasesNothing) {
  StreamTiming timing;
  PrimaryStream primary(1, timing);
  std::vector<std::vector<std::uint8_t>> wire;
  primary.poll(0, 1, wire);
  primary.on_ack(Ack{1, 0, 0, 250}, 1 * kMs);  // a lease until about 245.5 ms
  const std::int64_t lease_end = primary.lease_until_ns();
  ASSERT_GT(lease_end, 200 * kMs);
  (void)primary.append(grant(4, "k", 9));
  wire.clear();
  primary.poll(lease_end + 1, 1, wire);
  primary.on_ack(Ack{1, 1, lease_end + 1, 0}, lease_end + 2);
  EXPECT_EQ(primary.applied(), 0U);
  // Sent before the lease ended, the same answer counts.
  primary.on_ack(Ack{1, 1, lease_end - 1, 0}, lease_end + 2);
  EXPECT_EQ(primary.applied(), 1U);
}

// A stream applies only the buckets it carries, so
// datagrams naming any other bucket (forged, or from a primary on another
// layout) cannot grow the backup.
TEST(ReplicationStream, ABackupAppliesOnlyTheBucketsItsStreamCarries) {
  StreamTiming timing;
  PrimaryStream primary(1, timing);
  BackupStream backup(timing, 0);
  backup.carry({2, 5}, 1);
  (void)primary.append(grant(2, "mine", 1));
  for (std::uint32_t b = 100; b < 140; ++b) (void)primary.append(grant(b, "stray", b));
  std::vector<std::vector<std::uint8_t>> wire;
  primary.poll(0, 1, wire);
  deliver(primary, backup, wire, 0);
  EXPECT_EQ(backup.holder_count(), 1U);
  EXPECT_EQ(backup.refused_entries(), 40U);
  EXPECT_EQ(backup.holders(2, "mine").size(), 1U);
  EXPECT_TRUE(backup.bucket_holders(100).empty());
  EXPECT_EQ(backup.applied(), 41U) << "the stream goes on: refused is not a gap";
  // A datagram of a map the backup has not adopted yet may carry buckets it
  // backs up only there: applied, as far as bucket numbers go.
  (void)primary.append(grant(7, "next", 200));
  (void)primary.append(grant(1u << 20, "beyond", 201));
  wire.clear();
  primary.poll(1 * kMs, 2, wire);
  deliver(primary, backup, wire, 1 * kMs);
  EXPECT_EQ(backup.applied(), 43U);
  EXPECT_EQ(backup.holders(7, "next").size(), 1U);
  EXPECT_EQ(backup.refused_entries(), 41U) << "no bucket number is beyond the map's";
}

TEST(ReplicationStream, ABackupFollowsOnlyALargerStreamFromItsStart) {
  StreamTiming timing;
  BackupStream backup(timing, 0);
  PrimaryStream first(10, timing);
  std::vector<std::vector<std::uint8_t>> wire;
  snapshot_of(first, 1, "a", 1);
  first.poll(0, 1, wire);
  deliver(first, backup, wire, 0);
  ASSERT_TRUE(backup.caught_up(1));

  // The primary restarted: its new stream starts with a snapshot that has
  // "b" and not "a". "a" stays: the earlier run granted it, and it may be
  // live although the new run knows nothing of it.
  PrimaryStream second(11, timing);
  std::vector<std::vector<std::uint8_t>> second_wire;
  snapshot_of(second, 1, "b", 2);
  second.poll(1 * kMs, 1, second_wire);
  deliver(second, backup, second_wire, 1 * kMs);
  EXPECT_EQ(backup.stream(), 11U);
  EXPECT_EQ(backup.holders(1, "a").size(), 1U);
  EXPECT_EQ(backup.holders(1, "b").size(), 1U);

  // A late datagram of the old stream rolls nothing back, and earns the
  // old stream no lease.
  PrimaryStream stale(10, timing);
  deliver(stale, backup, wire, 2 * kMs);
  EXPECT_EQ(backup.stream(), 11U);
  EXPECT_EQ(backup.holders(1, "b").size(), 1U);
  EXPECT_FALSE(stale.holds_lease(2 * kMs));

  // A larger stream seen mid-way (its start was lost) is followed from its
  // first entry: nothing applies until the primary resends that.
  PrimaryStream third(12, timing);
  (void)third.append(marker(EntryKind::kResetBucket, 1));
  std::vector<std::vector<std::uint8_t>> third_wire;
  third.poll(3 * kMs, 1, third_wire);
  (void)third.append(grant(1, "c", 3));
  (void)third.append(marker(EntryKind::kBucketCaughtUp, 1));
  third.poll(4 * kMs, 1, third_wire);
  ASSERT_EQ(third_wire.size(), 2U);
  deliver(third, backup, third_wire, 5 * kMs, /*lost=*/{true, false});
  EXPECT_EQ(backup.stream(), 12U);
  EXPECT_EQ(backup.applied(), 0U);
  EXPECT_EQ(backup.holders(1, "b").size(), 1U);  // untouched until the reset applies
  third_wire.clear();
  third.poll(4 * kMs + timing.retransmit_ns, 1, third_wire);
  deliver(third, backup, third_wire, 5 * kMs + timing.retransmit_ns);
  EXPECT_EQ(backup.applied(), 3U);
  EXPECT_EQ(backup.holders(1, "b").size(), 1U);  // kept: only a release removes it
  EXPECT_EQ(backup.holders(1, "c").size(), 1U);
  EXPECT_TRUE(backup.caught_up(1));
}

// A primary that restarted within a map epoch numbers its streams as its
// earlier run did. The backup follows a stream id from the process whose
// datagram started it: the same id from another process is refused (so that
// primary starts a larger one), never applied as if its entries were the
// ones already applied under that id.
TEST(ReplicationStream, AStreamIdIsFollowedOnlyFromTheProcessThatStartedIt) {
  StreamTiming timing;
  BackupStream backup(timing, 0);
  PrimaryStream first(10, timing, Addressing{1, 2, 100});
  std::vector<std::vector<std::uint8_t>> wire;
  snapshot_of(first, 1, "a", 1);
  (void)first.append(grant(1, "x", 2));
  first.poll(0, 1, wire);
  deliver(first, backup, wire, 0);
  ASSERT_EQ(backup.applied(), 4U);

  // The restarted process, same id: its first entries would have been
  // skipped as duplicates of the earlier run's, and acknowledged, unapplied,
  // once it had sent as many.
  PrimaryStream again(10, timing, Addressing{1, 2, 101});
  (void)again.append(grant(1, "y", 3));
  std::vector<std::vector<std::uint8_t>> again_wire;
  again.poll(1 * kMs, 1, again_wire);
  ASSERT_EQ(again_wire.size(), 1U);
  ReplicateHeader header;
  std::vector<Entry> entries;
  ASSERT_TRUE(decode_replicate(again_wire[0], header, entries));
  const Ack ack = backup.on_replicate(header, entries, 1 * kMs);
  EXPECT_TRUE(ack.refused);
  EXPECT_EQ(ack.applied, 0U);
  EXPECT_EQ(ack.lease_ms, 0U);
  again.on_ack(ack, 1 * kMs);
  EXPECT_TRUE(again.resync_requested());
  EXPECT_EQ(backup.applied(), 4U);
  EXPECT_TRUE(backup.holders(1, "y").empty());
  // Its next stream is larger, and followed.
  PrimaryStream next(11, timing, Addressing{1, 2, 101});
  (void)next.append(grant(1, "y", 3));
  std::vector<std::vector<std::uint8_t>> next_wire;
  next.poll(2 * kMs, 1, next_wire);
  deliver(next, backup, next_wire, 2 * kMs);
  EXPECT_EQ(backup.stream(), 11U);
  EXPECT_EQ(backup.holders(1, "y").size(), 1U);
  EXPECT_TRUE(next.holds_lease(2 * kMs));
  // The earlier run's datagrams of its stream are older now.
  deliver(first, backup, wire, 3 * kMs);
  EXPECT_EQ(backup.stream(), 11U);
}

// A stream refused by a backup process it was not addressed to goes on
// under a larger id, addressed to that process, from its first entry, as
// long as nothing of it was acknowledged; after that only a new stream
// with snapshots serves.
TEST(ReplicationStream, AStreamNothingOfWhichWasAcknowledgedIsReaddressed) {
  StreamTiming timing;
  PrimaryStream primary(20, timing, Addressing{1, 2, 100});
  snapshot_of(primary, 1, "a", 1);
  std::vector<std::vector<std::uint8_t>> wire;
  primary.poll(0, 1, wire);
  ASSERT_EQ(wire.size(), 1U);
  ASSERT_TRUE(primary.readdress(21, 555));
  EXPECT_EQ(primary.stream(), 21U);
  EXPECT_EQ(primary.addressing().receiver_incarnation, 555U);
  EXPECT_FALSE(primary.readdress(21, 556)) << "not larger";
  wire.clear();
  primary.poll(1 * kMs, 1, wire);  // at once, not after a retransmission timeout
  ASSERT_EQ(wire.size(), 1U);
  ReplicateHeader header;
  std::vector<Entry> entries;
  ASSERT_TRUE(decode_replicate(wire[0], header, entries));
  EXPECT_EQ(header.stream, 21U);
  EXPECT_EQ(header.first_seq, 1U);
  EXPECT_EQ(entries.size(), 3U);
  EXPECT_EQ(header.addressing.receiver_incarnation, 555U);
  BackupStream backup(timing, 0);
  deliver(primary, backup, wire, 1 * kMs);
  EXPECT_EQ(primary.applied(), 3U);
  EXPECT_TRUE(primary.holds_lease(1 * kMs));
  // Acknowledged: no more.
  EXPECT_FALSE(primary.readdress(22, 556));
  EXPECT_EQ(primary.stream(), 21U);
  EXPECT_EQ(primary.addressing().receiver_incarnation, 555U);
}

TEST(ReplicationStream, ABackupThatRestartedIsStartedOverAndWaitsOutItsOldPromise) {
  StreamTiming timing;
  PrimaryStream primary(1, timing);
  BackupStream backup(timing, 0);
  std::vector<std::vector<std::uint8_t>> wire;
  snapshot_of(primary, 1, "a", 1);
  primary.poll(0, 1, wire);
  deliver(primary, backup, wire, 0);
  ASSERT_EQ(primary.applied(), 3U);
  ASSERT_EQ(primary.unacknowledged(), 0U);  // trimmed here: only the backup had them

  // The backup restarts at 100 ms. Its previous run promised the primary a
  // lease until 250 ms; the new one counts as having promised as long.
  BackupStream restarted(timing, 100 * kMs);
  restarted.stop_promising();
  EXPECT_FALSE(restarted.promise_expired(250 * kMs));
  EXPECT_TRUE(restarted.promise_expired(350 * kMs));

  // Its first answer has less than the primary had acknowledged: the
  // primary knows it lost them, holds no lease from it, and starts over.
  BackupStream fresh(timing, 100 * kMs);
  wire.clear();
  primary.poll(100 * kMs, 1, wire);  // a heartbeat
  deliver(primary, fresh, wire, 101 * kMs);
  EXPECT_TRUE(primary.resync_requested());
  EXPECT_FALSE(primary.holds_lease(102 * kMs));
  EXPECT_FALSE(fresh.caught_up(1));
}

TEST(ReplicationStream, SnapshotsReleasesAndForgettingKeepTheCountRight) {
  StreamTiming timing;
  PrimaryStream primary(1, timing);
  BackupStream backup(timing, 0);
  std::vector<std::vector<std::uint8_t>> wire;
  (void)primary.append(marker(EntryKind::kResetBucket, 5));
  (void)primary.append(grant(5, "s", 1, 1));
  Entry second = grant(5, "s", 2, 2);
  second.mode = LeaseMode::kShared;
  (void)primary.append(second);
  (void)primary.append(grant(5, "s", 1, 1));  // the stream repeats a snapshot's grant
  primary.poll(0, 1, wire);
  deliver(primary, backup, wire, 0);
  EXPECT_FALSE(backup.caught_up(5));  // no marker yet
  EXPECT_EQ(backup.holder_count(), 2U);

  wire.clear();
  (void)primary.append(marker(EntryKind::kBucketCaughtUp, 5));
  (void)primary.append(release(5, "s", 1, 1));
  (void)primary.append(release(5, "s", 1, 9));  // another owner's token: no effect
  (void)primary.append(grant(6, "t", 3));
  primary.poll(1 * kMs, 1, wire);
  deliver(primary, backup, wire, 1 * kMs);
  EXPECT_TRUE(backup.caught_up(5));
  ASSERT_EQ(backup.holders(5, "s").size(), 1U);
  EXPECT_EQ(backup.holders(5, "s")[0].token, 2U);
  EXPECT_EQ(backup.holder_count(), 2U);

  backup.forget(5);
  EXPECT_FALSE(backup.caught_up(5));
  EXPECT_EQ(backup.holder_count(), 1U);
  wire.clear();
  (void)primary.append(marker(EntryKind::kResetBucket, 6));
  (void)primary.append(release(6, "t", 3));
  primary.poll(2 * kMs, 1, wire);
  deliver(primary, backup, wire, 2 * kMs);
  EXPECT_EQ(backup.holder_count(), 0U);
}

// The two-holder path this closes: a primary that restarts starts a new
// stream whose snapshot lacks the leases its earlier run granted (still
// live at their clients). Had the reset dropped them, a takeover from the
// new run would inherit nothing and grant those keys again.
TEST(ReplicationStream, AnEarlierRunsHoldersSurviveTheNewRunsSnapshot) {
  StreamTiming timing;
  BackupStream backup(timing, 0);
  PrimaryStream first_run(1, timing);
  std::vector<std::vector<std::uint8_t>> wire;
  snapshot_of(first_run, 2, "held", 7);
  first_run.poll(0, 1, wire);
  deliver(first_run, backup, wire, 0);
  // The primary crashes and restarts: its new run's snapshot of bucket 2 is
  // empty, and then it dies too.
  PrimaryStream second_run(2, timing);
  (void)second_run.append(marker(EntryKind::kResetBucket, 2));
  (void)second_run.append(marker(EntryKind::kBucketCaughtUp, 2));
  wire.clear();
  second_run.poll(1 * kMs, 1, wire);
  deliver(second_run, backup, wire, 1 * kMs);
  ASSERT_TRUE(backup.caught_up(2));
  backup.stop_promising();
  ASSERT_TRUE(backup.promise_expired(252 * kMs));
  const auto inherited = backup.bucket_holders(2);
  ASSERT_EQ(inherited.size(), 1U);
  EXPECT_EQ(inherited[0].first, "held");
  EXPECT_EQ(inherited[0].second.token, 7U);
}

// A RELEASE answered at the primary whose entry was lost
// when the stream started over (restart_streams() drops what was not
// acknowledged). A settled primary's snapshot lists every holder it has, so
// the released one is gone from the replica; before, the takeover inherited
// it and blocked its key for a max TTL.
TEST(ReplicationStream, ASettledPrimarysSnapshotDropsAHolderWhoseReleaseWasLost) {
  StreamTiming timing;
  BackupStream backup(timing, 0);
  PrimaryStream first(1, timing);
  snapshot_of(first, 2, "released", 7);
  std::vector<std::vector<std::uint8_t>> wire;
  first.poll(0, 1, wire, /*settled=*/true);
  deliver(first, backup, wire, 0);
  ASSERT_EQ(backup.holders(2, "released").size(), 1U);
  // The release's entry is lost with the stream; the next stream's snapshot
  // of bucket 2 is empty.
  PrimaryStream second(2, timing);
  (void)second.append(marker(EntryKind::kResetBucket, 2));
  (void)second.append(marker(EntryKind::kBucketCaughtUp, 2));
  wire.clear();
  second.poll(1 * kMs, 1, wire, /*settled=*/true);
  deliver(second, backup, wire, 1 * kMs);
  ASSERT_TRUE(backup.caught_up(2));
  EXPECT_TRUE(backup.bucket_holders(2).empty()) << "the released holder came back";
  EXPECT_EQ(backup.holder_count(), 0U);
}

TEST(ReplicationStream, AcksThatCannotBeOursAreIgnored) {
  StreamTiming timing;
  PrimaryStream primary(1, timing);
  (void)primary.append(grant(1, "a", 1));
  std::vector<std::vector<std::uint8_t>> wire;
  primary.poll(10 * kMs, 1, wire);
  primary.on_ack(Ack{2, 1, 10 * kMs, 250}, 11 * kMs);  // another stream
  primary.on_ack(Ack{1, 5, 10 * kMs, 250}, 11 * kMs);  // entries never sent
  primary.on_ack(Ack{1, 1, 50 * kMs, 250}, 11 * kMs);  // sent in the future
  EXPECT_EQ(primary.applied(), 0U);
  EXPECT_FALSE(primary.holds_lease(11 * kMs));
  primary.on_ack(Ack{1, 1, 10 * kMs, 250}, 11 * kMs);
  EXPECT_EQ(primary.applied(), 1U);
  EXPECT_TRUE(primary.holds_lease(11 * kMs));
}

TEST(ReplicationStream, AnIdleStreamHeartbeats) {
  StreamTiming timing;
  PrimaryStream primary(1, timing);
  std::vector<std::vector<std::uint8_t>> wire;
  primary.poll(0, 1, wire);
  EXPECT_EQ(wire.size(), 1U);
  primary.poll(timing.heartbeat_ns - 1, 1, wire);
  EXPECT_EQ(wire.size(), 1U);
  primary.poll(timing.heartbeat_ns, 1, wire);
  ASSERT_EQ(wire.size(), 2U);
  ReplicateHeader h;
  std::vector<Entry> e;
  ASSERT_TRUE(decode_replicate(wire[1], h, e));
  EXPECT_TRUE(e.empty());
  EXPECT_EQ(h.first_seq, 1U);
  EXPECT_EQ(h.sent_ns, timing.heartbeat_ns);
}

// Answers from the backup: a REPLICATE carries client answers after its
// entries, each with the stream seq it waits for and the client's address.
TEST(ReplicationCodec, RelaysTravelAfterTheEntriesToIpv4AndIpv6Clients) {
  const std::vector<Entry> entries = {grant(3, "a", 11), grant(3, "b", 12)};
  std::vector<std::uint8_t> bytes;
  ASSERT_EQ(encode_replicate(ReplicateHeader{1, 1, 20, 0}, entries, bytes), 2U);
  Peer v4;
  v4.addr.v4.sin_family = AF_INET;
  v4.addr.v4.sin_port = htons(7420);
  v4.addr.v4.sin_addr.s_addr = htonl(0x7F000001);
  v4.len = sizeof(sockaddr_in);
  Peer v6;
  v6.addr.v6.sin6_family = AF_INET6;
  v6.addr.v6.sin6_port = htons(7421);
  v6.addr.v6.sin6_addr.s6_addr[15] = 1;
  v6.len = sizeof(sockaddr_in6);
  const std::vector<std::uint8_t> answer_a = {1, 2, 3};
  const std::vector<std::uint8_t> answer_b(200, 9);
  // Entries 20 and 21 travel here: an answer waiting for 22 does not.
  EXPECT_FALSE(append_relay(bytes, 22, v4, answer_a));
  ASSERT_TRUE(append_relay(bytes, 20, v4, answer_a));
  ASSERT_TRUE(append_relay(bytes, 21, v6, answer_b));
  ReplicateHeader h;
  std::vector<Entry> back;
  std::vector<Relay> relays;
  ASSERT_TRUE(decode_replicate(bytes, h, back, &relays));
  EXPECT_EQ(back, entries);
  ASSERT_EQ(relays.size(), 2U);
  EXPECT_EQ(relays[0].seq, 20U);
  EXPECT_EQ(relays[0].to.addr.v4.sin_port, htons(7420));
  EXPECT_EQ(relays[0].to.addr.v4.sin_addr.s_addr, htonl(0x7F000001));
  EXPECT_EQ(std::vector<std::uint8_t>(relays[0].bytes.begin(), relays[0].bytes.end()), answer_a);
  EXPECT_EQ(relays[1].seq, 21U);
  EXPECT_EQ(relays[1].to.addr.sa.sa_family, AF_INET6);
  EXPECT_EQ(relays[1].to.addr.v6.sin6_addr.s6_addr[15], 1);
  EXPECT_EQ(std::vector<std::uint8_t>(relays[1].bytes.begin(), relays[1].bytes.end()), answer_b);
  // Without a place for them, they are checked and dropped.
  ASSERT_TRUE(decode_replicate(bytes, h, back));
  // Every truncation, and a byte too many, is refused whole.
  for (std::size_t n = kReplicateHeaderSize; n < bytes.size(); ++n) {
    EXPECT_FALSE(decode_replicate(std::span(bytes).first(n), h, back, &relays)) << n;
    EXPECT_TRUE(back.empty());
    EXPECT_TRUE(relays.empty());
  }
  bytes.push_back(0);
  EXPECT_FALSE(decode_replicate(bytes, h, back, &relays));
}

TEST(ReplicationCodec, TheAckLaterFlagTravelsInTheHeaderAndSurvivesRelays) {
  std::vector<std::uint8_t> bytes;
  ASSERT_EQ(encode_replicate(ReplicateHeader{1, 1, 5, 0}, std::vector{grant(3, "a", 11)}, bytes),
            1U);
  ReplicateHeader h;
  std::vector<Entry> back;
  ASSERT_TRUE(decode_replicate(bytes, h, back));
  EXPECT_FALSE(h.ack_later);
  Peer v4;
  v4.addr.v4.sin_family = AF_INET;
  v4.addr.v4.sin_port = htons(7420);
  v4.len = sizeof(sockaddr_in);
  ASSERT_TRUE(append_relay(bytes, 5, v4, std::vector<std::uint8_t>{1}));
  mark_ack_later(bytes);
  EXPECT_EQ(bytes[kHeaderFlagsOffset] & (kFlagRelays | kFlagAckLater), kFlagRelays | kFlagAckLater);
  std::vector<Relay> relays;
  ASSERT_TRUE(decode_replicate(bytes, h, back, &relays));
  EXPECT_TRUE(h.ack_later);
  EXPECT_EQ(relays.size(), 1U);
  // encode_replicate() writes it too; a bit beyond the known ones is refused.
  ASSERT_EQ(encode_replicate(ReplicateHeader{1, 1, 5, 0, false, {}, true}, {}, bytes), 0U);
  ASSERT_TRUE(decode_replicate(bytes, h, back));
  EXPECT_TRUE(h.ack_later);
  bytes[kHeaderFlagsOffset] |= 0x40;
  EXPECT_FALSE(decode_replicate(bytes, h, back));
}

// Acks ride in REPLICATEs going the other way: the ack is the last
// kAckHeaderSize bytes, after entries and relays, and reads as sent alone.
TEST(ReplicationCodec, AnAckRidesLastInAReplicateAndReadsAsSentAlone) {
  const std::vector<Entry> entries = {grant(3, "a", 11)};
  std::vector<std::uint8_t> bytes;
  ASSERT_EQ(encode_replicate(ReplicateHeader{9, 2, 5, 77}, entries, bytes), 1U);
  Peer v4;
  v4.addr.v4.sin_family = AF_INET;
  v4.addr.v4.sin_port = htons(7420);
  v4.len = sizeof(sockaddr_in);
  const std::vector<std::uint8_t> answer = {4, 5, 6};
  ASSERT_TRUE(append_relay(bytes, 5, v4, answer));
  const Ack ack{31, 12, 1234, 250, Addressing{7, 8, 9}, false};
  const std::size_t before = bytes.size();
  ASSERT_TRUE(append_ack(bytes, ack));
  EXPECT_EQ(bytes.size(), before + kAckHeaderSize);
  EXPECT_NE(bytes[kHeaderFlagsOffset] & kFlagCarriesAck, 0);
  // One ack per datagram, and nothing after it.
  EXPECT_FALSE(append_ack(bytes, ack));
  EXPECT_FALSE(append_relay(bytes, 5, v4, answer));
  ReplicateHeader h;
  std::vector<Entry> back;
  std::vector<Relay> relays;
  std::optional<Ack> carried;
  ASSERT_TRUE(decode_replicate(bytes, h, back, &relays, &carried));
  EXPECT_EQ(h.stream, 9U);
  EXPECT_EQ(back, entries);
  ASSERT_EQ(relays.size(), 1U);
  EXPECT_EQ(std::vector<std::uint8_t>(relays[0].bytes.begin(), relays[0].bytes.end()), answer);
  ASSERT_TRUE(carried.has_value());
  EXPECT_EQ(*carried, ack);
  // A reader that does not ask for it still checks it.
  ASSERT_TRUE(decode_replicate(bytes, h, back));
  // A refusal travels too.
  std::vector<std::uint8_t> heartbeat;
  ASSERT_EQ(encode_replicate(ReplicateHeader{9, 2, 6, 78}, {}, heartbeat), 0U);
  Ack refused = ack;
  refused.refused = true;
  ASSERT_TRUE(append_ack(heartbeat, refused));
  ASSERT_TRUE(decode_replicate(heartbeat, h, back, nullptr, &carried));
  ASSERT_TRUE(carried.has_value());
  EXPECT_TRUE(carried->refused);
  // Every truncation, a byte too many and a damaged ack refuse it whole,
  // and leave nothing carried.
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_FALSE(decode_replicate(std::span(bytes).first(n), h, back, &relays, &carried)) << n;
    EXPECT_FALSE(carried.has_value()) << n;
  }
  std::vector<std::uint8_t> longer = bytes;
  longer.push_back(0);
  EXPECT_FALSE(decode_replicate(longer, h, back, &relays, &carried));
  std::vector<std::uint8_t> damaged = bytes;
  damaged[bytes.size() - kAckHeaderSize] ^= 1;  // the ack's magic
  EXPECT_FALSE(decode_replicate(damaged, h, back, &relays, &carried));
  EXPECT_FALSE(carried.has_value());
  // No room, or not a REPLICATE: not appended.
  std::vector<std::uint8_t> full;
  ASSERT_EQ(encode_replicate(ReplicateHeader{9, 2, 5, 77}, {}, full), 0U);
  ASSERT_TRUE(append_relay(
      full, 4, v4, std::vector<std::uint8_t>(kMaxReplicationDatagram - full.size() - 30, 1)));
  EXPECT_FALSE(append_ack(full, ack));
  EXPECT_EQ(full[kHeaderFlagsOffset] & kFlagCarriesAck, 0);
  std::vector<std::uint8_t> alone;
  encode_ack(ack, alone);
  EXPECT_FALSE(append_ack(alone, ack));
}

TEST(ReplicationCodec, ARelayThatDoesNotFitOrNamesNoIpPeerIsNotAppended) {
  std::vector<std::uint8_t> bytes;
  // A heartbeat at seq 8: it may carry an answer waiting for 7, not 8.
  ASSERT_EQ(encode_replicate(ReplicateHeader{1, 1, 8, 0}, {}, bytes), 0U);
  Peer v4;
  v4.addr.v4.sin_family = AF_INET;
  v4.len = sizeof(sockaddr_in);
  EXPECT_FALSE(append_relay(bytes, 8, v4, std::vector<std::uint8_t>{1}));
  EXPECT_FALSE(append_relay(bytes, 0, v4, std::vector<std::uint8_t>{1}));
  Peer unix_peer;
  unix_peer.addr.sa.sa_family = AF_UNIX;
  EXPECT_FALSE(append_relay(bytes, 7, unix_peer, std::vector<std::uint8_t>{1}));
  EXPECT_FALSE(append_relay(bytes, 7, v4, std::vector<std::uint8_t>{}));
  const std::size_t before = bytes.size();
  const std::vector<std::uint8_t> big(kMaxReplicationDatagram - before, 1);
  EXPECT_FALSE(append_relay(bytes, 7, v4, big));
  EXPECT_EQ(bytes.size(), before);
  EXPECT_EQ(bytes[kHeaderFlagsOffset] & kFlagRelays, 0);
  ASSERT_TRUE(append_relay(bytes, 7, v4, std::vector<std::uint8_t>{5}));
  EXPECT_NE(bytes[kHeaderFlagsOffset] & kFlagRelays, 0);
  // Not a REPLICATE at all.
  std::vector<std::uint8_t> ack;
  encode_ack(Ack{1, 1, 1, 1}, ack);
  EXPECT_FALSE(append_relay(ack, 1, v4, std::vector<std::uint8_t>{1}));
}

TEST(ReplicationCodec, MalformedRelaysAreRefused) {
  std::vector<std::uint8_t> bytes;
  ASSERT_EQ(encode_replicate(ReplicateHeader{1, 1, 5, 0}, std::vector{grant(3, "a", 1)}, bytes),
            1U);
  Peer v4;
  v4.addr.v4.sin_family = AF_INET;
  v4.len = sizeof(sockaddr_in);
  ASSERT_TRUE(append_relay(bytes, 5, v4, std::vector<std::uint8_t>{1, 2}));
  // The relay, then its count (one byte) ends the datagram.
  const std::size_t relay_at = bytes.size() - 1 - (8 + 1 + 2 + 4 + 2 + 2);
  ReplicateHeader h;
  std::vector<Entry> back;
  std::vector<Relay> relays;
  ASSERT_TRUE(decode_replicate(bytes, h, back, &relays));
  auto refused = [&](std::size_t offset, std::uint8_t value) {
    std::vector<std::uint8_t> bad = bytes;
    bad[offset] = value;
    return !decode_replicate(bad, h, back, &relays) && relays.empty();
  };
  EXPECT_TRUE(refused(relay_at, 0));          // seq 0 (its low byte; the rest are 0)
  EXPECT_TRUE(refused(relay_at + 8, 5));      // neither IPv4 nor IPv6
  EXPECT_TRUE(refused(relay_at + 8 + 7, 0));  // a zero length (its low byte)
  EXPECT_TRUE(refused(relay_at + 8 + 7, 3));  // longer than what is left
  EXPECT_TRUE(refused(bytes.size() - 1, 0));  // a count of none
  EXPECT_TRUE(refused(bytes.size() - 1, 2));  // more relays than the bytes hold
  // The flag with nothing after the entries.
  std::vector<std::uint8_t> flagged;
  ASSERT_EQ(encode_replicate(ReplicateHeader{1, 1, 5, 0}, std::vector{grant(3, "a", 1)}, flagged),
            1U);
  flagged[kHeaderFlagsOffset] |= kFlagRelays;
  EXPECT_FALSE(decode_replicate(flagged, h, back, &relays));
}

}  // namespace
}  // namespace shardlock::lease::internal::replication
