// The bootstrap store over loopback: operations, concurrency across threads and
// processes, waiting, deadlines, caps, and hostile or unauthenticated clients.
#include <catch2/catch.hpp>

#include <poll.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <plait/bootstrap/store.hpp>

#include "bootstrap_support.hpp"
#include "support/port_pipe.hpp"

using namespace std::chrono_literals;
using clk = plait::clock;
using plait::errc;
using plait::bootstrap::store_client;
using plait::bootstrap::store_server;
using plait::testing::caught;
namespace proto = plait::bootstrap::store_protocol;

namespace {

const std::vector<std::byte> token(32, std::byte{0x5a});

std::vector<std::byte> bytes(const std::string& s) {
  auto* p = reinterpret_cast<const std::byte*>(s.data());
  return std::vector<std::byte>(p, p + s.size());
}
std::string text(const std::vector<std::byte>& b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

clk::time_point in(std::chrono::milliseconds ms) { return clk::now() + ms; }

// True when the server closes fd within the deadline (EOF or reset).
bool closed_by_server(int fd, clk::time_point deadline) {
  std::byte buf[256];
  while (clk::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, plait::detail::poll_timeout_ms(deadline)) <= 0) continue;
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) return true;
  }
  return false;
}

// A connected, authenticated raw socket, for sending hand-made frames.
plait::detail::fd_handle raw_authenticated(std::uint16_t port) {
  auto fd = plait::detail::connect_tcp("127.0.0.1", port, in(2000ms));
  plait::bootstrap::authenticate(fd.get(), token, plait::bootstrap::auth_role::client, proto::auth_context, in(2000ms));
  return fd;
}

// The store still serves a well-behaved client promptly.
void check_still_serving(store_client& c, const std::string& key) {
  auto start = clk::now();
  c.set(key, bytes("fine"), in(2000ms));
  CHECK(text(c.get(key, in(2000ms))) == "fine");
  CHECK(clk::now() - start < 1s);
}

}  // namespace

TEST_CASE("set, get, try_get, add and del", "[store]") {
  store_server server("127.0.0.1", 0, token);
  store_client c("127.0.0.1", server.port(), token, in(2000ms));
  CHECK(c.local_address() == "127.0.0.1");

  c.set("a", bytes("alpha"), in(1000ms));
  CHECK(text(c.get("a", in(1000ms))) == "alpha");
  c.set("a", bytes("again"), in(1000ms));
  CHECK(text(c.get("a", in(1000ms))) == "again");
  c.set("empty", {}, in(1000ms));
  CHECK(c.get("empty", in(1000ms)).empty());
  CHECK_FALSE(c.try_get("missing", in(1000ms)).has_value());
  CHECK(text(c.try_get("a", in(1000ms)).value()) == "again");

  CHECK(c.add("n", 5, in(1000ms)) == 5);
  CHECK(c.add("n", -7, in(1000ms)) == -2);
  CHECK(c.add("n", 0, in(1000ms)) == -2);
  auto raw = c.get("n", in(1000ms));
  REQUIRE(raw.size() == 8);
  CHECK(proto::get_le(raw.data(), 8) == static_cast<std::uint64_t>(std::int64_t{-2}));

  c.del("a", in(1000ms));
  CHECK_FALSE(c.try_get("a", in(1000ms)).has_value());
  c.del("never-there", in(1000ms));

  // ADD on a value that is not an 8-byte counter is refused, and the client goes on.
  auto e = caught([&] { c.add("empty", 1, in(1000ms)); });
  CHECK(e.code() == errc::invalid_argument);
  CHECK_THAT(e.what(), Catch::Contains("counter"));
  CHECK(c.add("n", 2, in(1000ms)) == 0);

  // The server publishes its instance id.
  CHECK(text(c.get(std::string(proto::instance_key), in(1000ms))) == server.instance_id());
  CHECK(server.instance_id().size() == 32);

  // Keys and values beyond the caps are refused locally.
  CHECK(caught([&] { c.set(std::string(513, 'k'), bytes("x"), in(1000ms)); }).code() == errc::invalid_argument);
  CHECK(caught([&] { c.set("", bytes("x"), in(1000ms)); }).code() == errc::invalid_argument);
}

TEST_CASE("a value of the largest size round-trips", "[store]") {
  store_server server("127.0.0.1", 0, token);
  store_client a("127.0.0.1", server.port(), token, in(2000ms));
  store_client b("127.0.0.1", server.port(), token, in(2000ms));
  std::vector<std::byte> big(proto::max_value_bytes);
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = std::byte(static_cast<unsigned char>(i * 131 + (i >> 16)));
  a.set("big", big, in(10000ms));
  CHECK(b.get("big", in(10000ms)) == big);
}

TEST_CASE("many threads share the store", "[store]") {
  store_server server("127.0.0.1", 0, token);
  constexpr int threads = 8, adds = 50;
  std::vector<std::future<std::vector<std::string>>> results;
  for (int t = 0; t < threads; ++t)
    results.push_back(std::async(std::launch::async, [&, t] {
      store_client c("127.0.0.1", server.port(), token, in(5000ms));
      for (int i = 0; i < adds; ++i) c.add("counter", 1, in(5000ms));
      c.set("from/" + std::to_string(t), bytes("t" + std::to_string(t)), in(5000ms));
      std::vector<std::string> seen;
      for (int u = 0; u < threads; ++u) seen.push_back(text(c.get("from/" + std::to_string(u), in(5000ms))));
      return seen;
    }));
  for (int t = 0; t < threads; ++t) {
    auto seen = results[static_cast<std::size_t>(t)].get();
    for (int u = 0; u < threads; ++u) CHECK(seen[static_cast<std::size_t>(u)] == "t" + std::to_string(u));
  }
  store_client c("127.0.0.1", server.port(), token, in(2000ms));
  CHECK(c.add("counter", 0, in(1000ms)) == threads * adds);
}

TEST_CASE("forked processes share the store", "[store]") {
  // The processes are forked before the server's thread starts, then read its port from
  // a pipe: a fork while that thread runs could copy a lock it holds (malloc's under
  // ASan, OpenSSL's) into a child, where nothing would release it.
  int port_pipe[2];
  REQUIRE(::pipe(port_pipe) == 0);
  constexpr int procs = 4;
  std::vector<pid_t> pids;
  for (int p = 0; p < procs; ++p)
    pids.push_back(plait::testing::fork_child([p, &port_pipe] {
      ::close(port_pipe[1]);  // so that the parent's end closing is end of file here
      const std::uint16_t port = plait::testing::read_port(port_pipe[0], in(10000ms));
      if (port == 0) return 9;
      store_client c("127.0.0.1", port, token, in(10000ms));
      c.add("arrived", 1, in(10000ms));
      c.set("proc/" + std::to_string(p), bytes(std::to_string(p * 11)), in(10000ms));
      for (int q = 0; q < procs; ++q)
        if (text(c.get("proc/" + std::to_string(q), in(10000ms))) != std::to_string(q * 11)) return 10 + q;
      return 0;
    }));
  store_server server("127.0.0.1", 0, token);
  const auto port = server.port();
  for (int p = 0; p < procs; ++p) CHECK(::write(port_pipe[1], &port, sizeof port) == static_cast<ssize_t>(sizeof port));
  ::close(port_pipe[1]);
  ::close(port_pipe[0]);  // open until now: a child that died early is no SIGPIPE here
  for (int p = 0; p < procs; ++p) {
    CAPTURE(p);
    CHECK(plait::testing::wait_child(pids[static_cast<std::size_t>(p)]) == 0);
  }
  store_client c("127.0.0.1", port, token, in(2000ms));
  CHECK(c.add("arrived", 0, in(1000ms)) == procs);
}

TEST_CASE("get waits for a later set; its deadline is a timeout naming the key", "[store]") {
  store_server server("127.0.0.1", 0, token);
  store_client waiter("127.0.0.1", server.port(), token, in(2000ms));
  store_client writer("127.0.0.1", server.port(), token, in(2000ms));

  auto start = clk::now();
  std::thread later([&] {
    std::this_thread::sleep_for(200ms);
    writer.set("late", bytes("here"), in(1000ms));
  });
  CHECK(text(waiter.get("late", in(5000ms))) == "here");
  CHECK(clk::now() - start >= 150ms);
  later.join();

  start = clk::now();
  auto e = caught([&] { waiter.get("never", in(200ms)); });
  CHECK(e.code() == errc::timeout);
  CHECK_THAT(e.what(), Catch::Contains("'never'"));
  CHECK(clk::now() - start < 2s);

  // The abandoned GET does not confuse later requests, even when its key appears.
  writer.set("never", bytes("now"), in(1000ms));
  CHECK(text(waiter.get("late", in(1000ms))) == "here");
  CHECK(waiter.add("k", 3, in(1000ms)) == 3);
  CHECK(text(waiter.get("never", in(1000ms))) == "now");
}

TEST_CASE("a client that breaks the framing or the caps is disconnected; others are served", "[store]") {
  store_server server("127.0.0.1", 0, token);
  store_client good("127.0.0.1", server.port(), token, in(2000ms));
  good.set("before", bytes("x"), in(1000ms));

  auto send_header = [&](std::uint32_t key_len, std::uint64_t value_len, proto::op op = proto::op::set) {
    auto fd = raw_authenticated(server.port());
    proto::request_header h;
    h.opcode = op;
    h.id = 1;
    h.key_len = key_len;
    h.value_len = value_len;
    auto head = proto::encode(h);
    plait::detail::send_all(fd.get(), head.data(), head.size(), in(1000ms));
    return fd;
  };

  SECTION("a value length of 2^63") {
    auto fd = send_header(3, std::uint64_t{1} << 63);
    CHECK(closed_by_server(fd.get(), in(3000ms)));
  }
  SECTION("a value one byte over 16 MiB") {
    auto fd = send_header(3, proto::max_value_bytes + 1);
    CHECK(closed_by_server(fd.get(), in(3000ms)));
  }
  SECTION("a 513-byte key") {
    auto fd = send_header(513, 1);
    CHECK(closed_by_server(fd.get(), in(3000ms)));
  }
  SECTION("an empty key") {
    auto fd = send_header(0, 1);
    CHECK(closed_by_server(fd.get(), in(3000ms)));
  }
  SECTION("a GET carrying a value") {
    auto fd = send_header(3, 5, proto::op::get);
    CHECK(closed_by_server(fd.get(), in(3000ms)));
  }
  SECTION("garbage after the handshake") {
    auto fd = raw_authenticated(server.port());
    std::vector<unsigned char> junk(100, 0xee);
    plait::detail::send_all(fd.get(), junk.data(), junk.size(), in(1000ms));
    CHECK(closed_by_server(fd.get(), in(3000ms)));
  }
  SECTION("a 16 MiB value announced but never sent holds up nobody") {
    auto fd = send_header(3, proto::max_value_bytes);
    check_still_serving(good, "during");
    CHECK_FALSE(closed_by_server(fd.get(), in(200ms)));  // legal so far: only slow
  }
  check_still_serving(good, "after");
}

TEST_CASE("unauthenticated clients are refused and the store is undisturbed", "[store]") {
  store_server server("127.0.0.1", 0, token, {.handshake_timeout = 500ms});  // short limit for the test
  store_client good("127.0.0.1", server.port(), token, in(2000ms));
  // A GET in flight while the intruders come and go.
  auto pending = std::async(std::launch::async, [&] {
    store_client waiter("127.0.0.1", server.port(), token, in(2000ms));
    return text(waiter.get("signal", in(10000ms)));
  });

  SECTION("connect and close") {
    for (int i = 0; i < 20; ++i) plait::detail::connect_tcp("127.0.0.1", server.port(), in(1000ms)).reset();
  }
  SECTION("connect and send random bytes") {
    auto fd = plait::detail::connect_tcp("127.0.0.1", server.port(), in(1000ms));
    std::vector<unsigned char> junk(4096);
    for (std::size_t i = 0; i < junk.size(); ++i) junk[i] = static_cast<unsigned char>(i * 7 + 3);
    try {
      plait::detail::send_all(fd.get(), junk.data(), junk.size(), in(1000ms));
    } catch (const plait::error&) {
      // the server may already have hung up
    }
    CHECK(closed_by_server(fd.get(), in(2000ms)));
  }
  SECTION("connect with the wrong token") {
    std::vector<std::byte> wrong(32, std::byte{0x11});
    auto e = caught([&] { store_client bad("127.0.0.1", server.port(), wrong, in(2000ms)); });
    CHECK(e.code() == errc::auth);
    CHECK_THAT(e.what(), Catch::Contains("PLAIT_TOKEN"));
  }
  SECTION("connect and say nothing: dropped at the handshake limit") {
    auto fd = plait::detail::connect_tcp("127.0.0.1", server.port(), in(1000ms));
    check_still_serving(good, "meanwhile");
    auto start = clk::now();
    CHECK(closed_by_server(fd.get(), in(3000ms)));
    CHECK(clk::now() - start < 2s);
  }
  SECTION("an authenticated request before the handshake is not accepted") {
    auto fd = plait::detail::connect_tcp("127.0.0.1", server.port(), in(1000ms));
    proto::request_header h;
    h.opcode = proto::op::set;
    h.key_len = 6;
    auto head = proto::encode(h);
    std::vector<std::byte> frame(head.begin(), head.end());
    for (char ch : std::string("signal")) frame.push_back(std::byte(ch));
    plait::detail::send_all(fd.get(), frame.data(), frame.size(), in(1000ms));
    CHECK(closed_by_server(fd.get(), in(2000ms)));
  }
  check_still_serving(good, "after");
  good.set("signal", bytes("go"), in(1000ms));
  CHECK(pending.get() == "go");
}

TEST_CASE("a store that goes away is peer_lost on its clients", "[store]") {
  auto server = std::make_unique<store_server>("127.0.0.1", 0, token);
  store_client c("127.0.0.1", server->port(), token, in(2000ms));
  c.set("k", bytes("v"), in(1000ms));
  auto waiting = std::async(std::launch::async, [&] {
    try {
      c.get("never", in(10000ms));
    } catch (const plait::error& e) {
      return e;
    }
    return plait::error(errc::system, "get returned");
  });
  std::this_thread::sleep_for(100ms);
  auto start = clk::now();
  server.reset();
  auto e = waiting.get();
  CHECK(e.code() == errc::peer_lost);
  CHECK_THAT(e.what(), Catch::Contains("closed the connection"));
  CHECK(clk::now() - start < 2s);
  CHECK(caught([&] { c.set("k", bytes("v"), in(1000ms)); }).code() == errc::peer_lost);
}

TEST_CASE("connecting to a store that is not there times out naming it", "[store]") {
  auto probe = plait::detail::listen_tcp("127.0.0.1", 0);
  auto port = plait::detail::local_port(probe.get());
  probe.reset();
  auto e = caught([&] { store_client c("127.0.0.1", port, token, in(300ms)); });
  CHECK(e.code() == errc::timeout);
  CHECK_THAT(e.what(), Catch::Contains("127.0.0.1:" + std::to_string(port)));
}

TEST_CASE("a client started before its server connects once the server is up", "[store]") {
  auto probe = plait::detail::listen_tcp("127.0.0.1", 0);
  auto port = plait::detail::local_port(probe.get());
  probe.reset();
  std::unique_ptr<store_server> server;
  std::thread later([&] {
    std::this_thread::sleep_for(300ms);
    server = std::make_unique<store_server>("127.0.0.1", port, token);
  });
  store_client c("127.0.0.1", port, token, in(5000ms));
  later.join();
  CHECK(c.add("x", 1, in(1000ms)) == 1);
}

TEST_CASE("store-wide limits refuse a SET with a reason, and the client goes on", "[store]") {
  // The instance id already takes one key and 14 + 32 bytes.
  store_server server("127.0.0.1", 0, token, {.max_total_bytes = 200, .max_keys = 4});
  store_client c("127.0.0.1", server.port(), token, in(2000ms));
  c.set("k1", bytes("1"), in(1000ms));
  c.set("k2", bytes("2"), in(1000ms));
  auto e = caught([&] { c.set("k3", std::vector<std::byte>(150), in(1000ms)); });
  CHECK(e.code() == errc::invalid_argument);
  CHECK_THAT(e.what(), Catch::Contains("limit of 200 bytes"));
  c.set("k3", bytes("3"), in(1000ms));
  e = caught([&] { c.set("k4", bytes("4"), in(1000ms)); });
  CHECK(e.code() == errc::invalid_argument);
  CHECK_THAT(e.what(), Catch::Contains("4 keys"));
  c.set("k1", std::vector<std::byte>(100), in(1000ms));  // replacing counts the difference only
  c.del("k2", in(1000ms));
  c.set("k4", bytes("4"), in(1000ms));
  CHECK(text(c.get("k4", in(1000ms))) == "4");
}

TEST_CASE("connections beyond the cap are closed; a freed slot is reused", "[store]") {
  store_server server("127.0.0.1", 0, token, {.max_connections = 2});
  auto a = std::make_unique<store_client>("127.0.0.1", server.port(), token, in(2000ms));
  store_client b("127.0.0.1", server.port(), token, in(2000ms));
  auto e = caught([&] { store_client c("127.0.0.1", server.port(), token, in(300ms)); });
  CHECK((e.code() == errc::peer_lost || e.code() == errc::timeout));
  check_still_serving(b, "at-cap");
  a.reset();
  store_client c("127.0.0.1", server.port(), token, in(3000ms));
  CHECK(c.add("n", 1, in(1000ms)) == 1);
}
