// The shared-memory segment of the shm transport: its layout and its POSIX plumbing.
//
// Every rank owns one segment (/dev/shm/plait-<job key>-<rank>) holding
//   segment_header   identity, geometry, the rank's doorbell word, its "closed" word
//   fifo_entry[n]    directory: which peer's receive FIFO sits at which offset
//   fifo[n]          per peer p: fifo_control (tail, head) + depth slots
//   pool             chunk_control[depth] + depth chunks of slot_bytes: payloads this
//                    rank copied once for several peers to read (link_set::stage)
// A slot is a 64-byte slot_header followed by slot_bytes of payload, its stride
// rounded up to a cache line so every header and payload starts on one.
// Peer p writes (producer) into FIFO[p] of this rank's segment; this rank reads it
// (consumer). So the FIFO a rank reads is in its own memory and a sender writes
// straight into it: one copy in total, made by the kernel that fills the slot.
// The pool is the exception: this rank writes a chunk, and every peer it posts the
// chunk to reads it where it is, so n readers cost one copy in and n out, not n each.
//
// Everything here runs at connect time and may throw plait::error (system,
// mismatch, protocol); the RAII types below release what they hold and never throw.
#pragma once

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <plait/detail/doorbell.hpp>
#include <plait/error.hpp>
#include <plait/wire.hpp>

namespace plait::transport::shm_detail {

inline constexpr std::uint64_t segment_magic = 0x316d7374'69616c70;  // "plaitsm1"
inline constexpr std::uint32_t segment_version = 3;                  // 3: the staging pool
inline constexpr std::size_t cache_line = 64;
// Head and tail sit 128 bytes apart: x86 prefetches cache lines in adjacent pairs,
// so 64 bytes apart the producer's and the consumer's writes would still collide.
inline constexpr std::size_t false_sharing_span = 128;
inline constexpr std::size_t page = 4096;
inline constexpr std::size_t reason_bytes = 120;

static_assert(std::atomic<std::uint64_t>::is_always_lock_free, "shm FIFOs need lock-free 64-bit atomics");
static_assert(std::atomic<std::uint32_t>::is_always_lock_free, "shm doorbells need lock-free 32-bit atomics");

struct segment_header {
  std::uint64_t magic = 0;
  std::uint32_t version = 0;
  std::int32_t owner_rank = -1;
  std::int64_t owner_pid = 0;
  std::uint64_t slot_bytes = 0;   // payload capacity of one slot
  std::uint64_t depth = 0;        // slots per FIFO
  std::uint64_t slot_stride = 0;  // bytes from one slot to the next
  std::uint64_t fifo_bytes = 0;   // bytes from one FIFO to the next
  std::uint64_t fifo_count = 0;   // entries in the directory
  std::uint64_t total_bytes = 0;  // size of the segment
  // Peers ring this word (their posts and releases); the owner's executor sleeps on it.
  alignas(false_sharing_span) plait::detail::doorbell_word bell;
  // Set once by the owner's close(): peers report peer_lost naming the owner.
  alignas(false_sharing_span) std::atomic<std::uint32_t> closed{0};
  std::int32_t close_code = 0;      // plait::errc of the close_reason (written before `closed`)
  std::int32_t close_culprit = -1;  // rank the owner blames (it lost that rank), or -1
  char reason[reason_bytes] = {};
};

struct fifo_entry {
  std::int32_t peer = -1;  // the producer writing into this FIFO
  std::uint32_t reserved = 0;
  std::uint64_t offset = 0;  // from the start of the segment
};

struct alignas(false_sharing_span) fifo_control {
  alignas(false_sharing_span) std::atomic<std::uint64_t> tail{0};  // slots posted: written by the producer
  // Written by the consumer, rarely (shm_link_set::measured_streamed_slots): per power
  // of two of slot bytes, whether it read slots filled with non-temporal stores faster
  // than plain ones. Beside the producer's tail, which the producer reads it with.
  std::atomic<std::uint32_t> streamed_faster{0};
  // The same for a slot lent by reference against one filled (measured_lending), per
  // power of two of a broadcast's bytes (of several slices, up to 4 TiB).
  std::atomic<std::uint64_t> lend_faster{0};
  alignas(false_sharing_span) std::atomic<std::uint64_t> head{0};  // slots released: written by the consumer
  // Set by the consumer at connect, before the "shm-mapped" barrier, when it can copy
  // straight from the producer's memory (shm_single_copy.hpp): the producer may then
  // post slots by reference. Read-only afterwards.
  std::atomic<std::uint32_t> reader_copies{0};
};
static_assert(sizeof(fifo_control) == 2 * false_sharing_span);

// One chunk of the pool: how many posted slots still read it. The owner adds one per
// slot it posts (before publishing it) and reuses the chunk only at zero; a reader
// takes one off when it releases the slot, after its reads.
struct alignas(false_sharing_span) chunk_control {
  std::atomic<std::uint32_t> holds{0};
};

constexpr std::size_t round_up(std::size_t n, std::size_t to) noexcept { return (n + to - 1) / to * to; }

// Sizes of one segment, identical on every rank for a given link_config.
struct geometry {
  std::size_t slot_bytes = 0;
  std::size_t depth = 0;
  std::size_t slot_stride = 0;
  std::size_t fifo_bytes = 0;

  std::size_t directory_offset() const noexcept { return round_up(sizeof(segment_header), cache_line); }
  std::size_t first_fifo_offset(std::size_t fifos) const noexcept {
    return round_up(directory_offset() + fifos * sizeof(fifo_entry), page);
  }
  // The pool: depth chunks, after the FIFOs (page-aligned: fifo_bytes is pages).
  std::size_t chunk_stride() const noexcept { return round_up(slot_bytes, cache_line); }
  std::size_t pool_offset(std::size_t fifos) const noexcept { return first_fifo_offset(fifos) + fifos * fifo_bytes; }
  std::size_t chunk_offset(std::size_t fifos, std::size_t chunk) const noexcept {
    return pool_offset(fifos) + round_up(depth * sizeof(chunk_control), page) + chunk * chunk_stride();
  }
  std::size_t total_bytes(std::size_t fifos) const noexcept { return round_up(chunk_offset(fifos, depth), page); }
};

// Checks the configuration (it comes from the user's knobs) and computes the layout.
inline geometry make_geometry(std::size_t slot_bytes, std::size_t depth, std::size_t fifos, int rank) {
  if (slot_bytes == 0 || depth == 0)
    throw error(errc::invalid_argument,
                "shm: slot_bytes and depth must both be positive (got " + std::to_string(slot_bytes) + " and " +
                    std::to_string(depth) + ")",
                rank);
  constexpr std::size_t limit = std::size_t{1} << 40;  // far beyond any sane FIFO; keeps the arithmetic exact
  if (slot_bytes > std::numeric_limits<std::uint32_t>::max() || depth > (std::size_t{1} << 20))
    throw error(errc::invalid_argument,
                "shm: slot_bytes " + std::to_string(slot_bytes) + " or depth " + std::to_string(depth) +
                    " is too large (slot_bytes must fit the 32-bit header field, depth <= 2^20)",
                rank);
  geometry g;
  g.slot_bytes = slot_bytes;
  g.depth = depth;
  g.slot_stride = round_up(sizeof(plait::detail::slot_header) + slot_bytes, cache_line);
  if (g.slot_stride > limit / depth)
    throw error(
        errc::invalid_argument,
        "shm: one FIFO of " + std::to_string(depth) + " slots of " + std::to_string(slot_bytes) + " bytes is too large",
        rank);
  g.fifo_bytes = round_up(sizeof(fifo_control) + depth * g.slot_stride, page);
  if (fifos != 0 && g.fifo_bytes > limit / (fifos + 1))
    throw error(errc::invalid_argument,
                "shm: " + std::to_string(fifos) + " FIFOs of " + std::to_string(g.fifo_bytes) + " bytes are too large",
                rank);
  return g;
}

inline std::string errno_text(int e) { return std::string(std::strerror(e)) + " (errno " + std::to_string(e) + ")"; }

inline std::string mebibytes(std::size_t bytes) {
  return std::to_string(bytes / (1024 * 1024)) + "." + std::to_string(bytes % (1024 * 1024) * 10 / (1024 * 1024)) +
         " MiB";
}

// A file descriptor, closed on destruction.
class unique_fd {
 public:
  unique_fd() = default;
  explicit unique_fd(int fd) noexcept : fd_(fd) {}
  unique_fd(unique_fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  unique_fd& operator=(unique_fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  ~unique_fd() { reset(); }
  int get() const noexcept { return fd_; }
  void reset() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// A shared mapping, unmapped on destruction.
class mapping {
 public:
  mapping() = default;
  mapping(std::byte* base, std::size_t bytes) noexcept : base_(base), bytes_(bytes) {}
  mapping(mapping&& o) noexcept : base_(std::exchange(o.base_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  mapping& operator=(mapping&& o) noexcept {
    if (this != &o) {
      reset();
      base_ = std::exchange(o.base_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  ~mapping() { reset(); }
  std::byte* base() const noexcept { return base_; }
  std::size_t size() const noexcept { return bytes_; }
  segment_header* header() const noexcept { return reinterpret_cast<segment_header*>(base_); }
  void reset() noexcept {
    if (base_ != nullptr) ::munmap(base_, bytes_);
    base_ = nullptr;
    bytes_ = 0;
  }

 private:
  std::byte* base_ = nullptr;
  std::size_t bytes_ = 0;
};

// The name of a segment this rank created: unlinked on destruction unless done already,
// so a connect that fails leaves nothing in /dev/shm.
class segment_name {
 public:
  segment_name() = default;
  explicit segment_name(std::string name) : name_(std::move(name)), linked_(true) {}
  segment_name(segment_name&& o) noexcept : name_(std::move(o.name_)), linked_(std::exchange(o.linked_, false)) {}
  segment_name& operator=(segment_name&& o) noexcept {
    if (this != &o) {
      unlink();
      name_ = std::move(o.name_);
      linked_ = std::exchange(o.linked_, false);
    }
    return *this;
  }
  ~segment_name() { unlink(); }
  const std::string& str() const noexcept { return name_; }
  void unlink() noexcept {
    if (linked_) ::shm_unlink(name_.c_str());
    linked_ = false;
  }

 private:
  std::string name_;
  bool linked_ = false;
};

// "/plait-<job key>-<rank>"; '/' may not appear inside a POSIX shm name.
inline std::string segment_name_of(std::string_view job_key, int rank) {
  std::string name = "/plait-";
  for (char c : job_key) name += (c == '/' ? '_' : c);
  name += '-';
  name += std::to_string(rank);
  return name;
}

// MAP_POPULATE: every page of the FIFOs is in this process's page table from the
// start, so no collective ever takes a page fault on a slot it touches first.
inline mapping map_shared(int fd, std::size_t bytes, const std::string& name, int rank, int peer) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) {
    const int e = errno;
    throw error(errc::system,
                "shm: mmap of /dev/shm" + name + " (" + mebibytes(bytes) + ") failed: " + errno_text(e) +
                    "; check the address-space limit (ulimit -v)",
                rank, peer);
  }
  return mapping(static_cast<std::byte*>(p), bytes);
}

// Creates, sizes and maps this rank's segment; fills in header, directory and FIFOs.
// Memory is allocated up front (posix_fallocate): on a tmpfs too small for it that
// fails here with ENOSPC, instead of a SIGBUS when a slot is first touched mid-call.
inline mapping create_segment(segment_name& name_out, const std::string& name, const geometry& g,
                              std::span<const int> peers, int rank) {
  const std::size_t total = g.total_bytes(peers.size());
  unique_fd fd(::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600));
  if (fd.get() < 0) {
    const int e = errno;
    throw error(errc::system,
                "shm: cannot create /dev/shm" + name + ": " + errno_text(e) +
                    (e == EEXIST ? "; a segment of that name is left over from a job with the same key: remove it "
                                   "(rm /dev/shm" +
                                       name + ") or use a fresh job key"
                                 : "; check that /dev/shm is mounted and writable"),
                rank);
  }
  name_out = segment_name(name);
  if (::ftruncate(fd.get(), static_cast<off_t>(total)) != 0) {
    const int e = errno;
    throw error(errc::system,
                "shm: cannot size /dev/shm" + name + " to " + mebibytes(total) + ": " + errno_text(e) +
                    "; check free space in /dev/shm (df -h /dev/shm)",
                rank);
  }
  if (const int e = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(total)); e != 0)
    throw error(errc::system,
                "shm: /dev/shm has no room for this rank's " + mebibytes(total) + " (" + std::to_string(peers.size()) +
                    " peers and a staging pool, each " + std::to_string(g.depth) + " slots x " +
                    std::to_string(g.slot_bytes) + " bytes): " + errno_text(e) +
                    "; enlarge /dev/shm (docker run --shm-size=..., or mount -o remount,size=... /dev/shm) "
                    "or use smaller slices (PLAIT_SLICE_BYTES, PLAIT_COPY_SLICE_BYTES)",
                rank);
  mapping map = map_shared(fd.get(), total, name, rank, -1);

  auto* hdr = new (map.base()) segment_header{};
  hdr->magic = segment_magic;
  hdr->version = segment_version;
  hdr->owner_rank = rank;
  hdr->owner_pid = ::getpid();
  hdr->slot_bytes = g.slot_bytes;
  hdr->depth = g.depth;
  hdr->slot_stride = g.slot_stride;
  hdr->fifo_bytes = g.fifo_bytes;
  hdr->fifo_count = peers.size();
  hdr->total_bytes = total;
  auto* dir = reinterpret_cast<fifo_entry*>(map.base() + g.directory_offset());
  for (std::size_t i = 0; i < peers.size(); ++i) {
    const std::size_t offset = g.first_fifo_offset(peers.size()) + i * g.fifo_bytes;
    new (&dir[i]) fifo_entry{peers[i], 0, offset};
    new (map.base() + offset) fifo_control{};
  }
  for (std::size_t i = 0; i < g.depth; ++i)
    new (map.base() + g.pool_offset(peers.size()) + i * sizeof(chunk_control)) chunk_control{};
  return map;
}

// Opens and maps a peer's segment, checks it is what the peer announced and shaped
// like ours, and returns the offset of the FIFO that this rank (`me`) writes into.
inline mapping open_segment(const std::string& name, const geometry& g, int me, int peer, std::int64_t peer_pid,
                            std::size_t& my_fifo_offset) {
  unique_fd fd(::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0));
  if (fd.get() < 0) {
    const int e = errno;
    throw error(errc::system,
                "shm: cannot open rank " + std::to_string(peer) + "'s segment /dev/shm" + name + ": " + errno_text(e) +
                    "; if rank " + std::to_string(peer) +
                    " failed to connect, its own error says why. Ranks joined by shm must share /dev/shm and run as "
                    "the same user (for ranks on other hosts or "
                    "in other containers set distinct PLAIT_HOST_ID values so they use the network)",
                me, peer);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    const int e = errno;
    throw error(errc::system, "shm: fstat of /dev/shm" + name + " failed: " + errno_text(e), me, peer);
  }
  const auto bytes = static_cast<std::size_t>(st.st_size);
  if (bytes < sizeof(segment_header))
    throw error(errc::protocol,
                "shm: rank " + std::to_string(peer) + "'s segment is only " + std::to_string(bytes) +
                    " bytes: it is not a plait segment",
                me, peer);
  mapping map = map_shared(fd.get(), bytes, name, me, peer);
  const segment_header& h = *map.header();
  auto bad = [&](const std::string& what) {
    return error(errc::protocol, "shm: rank " + std::to_string(peer) + "'s segment /dev/shm" + name + " " + what, me,
                 peer);
  };
  if (h.magic != segment_magic || h.version != segment_version)
    throw bad("is not a plait segment of wire version " + std::to_string(segment_version) +
              " (do all ranks run the same plait build?)");
  if (h.owner_rank != peer || h.owner_pid != peer_pid)
    throw bad("belongs to rank " + std::to_string(h.owner_rank) + " pid " + std::to_string(h.owner_pid) +
              ", not to rank " + std::to_string(peer) + " pid " + std::to_string(peer_pid) +
              " as announced (two jobs with the same key?)");
  if (h.slot_bytes != g.slot_bytes || h.depth != g.depth)
    throw error(errc::mismatch,
                "shm: rank " + std::to_string(peer) + " uses " + std::to_string(h.depth) + " slots of " +
                    std::to_string(h.slot_bytes) + " bytes, this rank " + std::to_string(g.depth) + " of " +
                    std::to_string(g.slot_bytes) +
                    ": set the same slice sizes (PLAIT_SLICE_BYTES, PLAIT_COPY_SLICE_BYTES) on every rank",
                me, peer);
  if (h.slot_stride != g.slot_stride || h.fifo_bytes != g.fifo_bytes || h.total_bytes != bytes ||
      h.fifo_count > bytes / g.fifo_bytes || g.total_bytes(h.fifo_count) != bytes)
    throw bad("has an inconsistent layout (" + std::to_string(bytes) + " bytes for " + std::to_string(h.fifo_count) +
              " FIFOs)");
  const auto* dir = reinterpret_cast<const fifo_entry*>(map.base() + g.directory_offset());
  for (std::uint64_t i = 0; i < h.fifo_count; ++i) {
    if (dir[i].peer != me) continue;
    if (dir[i].offset < g.first_fifo_offset(h.fifo_count) || dir[i].offset > bytes - g.fifo_bytes ||
        dir[i].offset % page != 0)
      throw bad("places this rank's FIFO outside the segment");
    my_fifo_offset = dir[i].offset;
    return map;
  }
  throw error(errc::invalid_argument,
              "shm: rank " + std::to_string(peer) + " has no FIFO for rank " + std::to_string(me) +
                  ": the peer lists passed to connect() are not symmetric",
              me, peer);
}

}  // namespace plait::transport::shm_detail
