// Socket utilities: address parsing, loopback detection, deadlines and peer loss.
#include <catch2/catch.hpp>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <plait/detail/socket.hpp>

#include "bootstrap_support.hpp"

using namespace std::chrono_literals;
using clk = plait::clock;
using plait::errc;
using plait::testing::caught;
namespace d = plait::detail;

namespace {}  // namespace

TEST_CASE("parse_host_port reads host:port and [v6]:port", "[socket]") {
  CHECK(d::parse_host_port("127.0.0.1:29500") == std::pair<std::string, std::uint16_t>{"127.0.0.1", 29500});
  CHECK(d::parse_host_port("node-7.cluster:1") == std::pair<std::string, std::uint16_t>{"node-7.cluster", 1});
  CHECK(d::parse_host_port("[::1]:65535") == std::pair<std::string, std::uint16_t>{"::1", 65535});
  for (const char* bad : {"", "host", "host:", ":80", "host:65536", "host:8x", "host:-1", "::1:80", "[::1]80",
                          "[::1:80", "host:123456"}) {
    CAPTURE(bad);
    auto e = caught([&] { d::parse_host_port(bad); });
    CHECK(e.code() == errc::invalid_argument);
    CHECK_THAT(e.what(), Catch::Contains("'" + std::string(bad) + "'"));
  }
}

TEST_CASE("is_loopback_address knows 127/8, ::1 and localhost", "[socket]") {
  for (const char* yes : {"127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost", "::ffff:127.0.0.1"}) {
    CAPTURE(yes);
    CHECK(d::is_loopback_address(yes));
  }
  for (const char* no : {"10.0.0.1", "128.0.0.1", "0.0.0.0", "::", "example.org", "", "fe80::1"}) {
    CAPTURE(no);
    CHECK_FALSE(d::is_loopback_address(no));
  }
}

TEST_CASE("listen on an ephemeral port, connect, exchange bytes", "[socket]") {
  auto listener = d::listen_tcp("127.0.0.1", 0);
  auto port = d::local_port(listener.get());
  CHECK(port != 0);
  CHECK(d::local_address(listener.get()) == "127.0.0.1");
  auto client = d::connect_tcp("127.0.0.1", port, clk::now() + 2s);
  auto server = d::accept_until(listener.get(), clk::now() + 2s);
  CHECK(d::local_address(client.get()) == "127.0.0.1");

  std::vector<std::uint32_t> big(1 << 20);  // 4 MiB: more than the socket buffers hold
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<std::uint32_t>(i * 2654435761u);
  std::vector<std::uint32_t> got(big.size());
  std::thread sender([&] { d::send_all(client.get(), big.data(), big.size() * 4, clk::now() + 10s); });
  d::recv_all(server.get(), got.data(), got.size() * 4, clk::now() + 10s);
  sender.join();
  CHECK(got == big);
}

TEST_CASE("connect_tcp retries until the listener appears", "[socket]") {
  auto probe = d::listen_tcp("127.0.0.1", 0);
  auto port = d::local_port(probe.get());
  probe.reset();  // the port is free now; listen on it again a little later
  std::thread later([&] {
    std::this_thread::sleep_for(200ms);
    auto l = d::listen_tcp("127.0.0.1", port);
    auto s = d::accept_until(l.get(), clk::now() + 3s);
    char c = 'x';
    d::send_all(s.get(), &c, 1, clk::now() + 1s);
    std::this_thread::sleep_for(100ms);
  });
  auto c = d::connect_tcp("127.0.0.1", port, clk::now() + 3s);
  char got = 0;
  d::recv_all(c.get(), &got, 1, clk::now() + 2s);
  later.join();
  CHECK(got == 'x');
}

TEST_CASE("deadlines: connect, accept and recv time out; a closed peer is peer_lost", "[socket]") {
  auto probe = d::listen_tcp("127.0.0.1", 0);
  auto port = d::local_port(probe.get());
  probe.reset();
  auto start = clk::now();
  auto e = caught([&] { d::connect_tcp("127.0.0.1", port, clk::now() + 300ms); });
  CHECK(e.code() == errc::timeout);
  CHECK_THAT(e.what(), Catch::Contains("127.0.0.1:" + std::to_string(port)) && Catch::Contains("running"));
  CHECK(clk::now() - start < 2s);

  auto listener = d::listen_tcp("127.0.0.1", 0);
  CHECK(caught([&] { d::accept_until(listener.get(), clk::now() + 100ms); }).code() == errc::timeout);

  auto client = d::connect_tcp("127.0.0.1", d::local_port(listener.get()), clk::now() + 2s);
  auto server = d::accept_until(listener.get(), clk::now() + 2s);
  char buf[8];
  start = clk::now();
  CHECK(caught([&] { d::recv_all(server.get(), buf, sizeof buf, clk::now() + 200ms); }).code() == errc::timeout);
  CHECK(clk::now() - start >= 200ms);
  client.reset();
  CHECK(caught([&] { d::recv_all(server.get(), buf, sizeof buf, clk::now() + 2s); }).code() == errc::peer_lost);
  // Writing into a closed connection: the first send may still succeed; the next fails.
  std::vector<char> data(1 << 20);
  auto lost = caught([&] {
    for (int i = 0; i < 64; ++i) d::send_all(server.get(), data.data(), data.size(), clk::now() + 2s);
  });
  CHECK(lost.code() == errc::peer_lost);
}

TEST_CASE("send_all times out when the peer does not read", "[socket]") {
  auto listener = d::listen_tcp("127.0.0.1", 0);
  auto client = d::connect_tcp("127.0.0.1", d::local_port(listener.get()), clk::now() + 2s);
  auto server = d::accept_until(listener.get(), clk::now() + 2s);
  std::vector<char> data(64 << 20);
  auto start = clk::now();
  CHECK(caught([&] { d::send_all(client.get(), data.data(), data.size(), clk::now() + 300ms); }).code() ==
        errc::timeout);
  CHECK(clk::now() - start < 3s);
}

TEST_CASE("fd_handle owns and moves its descriptor", "[socket]") {
  d::fd_handle a(::dup(0));
  REQUIRE(a);
  int raw = a.get();
  d::fd_handle b(std::move(a));
  CHECK_FALSE(a);
  CHECK(b.get() == raw);
  int released = b.release();
  CHECK_FALSE(b);
  CHECK(released == raw);
  ::close(released);
}
