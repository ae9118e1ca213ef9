// store_client: one authenticated connection to a store_server.
//
// The constructor connects (retrying until the deadline while the server is not up
// yet) and runs the handshake (client role). Every operation takes a deadline:
// get() waits for the key to appear and throws errc::timeout naming the key when the
// deadline passes first; the connection stays usable (the server drops a GET that the
// client abandoned as soon as the next request arrives, and a late reply is skipped
// by its id). A reply cut off by the deadline mid-frame leaves the stream unusable,
// so the next call reconnects. A server that went away is errc::peer_lost ("the store
// at host:port closed the connection"), then and on every later call.
// Thread-safe: calls are serialised by an internal mutex (one request in flight).
#pragma once

#include <poll.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <plait/bootstrap/auth.hpp>
#include <plait/bootstrap/store_protocol.hpp>
#include <plait/detail/socket.hpp>

namespace plait::bootstrap {

class store_client {
 public:
  store_client(const std::string& host, std::uint16_t port, std::span<const std::byte> token,
               clock::time_point deadline)
      : host_(host), port_(port), where_(detail::join_host_port(host, port)), token_(token.begin(), token.end()) {
    if (token_.empty()) throw error(errc::invalid_argument, "store_client needs a non-empty token");
    connect(deadline);
  }

  store_client(const store_client&) = delete;
  store_client& operator=(const store_client&) = delete;

  void set(std::string_view key, std::span<const std::byte> value, clock::time_point deadline) {
    std::lock_guard lock(mu_);
    expect_ok(transact(store_protocol::op::set, key, value, deadline), key);
  }

  // Waits until key exists (or the deadline passes: errc::timeout naming the key).
  std::vector<std::byte> get(std::string_view key, clock::time_point deadline) {
    std::lock_guard lock(mu_);
    auto r = transact(store_protocol::op::get, key, {}, deadline);
    expect_ok(r, key);
    return std::move(r.value);
  }

  // The value if key exists now, else nullopt; does not wait for the key.
  std::optional<std::vector<std::byte>> try_get(std::string_view key, clock::time_point deadline) {
    std::lock_guard lock(mu_);
    auto r = transact(store_protocol::op::try_get, key, {}, deadline);
    if (r.code == store_protocol::status::not_found) return std::nullopt;
    expect_ok(r, key);
    return std::move(r.value);
  }

  // Adds delta to the 8-byte little-endian counter at key (absent = 0); returns the new value.
  std::int64_t add(std::string_view key, std::int64_t delta, clock::time_point deadline) {
    std::array<std::byte, 8> d{};
    store_protocol::put_u64(d.data(), static_cast<std::uint64_t>(delta));
    std::lock_guard lock(mu_);
    auto r = transact(store_protocol::op::add, key, d, deadline);
    expect_ok(r, key);
    if (r.value.size() != 8)
      throw error(errc::protocol, "the store at " + where_ + " answered ADD with " + std::to_string(r.value.size()) +
                                      " bytes instead of 8");
    return static_cast<std::int64_t>(store_protocol::get_le(r.value.data(), 8));
  }

  void del(std::string_view key, clock::time_point deadline) {
    std::lock_guard lock(mu_);
    expect_ok(transact(store_protocol::op::del, key, {}, deadline), key);
  }

  // The address of this side of the store connection: the interface that reaches the store.
  std::string local_address() const { return local_address_; }
  const std::string& host() const { return host_; }
  std::uint16_t port() const { return port_; }

 private:
  struct reply {
    store_protocol::status code{};
    std::vector<std::byte> value;
  };

  void connect(clock::time_point deadline) {
    using namespace std::chrono_literals;
    for (auto backoff = 10ms;; backoff = std::min(backoff * 2, std::chrono::milliseconds(200))) {
      detail::fd_handle fd = detail::connect_tcp(host_, port_, deadline);
      try {
        authenticate(fd.get(), token_, auth_role::client, store_protocol::auth_context, deadline);
      } catch (const error& e) {
        // A server at its connection cap closes new connections at once: try again.
        if (e.code() == errc::peer_lost && clock::now() + backoff < deadline) {
          std::this_thread::sleep_for(backoff);
          continue;
        }
        if (e.code() == errc::auth) throw error(errc::auth, "store at " + where_ + ": " + e.message());
        throw;
      }
      local_address_ = detail::local_address(fd.get());
      fd_ = std::move(fd);
      broken_ = false;
      return;
    }
  }

  [[noreturn]] void lost(const char* doing) {
    dead_ = true;
    fd_.reset();
    throw error(errc::peer_lost, std::string("the store at ") + where_ + " closed the connection (" + doing +
                                     "); the process serving it (rank 0 or plaitrun) has exited or failed");
  }

  void expect_ok(const reply& r, std::string_view key) const {
    if (r.code == store_protocol::status::ok) return;
    std::string text(reinterpret_cast<const char*>(r.value.data()), r.value.size());
    if (r.code == store_protocol::status::refused)
      throw error(errc::invalid_argument,
                  "the store at " + where_ + " refused key '" + std::string(key) + "': " + text);
    throw error(errc::protocol,
                "the store at " + where_ + " answered an unexpected status for key '" + std::string(key) + "'");
  }

  // Sends one request and returns its reply. Caller holds mu_.
  reply transact(store_protocol::op opcode, std::string_view key, std::span<const std::byte> value,
                 clock::time_point deadline) {
    if (key.empty() || key.size() > store_protocol::max_key_bytes)
      throw error(errc::invalid_argument, "store key '" + std::string(key.substr(0, 64)) + "' must be 1.." +
                                              std::to_string(store_protocol::max_key_bytes) + " bytes");
    if (value.size() > store_protocol::max_value_bytes)
      throw error(errc::invalid_argument, "value for store key '" + std::string(key) + "' is " +
                                              std::to_string(value.size()) + " bytes; the store takes at most 16 MiB");
    if (dead_) lost("earlier");
    if (broken_) connect(deadline);

    store_protocol::request_header h;
    h.opcode = opcode;
    h.id = ++next_id_;
    h.key_len = static_cast<std::uint32_t>(key.size());
    h.value_len = value.size();
    auto head = store_protocol::encode(h);
    std::vector<std::byte> frame(head.begin(), head.end());
    frame.insert(frame.end(), reinterpret_cast<const std::byte*>(key.data()),
                 reinterpret_cast<const std::byte*>(key.data()) + key.size());
    if (value.size() <= 64 * 1024) frame.insert(frame.end(), value.begin(), value.end());
    try {
      detail::send_all(fd_.get(), frame.data(), frame.size(), deadline);
      if (value.size() > 64 * 1024) detail::send_all(fd_.get(), value.data(), value.size(), deadline);
    } catch (const error& e) {
      if (e.code() == errc::peer_lost) lost("while sending");
      broken_ = true;  // part of a frame may have gone out
      throw error(e.code(), "store at " + where_ + ", key '" + std::string(key) + "': " + e.message());
    }

    for (;;) {
      // Wait for the first byte: a timeout here leaves the stream in step.
      pollfd p{fd_.get(), POLLIN, 0};
      for (;;) {
        int timeout = detail::poll_timeout_ms(deadline);
        int n = ::poll(&p, 1, timeout);
        if (n > 0) break;
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) throw error(errc::system, "poll failed: " + detail::errno_text(errno));
        if (clock::now() >= deadline) {
          if (opcode == store_protocol::op::get)
            throw error(errc::timeout, "key '" + std::string(key) + "' did not appear in the store at " + where_ +
                                           " before the deadline; the rank that publishes it has not got there "
                                           "(is it running, and did every rank make the same calls?)");
          throw error(errc::timeout, "the store at " + where_ + " did not answer before the deadline (key '" +
                                         std::string(key) + "')");
        }
      }
      reply r;
      store_protocol::response_header rh;
      try {
        std::array<std::byte, store_protocol::response_header_bytes> rb{};
        detail::recv_all(fd_.get(), rb.data(), rb.size(), deadline);
        if (!store_protocol::decode(std::span<const std::byte, store_protocol::response_header_bytes>(rb), rh)) {
          broken_ = true;
          throw error(errc::protocol, "the store at " + where_ + " sent a malformed reply; is " + where_ +
                                          " really a plait store of the same version?");
        }
        r.code = rh.code;
        r.value.resize(static_cast<std::size_t>(rh.value_len));
        detail::recv_all(fd_.get(), r.value.data(), r.value.size(), deadline);
      } catch (const error& e) {
        if (e.code() == errc::peer_lost) lost("while waiting for a reply");
        broken_ = true;
        if (e.code() == errc::protocol) throw;
        throw error(e.code(), "store at " + where_ + ", key '" + std::string(key) + "': " + e.message());
      }
      if (rh.id == h.id) return r;
      // A reply to an earlier request that timed out here: skip it.
    }
  }

  std::string host_;
  std::uint16_t port_;
  std::string where_;
  std::vector<std::byte> token_;
  std::mutex mu_;
  detail::fd_handle fd_;
  std::string local_address_;
  std::uint32_t next_id_ = 0;
  bool broken_ = false;
  bool dead_ = false;
};

}  // namespace plait::bootstrap
