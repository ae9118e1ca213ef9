// The HMAC-SHA256 handshake over real loopback sockets: success, wrong token,
// garbage, replay of a recorded handshake, role confusion, a silent peer.
#include <catch2/catch.hpp>

#include <poll.h>

#include <chrono>
#include <future>
#include <thread>
#include <vector>

#include <plait/bootstrap/auth.hpp>
#include <plait/detail/socket.hpp>

using namespace std::chrono_literals;
using clk = plait::clock;
using plait::errc;
using plait::bootstrap::auth_role;
using plait::bootstrap::authenticate;
using plait::detail::fd_handle;

namespace {

std::vector<std::byte> token_of(char c) { return std::vector<std::byte>(32, std::byte(c)); }

struct tcp_pair {
  fd_handle client, server;
};

tcp_pair connected_pair() {
  auto listener = plait::detail::listen_tcp("127.0.0.1", 0);
  auto port = plait::detail::local_port(listener.get());
  tcp_pair p;
  p.client = plait::detail::connect_tcp("127.0.0.1", port, clk::now() + 2s);
  p.server = plait::detail::accept_until(listener.get(), clk::now() + 2s);
  return p;
}

// Runs fn and returns the errc it threw, or nullopt on success.
template <class F>
std::optional<errc> outcome(F&& fn) {
  try {
    fn();
    return std::nullopt;
  } catch (const plait::error& e) {
    return e.code();
  }
}

}  // namespace

TEST_CASE("the right token authenticates both ends", "[auth]") {
  auto p = connected_pair();
  auto tok = token_of('a');
  auto server = std::async(std::launch::async, [&] {
    return outcome([&] { authenticate(p.server.get(), tok, auth_role::server, "test", clk::now() + 3s); });
  });
  auto client = outcome([&] { authenticate(p.client.get(), tok, auth_role::client, "test", clk::now() + 3s); });
  CHECK(client == std::nullopt);
  CHECK(server.get() == std::nullopt);

  // The connection is still in step afterwards: application bytes pass through.
  const char msg[] = "after";
  char got[sizeof msg] = {};
  plait::detail::send_all(p.client.get(), msg, sizeof msg, clk::now() + 1s);
  plait::detail::recv_all(p.server.get(), got, sizeof got, clk::now() + 1s);
  CHECK(std::string(got) == "after");
}

TEST_CASE("a wrong token fails with auth on both ends", "[auth]") {
  auto p = connected_pair();
  auto good = token_of('a'), bad = token_of('b');
  auto server = std::async(std::launch::async, [&] {
    return outcome([&] { authenticate(p.server.get(), good, auth_role::server, "test", clk::now() + 3s); });
  });
  auto client = outcome([&] { authenticate(p.client.get(), bad, auth_role::client, "test", clk::now() + 3s); });
  CHECK(client == errc::auth);
  CHECK(server.get() == errc::auth);
}

TEST_CASE("a different context fails like a wrong token", "[auth]") {
  auto p = connected_pair();
  auto tok = token_of('a');
  auto server = std::async(std::launch::async, [&] {
    return outcome([&] { authenticate(p.server.get(), tok, auth_role::server, "store", clk::now() + 3s); });
  });
  auto client = outcome([&] { authenticate(p.client.get(), tok, auth_role::client, "tcp", clk::now() + 3s); });
  CHECK(client == errc::auth);
  CHECK(server.get() == errc::auth);
}

TEST_CASE("random bytes instead of a handshake are rejected at once", "[auth]") {
  auto p = connected_pair();
  auto tok = token_of('a');
  std::vector<unsigned char> junk(64);
  for (std::size_t i = 0; i < junk.size(); ++i) junk[i] = static_cast<unsigned char>(i * 37 + 11);
  plait::detail::send_all(p.client.get(), junk.data(), junk.size(), clk::now() + 1s);
  auto start = clk::now();
  auto result = outcome([&] { authenticate(p.server.get(), tok, auth_role::server, "test", clk::now() + 10s); });
  CHECK(result == errc::auth);
  CHECK(clk::now() - start < 2s);  // decided on the bytes, not by the deadline
}

TEST_CASE("both ends claiming the client role is refused", "[auth]") {
  auto p = connected_pair();
  auto tok = token_of('a');
  auto other = std::async(std::launch::async, [&] {
    return outcome([&] { authenticate(p.server.get(), tok, auth_role::client, "test", clk::now() + 3s); });
  });
  auto mine = outcome([&] { authenticate(p.client.get(), tok, auth_role::client, "test", clk::now() + 3s); });
  CHECK(mine == errc::auth);
  CHECK(other.get() == errc::auth);
}

TEST_CASE("a silent peer times out, a vanished one is peer_lost", "[auth]") {
  auto tok = token_of('a');
  {
    auto p = connected_pair();
    auto start = clk::now();
    CHECK(outcome([&] { authenticate(p.server.get(), tok, auth_role::server, "test", clk::now() + 300ms); }) ==
          errc::timeout);
    CHECK(clk::now() - start < 2s);
  }
  {
    auto p = connected_pair();
    p.client.reset();
    CHECK(outcome([&] { authenticate(p.server.get(), tok, auth_role::server, "test", clk::now() + 3s); }) ==
          errc::peer_lost);
  }
}

TEST_CASE("replaying a recorded client handshake is rejected", "[auth]") {
  auto tok = token_of('a');
  auto listener = plait::detail::listen_tcp("127.0.0.1", 0);
  auto port = plait::detail::local_port(listener.get());

  // A recording relay between a real client and a real server: client -> relay -> server.
  std::vector<std::byte> recorded;  // everything the client sent
  {
    auto relay_listener = plait::detail::listen_tcp("127.0.0.1", 0);
    auto relay_port = plait::detail::local_port(relay_listener.get());
    auto server = std::async(std::launch::async, [&] {
      auto s = plait::detail::accept_until(listener.get(), clk::now() + 3s);
      return outcome([&] { authenticate(s.get(), tok, auth_role::server, "test", clk::now() + 3s); });
    });
    auto client = std::async(std::launch::async, [&] {
      auto c = plait::detail::connect_tcp("127.0.0.1", relay_port, clk::now() + 3s);
      auto r = outcome([&] { authenticate(c.get(), tok, auth_role::client, "test", clk::now() + 3s); });
      return r;  // closing c ends the relay
    });
    auto from_client = plait::detail::accept_until(relay_listener.get(), clk::now() + 3s);
    auto to_server = plait::detail::connect_tcp("127.0.0.1", port, clk::now() + 3s);
    bool client_open = true, server_open = true;
    auto until = clk::now() + 5s;
    while ((client_open || server_open) && clk::now() < until) {
      pollfd fds[2] = {{from_client.get(), POLLIN, 0}, {to_server.get(), POLLIN, 0}};
      ::poll(fds, 2, 100);
      std::byte buf[512];
      if (client_open && fds[0].revents) {
        ssize_t n = ::recv(from_client.get(), buf, sizeof buf, 0);
        if (n <= 0) {
          client_open = false;
          ::shutdown(to_server.get(), SHUT_WR);
        } else {
          recorded.insert(recorded.end(), buf, buf + n);
          plait::detail::send_all(to_server.get(), buf, static_cast<std::size_t>(n), clk::now() + 1s);
        }
      }
      if (server_open && fds[1].revents) {
        ssize_t n = ::recv(to_server.get(), buf, sizeof buf, 0);
        if (n <= 0) {
          server_open = false;
        } else {
          try {
            plait::detail::send_all(from_client.get(), buf, static_cast<std::size_t>(n), clk::now() + 1s);
          } catch (const plait::error&) {
            server_open = false;
          }
        }
      }
    }
    REQUIRE(client.get() == std::nullopt);  // the recorded handshake was a valid one
    REQUIRE(server.get() == std::nullopt);
  }
  REQUIRE(recorded.size() == 40 + 32);  // hello + proof

  // Replay the recording to the server on a fresh connection.
  auto server = std::async(std::launch::async, [&] {
    auto s = plait::detail::accept_until(listener.get(), clk::now() + 3s);
    return outcome([&] { authenticate(s.get(), tok, auth_role::server, "test", clk::now() + 3s); });
  });
  auto attacker = plait::detail::connect_tcp("127.0.0.1", port, clk::now() + 3s);
  plait::detail::send_all(attacker.get(), recorded.data(), recorded.size(), clk::now() + 1s);
  CHECK(server.get() == errc::auth);
  // The server answered hello (40 bytes), then a rejection verdict (status byte 1).
  std::byte reply[40 + 33];
  plait::detail::recv_all(attacker.get(), reply, sizeof reply, clk::now() + 2s);
  CHECK(reply[40] == std::byte{1});
}

TEST_CASE("auth_exchange never asks for bytes beyond the handshake", "[auth]") {
  auto tok = token_of('z');
  plait::bootstrap::auth_exchange client(tok, auth_role::client, "x"), server(tok, auth_role::server, "x");
  std::vector<std::byte> c2s, s2c;
  auto pump = [](plait::bootstrap::auth_exchange& from, std::vector<std::byte>& wire) {
    auto out = from.pending_output();
    wire.insert(wire.end(), out.begin(), out.end());
    from.consume_output(out.size());
  };
  auto feed = [](plait::bootstrap::auth_exchange& to, std::vector<std::byte>& wire) {
    while (!wire.empty()) {
      auto in = to.input_space();
      if (in.empty()) break;
      auto n = std::min(in.size(), wire.size());
      std::copy(wire.begin(), wire.begin() + static_cast<std::ptrdiff_t>(n), in.begin());
      wire.erase(wire.begin(), wire.begin() + static_cast<std::ptrdiff_t>(n));
      to.commit_input(n);
    }
  };
  for (int round = 0; round < 8 && !(client.finished() && server.finished()); ++round) {
    pump(client, c2s);
    pump(server, s2c);
    feed(server, c2s);
    feed(client, s2c);
  }
  CHECK(client.finished());
  CHECK(server.finished());
  CHECK_FALSE(client.failed());
  CHECK_FALSE(server.failed());
  CHECK(c2s.empty());
  CHECK(s2c.empty());
  CHECK(client.input_space().empty());
}

TEST_CASE("an empty token is invalid_argument", "[auth]") {
  auto p = connected_pair();
  CHECK(outcome([&] {
          authenticate(p.client.get(), std::span<const std::byte>(), auth_role::client, "x", clk::now() + 1s);
        }) == errc::invalid_argument);
}
