// epoch_file.h: the highest cluster-map epoch a node has seen, kept durably
// in its data dir, so that neither a live node nor a restarted one ever
// adopts an older map (docs/cluster.md, Epochs).
//
// The file is `cluster-epoch` in the data dir: one text line,
//   shardlock-cluster-epoch v1 <epoch> <xxh3-64 of the text before it, hex>
// so an operator restoring etcd from a snapshot can read the epoch to stay
// above. It is replaced by the token store's recipe (write a temp file,
// fsync, rename over, fsync the directory): after record() returns, a crash
// leaves either the old or the new value, never a torn one.
//
// Not thread-safe: one Membership owns it and records from one thread at a
// time. It takes no lock on the directory; the lease server's TokenStore
// owns the dir's flock, and this file only shares the directory.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <system_error>

namespace shardlock::cluster {

class EpochFile {
 public:
  static constexpr const char* kFileName = "cluster-epoch";

  ~EpochFile();
  EpochFile(const EpochFile&) = delete;
  EpochFile& operator=(const EpochFile&) = delete;

  // Opens `dir` (creating it, not its parents, if missing) and reads the
  // file. A missing file is epoch 0. An unreadable or corrupt one is an
  // error (std::errc::illegal_byte_sequence for a bad checksum or format),
  // never a silent reset: an epoch that went back to 0 would let the node
  // adopt a map it has already seen superseded. `detail` says which.
  [[nodiscard]] static std::error_code open(const std::string& dir, std::unique_ptr<EpochFile>& out,
                                            std::string& detail);

  // The highest epoch recorded, 0 when none.
  [[nodiscard]] std::uint64_t highest() const noexcept { return highest_; }

  // Durably records `epoch` if it is above highest() (a lower or equal one
  // is a no-op, so the file never goes back). Blocks for two fsyncs.
  [[nodiscard]] std::error_code record(std::uint64_t epoch, std::string& detail);

  [[nodiscard]] std::string path() const { return dir_ + "/" + kFileName; }

  // The file's text for `epoch`; exposed for tests that plant a file.
  [[nodiscard]] static std::string encode(std::uint64_t epoch);
  // Parses encode()'s text; false on anything else.
  [[nodiscard]] static bool decode(std::string_view text, std::uint64_t& epoch) noexcept;

 private:
  EpochFile() = default;
  std::string dir_;
  int dir_fd_ = -1;
  std::uint64_t highest_ = 0;
};

}  // namespace shardlock::cluster
