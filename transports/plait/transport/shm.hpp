// plait::transport::shm: ranks on one host exchange slots through POSIX shared memory.
//
// Each rank creates one segment holding its doorbell and one receive FIFO per peer;
// a sender writes straight into the FIFO in the receiver's segment, so the kernel
// that fills a slot makes the only copy (layout: detail/shm_segment.hpp; the FIFO
// protocol and error rules: detail/shm_links.hpp).
//
// connect() is collective over the bootstrap context (every rank calls it, with an
// empty `peers` if it reaches nobody by shm) and blocks until every rank has mapped
// its peers' segments or cfg.connect_timeout passes (timeout from the bootstrap).
// Steps: create and map the own segment and bind the doorbell into it; publish
// pid, PID namespace and host under "shm/<rank>"; barrier "shm-created"; map every
// peer's segment and open a pidfd on its process; barrier "shm-mapped"; unlink the
// own segment's name. After connect returns, /dev/shm holds nothing of this job,
// and a rank killed at any later point leaks nothing. A rank killed during
// connect can leave its /dev/shm/plait-<job key>-<rank> behind.
// Peers must run as the same user (segments are mode 0600), share /dev/shm and a
// PID namespace (liveness uses pidfds); connect checks the last and says so.
// Where a rank can read its peers' memory (CMA), large plain sends on huge pages
// go by reference and the receiver makes the only copy (detail/shm_single_copy.hpp);
// connect probes that per pair, and link_config::single_copy = false turns it off.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

#include <plait/transport.hpp>
#include <plait/transport/detail/shm_links.hpp>
#include <plait/transport/detail/shm_segment.hpp>
#include <plait/transport/detail/shm_single_copy.hpp>

namespace plait::transport {

namespace shm_detail {

// What a rank announces about itself under "shm/<rank>".
struct announcement {
  std::uint32_t version = segment_version;
  std::int32_t rank = -1;
  std::int64_t pid = 0;
  std::uint64_t pidns_dev = 0;  // 0 when /proc is not readable: the check is skipped
  std::uint64_t pidns_ino = 0;
  std::uint64_t slot_bytes = 0;
  std::uint64_t depth = 0;
  std::uint64_t probe_address = 0;  // a word peers read by CMA to test that path (shm_single_copy.hpp)
  std::uint64_t probe_value = 0;
  char host[64] = {};
};

inline announcement announce_self(int rank, const geometry& g, const std::string& host) {
  announcement a;
  a.rank = rank;
  a.slot_bytes = g.slot_bytes;
  a.depth = g.depth;
  a.pid = ::getpid();
  a.probe_address = reinterpret_cast<std::uintptr_t>(probe_address());
  a.probe_value = *probe_address();
  struct stat st {};
  if (::stat("/proc/self/ns/pid", &st) == 0) {
    a.pidns_dev = static_cast<std::uint64_t>(st.st_dev);
    a.pidns_ino = static_cast<std::uint64_t>(st.st_ino);
  }
  std::memcpy(a.host, host.data(), std::min(host.size(), sizeof a.host - 1));
  return a;
}

inline void check_peer(const announcement& mine, const announcement& theirs, std::size_t got_bytes, int peer) {
  const int me = mine.rank;
  if (got_bytes != sizeof(announcement) || theirs.version != segment_version || theirs.rank != peer)
    throw error(errc::protocol,
                "shm: rank " + std::to_string(peer) + "'s announcement is malformed (" + std::to_string(got_bytes) +
                    " bytes): do all ranks run the same plait build?",
                me, peer);
  // Checked here, not only on the segment: every rank sees the store's copy, even
  // after the peer failed and removed its segment.
  if (theirs.slot_bytes != mine.slot_bytes || theirs.depth != mine.depth)
    throw error(errc::mismatch,
                "shm: rank " + std::to_string(peer) + " uses " + std::to_string(theirs.depth) + " slots of " +
                    std::to_string(theirs.slot_bytes) + " bytes, this rank " + std::to_string(mine.depth) + " of " +
                    std::to_string(mine.slot_bytes) +
                    ": set the same slice sizes (PLAIT_SLICE_BYTES, PLAIT_COPY_SLICE_BYTES) on every rank",
                me, peer);
  if (std::strncmp(mine.host, theirs.host, sizeof mine.host) != 0)
    throw error(errc::invalid_argument,
                std::string("shm: rank ") + std::to_string(peer) + " is on host '" +
                    std::string(theirs.host, strnlen(theirs.host, sizeof theirs.host)) + "', this rank on '" +
                    std::string(mine.host, strnlen(mine.host, sizeof mine.host)) +
                    "': shm reaches only ranks on one host (use hybrid<shm, tcp>)",
                me, peer);
  if (mine.pidns_ino != 0 && theirs.pidns_ino != 0 &&
      (mine.pidns_dev != theirs.pidns_dev || mine.pidns_ino != theirs.pidns_ino))
    throw error(errc::unsupported,
                "shm: rank " + std::to_string(peer) +
                    " runs in another PID namespace (another container?), so its liveness cannot be watched: "
                    "share the PID namespace, or give the containers distinct PLAIT_HOST_ID values so they use "
                    "the network",
                me, peer);
}

inline std::unique_ptr<link_set> connect(bootstrap_context& ctx, plait::detail::doorbell& bell, const link_config& cfg,
                                         std::span<const int> peers) {
  const int me = ctx.rank();
  const int size = ctx.size();
  std::vector<bool> seen(static_cast<std::size_t>(size), false);
  for (int p : peers) {
    if (p < 0 || p >= size || p == me || seen[static_cast<std::size_t>(p)])
      throw error(errc::invalid_argument,
                  "shm: bad peer list: rank " + std::to_string(p) + " is out of range [0, " + std::to_string(size) +
                      "), this rank, or listed twice",
                  me, p);
    seen[static_cast<std::size_t>(p)] = true;
  }
  // A zero timeout means "not set": the library's default (PLAIT_TIMEOUT's default).
  const auto timeout =
      cfg.connect_timeout.count() > 0 ? cfg.connect_timeout : std::chrono::nanoseconds(std::chrono::seconds(600));
  const auto deadline = clock::now() + timeout;
  const geometry g = make_geometry(cfg.slot_bytes, cfg.depth, peers.size(), me);

  auto set = std::make_unique<shm_link_set>(me, size, g, bell, cfg.single_copy);
  if (!peers.empty()) set->create_own(segment_name_of(ctx.job_key(), me), peers);
  const announcement mine = announce_self(me, g, ctx.host_id());
  ctx.put("shm/" + std::to_string(me), std::as_bytes(std::span(&mine, 1)));
  ctx.barrier("shm-created", deadline);

  for (std::size_t i = 0; i < peers.size(); ++i) {
    const int p = peers[i];
    const std::vector<std::byte> raw = ctx.get("shm/" + std::to_string(p), deadline);
    announcement theirs;
    if (!raw.empty()) std::memcpy(&theirs, raw.data(), std::min(raw.size(), sizeof theirs));
    check_peer(mine, theirs, raw.size(), p);
    set->attach(p, theirs.pid, segment_name_of(ctx.job_key(), p), i, theirs.probe_address, theirs.probe_value);
  }
  ctx.barrier("shm-mapped", deadline);
  set->unlink_own();
  return set;
}

}  // namespace shm_detail

struct shm {
  static constexpr transport_traits traits{
      .device_memory = false, .one_sided = true, .zero_copy = true, .shares_copies = true};
  static constexpr std::string_view name = "shm";

  // Collective; blocks until all ranks are connected or cfg.connect_timeout passes.
  static std::unique_ptr<link_set> connect(bootstrap_context& ctx, plait::detail::doorbell& bell,
                                           const link_config& cfg, std::span<const int> peers) {
    return shm_detail::connect(ctx, bell, cfg, peers);
  }
};

}  // namespace plait::transport

static_assert(plait::transport_for<plait::transport::shm>);
