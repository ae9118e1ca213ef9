// The TCP transport between real processes: full meshes of 2 to 8 ranks exchanging
// recognisable slots of every size, a bulk transfer through large slots, and the
// congestion control of links on this host.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

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

// Each rank connects with host_congestion `wanted` and reports the congestion control
// of its sockets ("<peer>=<name>" each), after moving a few slots through them.
std::string congestion_rank(const std::filesystem::path& dir, int rank, int n, const std::string& wanted) {
  plait::testing::file_bootstrap ctx(dir, rank, n);
  plait::detail::doorbell bell;
  bell.set_spin(plait::detail::doorbell::oversubscribed_spin);
  plait::link_config cfg{1000, 4, 30s};
  cfg.host_congestion = wanted;
  const auto peers = plait::testing::all_but(rank, n);
  auto links = plait::transport::tcp::connect(ctx, bell, cfg, peers);
  const auto& set = dynamic_cast<const plait::transport::tcp_detail::tcp_link_set&>(*links);
  std::string report;
  for (int p : peers) report += std::to_string(p) + "=" + set.congestion(p) + " ";
  if (auto bad = plait::testing::exchange_all(*links, bell, rank, peers, 50, 60s); !bad.empty())
    throw std::runtime_error(bad);
  return report;
}

// The first line of a file under /proc/sys/net/ipv4, or "".
std::string ipv4_setting(const std::string& name) {
  std::ifstream f("/proc/sys/net/ipv4/" + name);
  std::string line;
  std::getline(f, line);
  return line;
}

}  // namespace

TEST_CASE("tcp links on this host run under link_config::host_congestion, or the system's when it is empty",
          "[tcp][mesh]") {
  const std::string system = ipv4_setting("tcp_congestion_control");
  REQUIRE_FALSE(system.empty());
  // Another algorithm this process may select besides the system's and reno, when
  // there is one (cubic as root on Debian): any name is seen to take effect.
  std::string other;
  std::istringstream available(ipv4_setting("tcp_available_congestion_control"));
  for (std::string name; available >> name && other.empty();) {
    if (name == system || name == "reno") continue;
    const plait::detail::fd_handle probe(::socket(AF_INET, SOCK_STREAM, 0));
    if (plait::detail::set_congestion(probe.get(), name) == 0) other = name;
  }
  CAPTURE(system, other);
  std::vector<std::pair<std::string, std::string>> cases = {{plait::link_config{}.host_congestion, "reno"},
                                                            {"", system}};
  if (!other.empty()) cases.emplace_back(other, other);
  for (const auto& [wanted, expected] : cases) {
    CAPTURE(wanted);
    temp_dir dir;
    const auto out = run_forked(
        3, [&](int r) { return congestion_rank(dir.path, r, 3, wanted); }, 60s);
    for (const auto& o : out) {
      INFO(o.describe());
      CHECK(o.ok());
      int links = 0;
      std::istringstream words(o.report);
      for (std::string w; words >> w; ++links) CHECK(w.substr(w.find('=') + 1) == expected);
      CHECK(links == 2);
    }
  }
}

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
