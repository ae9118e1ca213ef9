// The TCP transport when things go wrong: a rank killed mid-stream, a rank that
// closes, a rank that finishes and leaves, connections without the token, ranks that
// disagree on the slot configuration, ranks that never show up.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/socket.h>

#include <cstring>
#include <string>
#include <thread>

#include <plait/bootstrap/auth.hpp>
#include <plait/transport/tcp.hpp>
#include <support/file_bootstrap.hpp>

#include "tcp_test_support.hpp"

using namespace std::chrono_literals;
using plait::testing::file_bootstrap;
using plait::testing::run_forked;
using plait::testing::temp_dir;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::string error_report(const plait::error& e) {
  return "error " + std::string(to_string(e.code())) + " peer " + std::to_string(e.peer()) + ": " + e.what();
}

long long ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t).count();
}

// The same as file_bootstrap, except for the token.
class other_token final : public plait::bootstrap_context {
 public:
  explicit other_token(file_bootstrap& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  void put(std::string_view k, std::span<const std::byte> v) override { inner_.put(k, v); }
  std::vector<std::byte> get(std::string_view k, plait::clock::time_point d) override { return inner_.get(k, d); }
  void barrier(std::string_view n, plait::clock::time_point d) override { inner_.barrier(n, d); }
  std::span<const std::byte> token() const override { return token_; }
  std::string host_id() const override { return inner_.host_id(); }
  std::string listen_address() const override { return inner_.listen_address(); }
  std::string job_key() const override { return inner_.job_key(); }

 private:
  file_bootstrap& inner_;
  std::vector<std::byte> token_ = std::vector<std::byte>(32, std::byte{0x41});
};

// Streams pattern slots to every peer and reads theirs, checking every link's health
// on every round, until health(victim) throws. Returns the error.
plait::error stream_until_lost(plait::link_set& links, plait::detail::doorbell& bell, int rank,
                               const std::vector<int>& peers, int victim, std::chrono::seconds bound) {
  std::vector<std::uint64_t> sent(peers.size(), 0), received(peers.size(), 0);
  const std::size_t slot_bytes = links.slot_bytes();
  const auto deadline = std::chrono::steady_clock::now() + bound;
  for (;;) {
    const std::uint32_t seen = bell.snapshot();
    for (std::size_t i = 0; i < peers.size(); ++i) {
      const int p = peers[i];
      if (std::byte* slot = links.acquire(p)) {
        const std::size_t n = plait::testing::pattern_size(rank, p, sent[i], slot_bytes);
        plait::testing::fill_pattern(slot, n, rank, p, sent[i]);
        links.post(p, plait::testing::pattern_header(rank, sent[i]++, n));
      }
      if (auto v = links.peek(p); v.header != nullptr) {
        if (auto bad = plait::testing::check_pattern(v, p, rank, received[i], slot_bytes); !bad.empty())
          throw std::runtime_error(bad);
        links.release(p);
        ++received[i];
      }
      try {
        links.health(p);
      } catch (const plait::error& e) {
        if (p == victim) return e;
        throw;
      }
    }
    if (std::chrono::steady_clock::now() > deadline) throw std::runtime_error("the victim's loss was never reported");
    bell.wait(seen, 10ms);
  }
}

}  // namespace

TEST_CASE("tcp a rank killed mid-stream is peer_lost on every other rank within 1 s", "[tcp][faults]") {
  temp_dir dir;
  const int n = 3, victim = 2;
  const auto out = run_forked(
      n,
      [&](int rank) -> std::string {
        file_bootstrap ctx(dir.path, rank, n);
        plait::detail::doorbell bell;
        const auto peers = plait::testing::all_but(rank, n);
        auto links = plait::transport::tcp::connect(ctx, bell, plait::link_config{4096, 4, 20s}, peers);
        if (rank == victim) {
          // Take part for a while, then die without a word.
          if (auto bad = plait::testing::exchange_all(*links, bell, rank, peers, 20, 20s); !bad.empty()) return bad;
          plait::testing::write_time(dir.path / "killed_at");
          ::kill(::getpid(), SIGKILL);
          return "still alive";
        }
        const plait::error e = stream_until_lost(*links, bell, rank, peers, victim, 20s);
        const auto killed_at = plait::testing::read_time(dir.path / "killed_at");
        const auto after =
            std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - killed_at);
        // The other survivor may still be streaming to this one: leave only when both know.
        plait::testing::touch(dir.path / ("knows." + std::to_string(rank)));
        for (int r = 0; r < n; ++r)
          if (r != victim) plait::testing::wait_for_file(dir.path / ("knows." + std::to_string(r)), 10s);
        return error_report(e) + " | after " + std::to_string(after.count()) + " ms";
      },
      60s);
  REQUIRE(!out[victim].exited);
  REQUIRE(out[victim].signal == SIGKILL);
  for (int r = 0; r < n; ++r) {
    if (r == victim) continue;
    INFO(out[r].describe());
    CHECK(out[r].ok());
    CHECK(contains(out[r].report, "error peer_lost peer 2:"));
    CHECK(contains(out[r].report, "rank 2 "));
    const auto at = out[r].report.rfind("after ");
    REQUIRE(at != std::string::npos);
    CHECK(std::stoll(out[r].report.substr(at + 6)) < 1000);
  }
}

TEST_CASE("tcp a rank's close() is peer_lost within 1 s for a rank waiting on it", "[tcp][faults]") {
  temp_dir dir;
  const auto out = run_forked(
      2,
      [&](int rank) -> std::string {
        file_bootstrap ctx(dir.path, rank, 2);
        plait::detail::doorbell bell;
        const int peer = 1 - rank;
        auto links = plait::transport::tcp::connect(ctx, bell, plait::link_config{512, 4, 20s}, std::span(&peer, 1));
        if (auto bad = plait::testing::exchange_all(*links, bell, rank, std::span(&peer, 1), 50, 20s); !bad.empty())
          return bad;
        if (rank == 1) {
          plait::testing::write_time(dir.path / "closed_at");
          links->close();
          std::string own;
          try {
            links->health(0);
            own = "health() after close() did not throw";
          } catch (const plait::error& e) {
            own = std::string("own ") + std::string(to_string(e.code()));
          }
          plait::testing::wait_for_file(dir.path / "done.0", 10s);  // stay alive: only close() may tell rank 0
          return own;
        }
        // Rank 0 waits for one more slot that will never come.
        const auto deadline = std::chrono::steady_clock::now() + 10s;
        std::string result = "never reported";
        while (std::chrono::steady_clock::now() < deadline) {
          const auto seen = bell.snapshot();
          if (links->peek(1).header != nullptr) return "an unexpected slot";
          try {
            links->health(1);
          } catch (const plait::error& e) {
            const auto closed_at = plait::testing::read_time(dir.path / "closed_at");
            result = error_report(e) + " | after " + std::to_string(ms_since(closed_at)) + " ms";
            break;
          }
          bell.wait(seen, 10ms);
        }
        plait::testing::touch(dir.path / "done.0");
        return result;
      },
      60s);
  INFO(plait::testing::describe_all(out));
  REQUIRE(out[0].ok());
  REQUIRE(out[1].ok());
  CHECK(out[1].report == "own aborted");
  INFO(out[0].report);
  CHECK(contains(out[0].report, "error peer_lost peer 1:"));
  CHECK(contains(out[0].report, "rank 1 closed its connection"));
  const auto at = out[0].report.rfind("after ");
  REQUIRE(at != std::string::npos);
  CHECK(std::stoll(out[0].report.substr(at + 6)) < 1000);
}

TEST_CASE("tcp a rank that finished and left still delivers its last slots; waiting for more is peer_lost",
          "[tcp][faults]") {
  temp_dir dir;
  const auto out = run_forked(
      2,
      [&](int rank) -> std::string {
        file_bootstrap ctx(dir.path, rank, 2);
        plait::detail::doorbell bell;
        const int peer = 1 - rank;
        auto links = plait::transport::tcp::connect(ctx, bell, plait::link_config{512, 4, 20s}, std::span(&peer, 1));
        if (rank == 1) {
          for (std::uint64_t i = 0; i < 4; ++i) {
            std::byte* slot = links->acquire(0);
            if (slot == nullptr) return "no slot " + std::to_string(i);
            plait::testing::fill_pattern(slot, 100, 1, 0, i);
            links->post(0, plait::testing::pattern_header(1, i, 100));
          }
          links.reset();  // leaves at once; the slots must still arrive
          plait::testing::touch(dir.path / "left.1");
          return "ok";
        }
        if (!plait::testing::wait_for_file(dir.path / "left.1", 10s)) return "rank 1 never left";
        std::this_thread::sleep_for(100ms);  // its closing and end of stream have arrived by now
        for (std::uint64_t i = 0; i < 4; ++i) {
          const auto v = links->peek(1);
          if (v.header == nullptr) return "slot " + std::to_string(i) + " missing";
          try {
            links->health(1);
          } catch (const plait::error& e) {
            return "health() threw while slot " + std::to_string(i) + " was unread: " + e.what();
          }
          if (v.header->bytes != 100 || v.header->desc.sequence != i) return "slot " + std::to_string(i) + " is wrong";
          for (std::size_t j = 0; j < 100; ++j)
            if (v.payload[j] != plait::testing::pattern_byte(1, 0, i, j)) return "payload of " + std::to_string(i);
          links->release(1);
        }
        try {
          links->health(1);
        } catch (const plait::error& e) {
          return error_report(e);
        }
        return "waiting for a fifth slot was not an error";
      },
      60s);
  for (const auto& o : out) {
    INFO(o.describe());
    CHECK(o.ok());
  }
  CHECK(out[1].report == "ok");
  INFO(out[0].report);
  CHECK(contains(out[0].report, "error peer_lost peer 1:"));
}

TEST_CASE("tcp connections without the token are refused and the job goes on", "[tcp][faults]") {
  temp_dir dir;
  const int ranks = 3, target = 2;
  // Rank 3 of this run is the impostor: it attacks rank 2's published port before rank 0
  // connects, and keeps one silent connection open throughout.
  const auto out = run_forked(
      ranks + 1,
      [&](int who) -> std::string {
        using plait::detail::fd_handle;
        if (who < ranks) {
          file_bootstrap ctx(dir.path, who, ranks);
          plait::detail::doorbell bell;
          if (who == 0 && !plait::testing::wait_for_file(dir.path / "go", 30s)) return "the impostor never finished";
          const auto peers = plait::testing::all_but(who, ranks);
          auto links = plait::transport::tcp::connect(ctx, bell, plait::link_config{700, 3, 30s}, peers);
          auto bad = plait::testing::exchange_all(*links, bell, who, peers, 100, 30s);
          return bad.empty() ? "ok" : bad;
        }
        file_bootstrap ctx(dir.path, target, ranks);  // only to read the published address
        const auto raw = ctx.get("tcp/" + std::to_string(target), plait::clock::now() + 20s);
        const auto [host, port] =
            plait::detail::parse_host_port(std::string(reinterpret_cast<const char*>(raw.data()), raw.size()));
        auto refused = [&](int fd) {  // the server ends the connection within 5 s
          char buf[256];
          const auto until = plait::clock::now() + 5s;
          for (;;) {
            pollfd p{fd, POLLIN, 0};
            if (::poll(&p, 1, 100) == 1) {
              const ssize_t k = ::recv(fd, buf, sizeof buf, 0);
              if (k <= 0) return true;
            }
            if (plait::clock::now() > until) return false;
          }
        };
        std::string report;
        {  // garbage instead of a handshake
          fd_handle fd = plait::detail::connect_tcp(host, port, plait::clock::now() + 5s);
          const char junk[] = "GET / HTTP/1.0\r\n\r\n\x01\x02\x03 not a plait handshake at all";
          plait::detail::send_all(fd.get(), junk, sizeof junk, plait::clock::now() + 5s);
          report += refused(fd.get()) ? "garbage refused; " : "garbage NOT refused; ";
        }
        {  // a proper handshake with the wrong token
          fd_handle fd = plait::detail::connect_tcp(host, port, plait::clock::now() + 5s);
          const std::vector<std::byte> wrong(32, std::byte{0x13});
          try {
            plait::bootstrap::authenticate(fd.get(), wrong, plait::bootstrap::auth_role::client, "plait-tcp",
                                           plait::clock::now() + 5s);
            report += "wrong token ACCEPTED; ";
          } catch (const plait::error& e) {
            report +=
                e.code() == plait::errc::auth ? "wrong token refused; " : "wrong token: " + error_report(e) + "; ";
          }
        }
        {  // the right token, then a hello claiming a rank that does not exist
          fd_handle fd = plait::detail::connect_tcp(host, port, plait::clock::now() + 5s);
          plait::bootstrap::authenticate(fd.get(), ctx.token(), plait::bootstrap::auth_role::client, "plait-tcp",
                                         plait::clock::now() + 5s);
          plait::transport::tcp_detail::tcp_hello h;
          h.rank = 7;
          h.peer = target;
          plait::detail::send_all(fd.get(), &h, sizeof h, plait::clock::now() + 5s);
          report += refused(fd.get()) ? "bad hello refused; " : "bad hello NOT refused; ";
        }
        fd_handle silent = plait::detail::connect_tcp(host, port, plait::clock::now() + 5s);
        plait::testing::touch(dir.path / "go");
        // Once rank 2 has its peers it stops listening and drops the silent connection
        // (after the opening of its handshake, which is all this connection ever gets).
        std::size_t handshake_bytes = 0;
        bool dropped = false;
        const auto until = plait::clock::now() + 30s;
        while (!dropped && plait::clock::now() < until) {
          char buf[256];
          pollfd p{silent.get(), POLLIN, 0};
          if (::poll(&p, 1, 100) != 1) continue;
          const ssize_t k = ::recv(silent.get(), buf, sizeof buf, 0);
          if (k <= 0)
            dropped = true;
          else
            handshake_bytes += static_cast<std::size_t>(k);
        }
        report += dropped ? "silent dropped" : "silent NOT dropped";
        if (handshake_bytes > 40) report += " after " + std::to_string(handshake_bytes) + " bytes";
        return report;
      },
      90s);
  for (int r = 0; r < ranks; ++r) {
    INFO(out[r].describe());
    CHECK(out[r].ok());
    CHECK(out[r].report == "ok");
  }
  INFO(out[ranks].describe());
  CHECK(out[ranks].ok());
  CHECK(out[ranks].report == "garbage refused; wrong token refused; bad hello refused; silent dropped");
}

TEST_CASE("tcp a rank with another token is refused: auth on one side, timeout naming it on the other",
          "[tcp][faults]") {
  temp_dir dir;
  const auto out = run_forked(
      2,
      [&](int rank) -> std::string {
        file_bootstrap files(dir.path, rank, 2);
        other_token wrong(files);
        plait::bootstrap_context& ctx = rank == 0 ? static_cast<plait::bootstrap_context&>(wrong) : files;
        plait::detail::doorbell bell;
        const int peer = 1 - rank;
        try {
          auto links = plait::transport::tcp::connect(ctx, bell, plait::link_config{512, 4, 2s}, std::span(&peer, 1));
        } catch (const plait::error& e) {
          return error_report(e);
        }
        return "connected";
      },
      60s);
  INFO(plait::testing::describe_all(out));
  CHECK(contains(out[0].report, "error auth peer 1:"));
  CHECK(contains(out[1].report, "error timeout"));
  CHECK(contains(out[1].report, "rank(s) 0 never connected"));
  CHECK(contains(out[1].report, "refused"));
}

TEST_CASE("tcp ranks that disagree on slot size or depth both fail with invalid_argument naming both",
          "[tcp][faults]") {
  temp_dir dir;
  const auto out = run_forked(
      2,
      [&](int rank) -> std::string {
        file_bootstrap ctx(dir.path, rank, 2);
        plait::detail::doorbell bell;
        const int peer = 1 - rank;
        try {
          auto links = plait::transport::tcp::connect(ctx, bell, plait::link_config{512, rank == 0 ? 4u : 8u, 10s},
                                                      std::span(&peer, 1));
        } catch (const plait::error& e) {
          return error_report(e);
        }
        return "connected";
      },
      60s);
  for (const auto& o : out) {
    INFO(o.describe());
    CHECK(contains(o.report, "error invalid_argument"));
    CHECK(contains(o.report, "depth 4"));
    CHECK(contains(o.report, "depth 8"));
  }
}

TEST_CASE("tcp a rank that never starts is a timeout naming it", "[tcp][faults]") {
  temp_dir dir;
  plait::detail::doorbell bell;
  const int peer_of_1 = 0, peer_of_0 = 1;
  SECTION("the acceptor names the rank that never connected") {
    file_bootstrap ctx(dir.path, 1, 2);
    const auto start = std::chrono::steady_clock::now();
    try {
      plait::transport::tcp::connect(ctx, bell, plait::link_config{512, 4, 500ms}, std::span(&peer_of_1, 1));
      FAIL("connect() returned without rank 0");
    } catch (const plait::error& e) {
      INFO(e.what());
      CHECK(e.code() == plait::errc::timeout);
      CHECK(contains(e.what(), "rank(s) 0 never connected"));
    }
    CHECK(ms_since(start) < 3000);
  }
  SECTION("the connector names the rank that never published its address") {
    file_bootstrap ctx(dir.path, 0, 2);
    try {
      plait::transport::tcp::connect(ctx, bell, plait::link_config{512, 4, 500ms}, std::span(&peer_of_0, 1));
      FAIL("connect() returned without rank 1");
    } catch (const plait::error& e) {
      INFO(e.what());
      CHECK(e.code() == plait::errc::timeout);
      CHECK(e.peer() == 1);
      CHECK(contains(e.what(), "rank 1 never published its TCP address"));
    }
  }
  SECTION("bad arguments are refused before any connection") {
    file_bootstrap ctx(dir.path, 0, 2);
    const int self = 0, out_of_range = 2;
    CHECK_THROWS_AS(plait::transport::tcp::connect(ctx, bell, plait::link_config{512, 4, 1s}, std::span(&self, 1)),
                    plait::error);
    CHECK_THROWS_AS(
        plait::transport::tcp::connect(ctx, bell, plait::link_config{512, 4, 1s}, std::span(&out_of_range, 1)),
        plait::error);
    CHECK_THROWS_AS(plait::transport::tcp::connect(ctx, bell, plait::link_config{0, 4, 1s}, std::span(&peer_of_0, 1)),
                    plait::error);
    CHECK_THROWS_AS(plait::transport::tcp::connect(ctx, bell, plait::link_config{512, 0, 1s}, std::span(&peer_of_0, 1)),
                    plait::error);
  }
}
