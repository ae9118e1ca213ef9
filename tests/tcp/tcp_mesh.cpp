// The TCP transport between real processes: full meshes of 2 to 8 ranks exchanging
// recognisable slots of every size, and a bulk transfer through large slots.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include <plait/transport/tcp.hpp>
#include <support/file_bootstrap.hpp>

#include "tcp_test_support.hpp"

using namespace std::chrono_literals;
using plait::testing::run_forked;
using plait::testing::temp_dir;

namespace {

std::string mesh_rank(const std::filesystem::path& dir, int rank, int n, std::size_t slot_bytes, std::size_t depth,
                      std::uint64_t count) {
  plait::testing::file_bootstrap ctx(dir, rank, n);
  plait::detail::doorbell bell;
  bell.set_spin(plait::detail::doorbell::oversubscribed_spin);
  const plait::link_config cfg{slot_bytes, depth, 30s};
  const auto peers = plait::testing::all_but(rank, n);
  auto links = plait::transport::tcp::connect(ctx, bell, cfg, peers);
  for (int p = 0; p < n; ++p)
    if (links->reaches(p) != (p != rank)) throw std::runtime_error("reaches(" + std::to_string(p) + ") is wrong");
  if (links->slot_bytes() != slot_bytes) throw std::runtime_error("slot_bytes() is wrong");
  // No barrier before the link set goes: a rank that finishes first must not disturb
  // the others (its last slots are still delivered, its closing is no error to them).
  if (auto bad = plait::testing::exchange_all(*links, bell, rank, peers, count, 90s); !bad.empty())
    throw std::runtime_error(bad);
  return "ok";
}

void check_all(const std::vector<plait::testing::rank_outcome>& out) {
  for (const auto& o : out) {
    INFO(o.describe());
    CHECK(o.ok());
    CHECK(o.report == "ok");
  }
}

std::uint64_t word_of(int sender, std::uint64_t slot, std::uint64_t word) {
  return ((slot << 32) | word) ^ (static_cast<std::uint64_t>(sender + 1) * 0x9E3779B97F4A7C15ull);
}

// Both ranks send `total` bytes to each other at once and check every word.
std::string bulk_rank(const std::filesystem::path& dir, int rank, std::size_t slot_bytes, std::size_t depth,
                      std::size_t total) {
  plait::testing::file_bootstrap ctx(dir, rank, 2);
  plait::detail::doorbell bell;
  bell.set_spin(plait::detail::doorbell::oversubscribed_spin);
  const plait::link_config cfg{slot_bytes, depth, 30s};
  const int peer = 1 - rank;
  auto links = plait::transport::tcp::connect(ctx, bell, cfg, std::span(&peer, 1));
  const std::uint64_t slots = total / slot_bytes, words = slot_bytes / 8;
  std::uint64_t sent = 0, received = 0;
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + 90s;
  while (sent < slots || received < slots) {
    const std::uint32_t seen = bell.snapshot();
    bool moved = false;
    if (sent < slots) {
      if (std::byte* slot = links->acquire(peer)) {
        auto* w = reinterpret_cast<std::uint64_t*>(slot);
        for (std::uint64_t i = 0; i < words; ++i) w[i] = word_of(rank, sent, i);
        links->post(peer, plait::testing::pattern_header(rank, sent, slot_bytes));
        ++sent;
        moved = true;
      }
    }
    if (received < slots) {
      if (auto v = links->peek(peer); v.header != nullptr) {
        if (v.header->bytes != slot_bytes || v.header->desc.sequence != received)
          return "slot " + std::to_string(received) + " has bytes " + std::to_string(v.header->bytes) + " sequence " +
                 std::to_string(v.header->desc.sequence);
        auto* w = reinterpret_cast<const std::uint64_t*>(v.payload);
        for (std::uint64_t i = 0; i < words; ++i)
          if (w[i] != word_of(peer, received, i))
            return "slot " + std::to_string(received) + " word " + std::to_string(i) + " is wrong";
        links->release(peer);
        ++received;
        moved = true;
      }
    }
    if (moved) continue;
    links->health(peer);
    if (std::chrono::steady_clock::now() > deadline)
      return "timed out after " + std::to_string(sent) + " sent, " + std::to_string(received) + " received";
    bell.wait(seen, 10ms);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  char buf[64];
  std::snprintf(buf, sizeof buf, "ok %.1f", static_cast<double>(total) / seconds / 1e6);
  return buf;
}

}  // namespace

TEST_CASE("tcp full mesh: every rank streams 500 slots of every size to every peer, in order", "[tcp][mesh]") {
  const int n = GENERATE(2, 3, 4, 8);
  CAPTURE(n);
  temp_dir dir;
  check_all(run_forked(
      n, [&](int r) { return mesh_rank(dir.path, r, n, 1000, 4, 500); }, 150s));
}

TEST_CASE("tcp with depth 1 and one-byte slots still delivers every slot in order", "[tcp][mesh]") {
  temp_dir dir;
  check_all(run_forked(
      2, [&](int r) { return mesh_rank(dir.path, r, 2, 1, 1, 500); }, 60s));
}

TEST_CASE("tcp moves 64 MiB each way between 2 ranks through 512 KiB slots with depth 4", "[tcp][bulk]") {
  temp_dir dir;
  const auto out = run_forked(
      2, [&](int r) { return bulk_rank(dir.path, r, 512 * 1024, 4, std::size_t{64} << 20); }, 120s);
  for (const auto& o : out) {
    INFO(o.describe());
    CHECK(o.ok());
    REQUIRE(o.report.rfind("ok ", 0) == 0);
    std::printf("tcp bulk: rank %d received 64 MiB at %s MB/s (while sending 64 MiB)\n", o.rank, o.report.c_str() + 3);
  }
}
