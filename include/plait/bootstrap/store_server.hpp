// store_server: the embedded rendezvous key-value store (DESIGN.md section 5).
//
// One thread runs a poll() loop over non-blocking sockets, so a slow or hostile
// client never holds up the others. Every connection must pass the token handshake
// (auth.hpp, server role) within the handshake timeout (5 s by default) or it is
// dropped; until then only handshake bytes are read from it. Requests are framed and
// checked (store_protocol.hpp): a malformed or over-limit request closes that
// connection, and memory grows only with bytes actually received. Each connection
// has at most one response in flight and at most one GET waiting for its key.
// Store-wide limits (bytes, keys, connections) come from store_options.
// The constructor binds and starts the thread (throws plait::error if it cannot
// listen); the destructor stops and joins it and never throws. port() and
// instance_id() are safe from any thread.
#pragma once

#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <plait/bootstrap/auth.hpp>
#include <plait/bootstrap/store_protocol.hpp>
#include <plait/detail/env.hpp>
#include <plait/detail/socket.hpp>

namespace plait::bootstrap {

// Limits of one server. The defaults are the documented ones (store_protocol.hpp);
// tests lower them to reach them cheaply.
struct store_options {
  std::chrono::milliseconds handshake_timeout = std::chrono::seconds(5);
  std::size_t max_total_bytes = store_protocol::max_total_bytes;  // keys + values stored
  std::size_t max_keys = store_protocol::max_keys;
  std::size_t max_connections = store_protocol::max_connections;
  std::size_t max_pending_handshakes = store_protocol::max_pending_handshakes;
};

class store_server {
 public:
  using value_ptr = std::shared_ptr<const std::vector<std::byte>>;

  // host "0.0.0.0" (or "") listens on every IPv4 interface; port 0 picks a free port.
  store_server(const std::string& host, std::uint16_t port, std::vector<std::byte> token, store_options options = {})
      : token_(std::move(token)), options_(options) {
    if (token_.empty()) throw error(errc::invalid_argument, "store_server needs a non-empty token");
    listen_ = detail::listen_tcp(host, port);
    port_ = detail::local_port(listen_.get());
    wake_ = detail::fd_handle(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!wake_) throw error(errc::system, "eventfd failed: " + detail::errno_text(errno));
    std::array<std::byte, 16> id{};
    auth_detail::random_bytes(id);
    static constexpr char hex[] = "0123456789abcdef";
    for (auto b : id) {
      instance_id_ += hex[std::to_integer<unsigned>(b) >> 4];
      instance_id_ += hex[std::to_integer<unsigned>(b) & 15];
    }
    std::string key(store_protocol::instance_key);
    auto value = std::make_shared<const std::vector<std::byte>>(
        reinterpret_cast<const std::byte*>(instance_id_.data()),
        reinterpret_cast<const std::byte*>(instance_id_.data()) + instance_id_.size());
    total_bytes_ = key.size() + value->size();
    data_.emplace(std::move(key), std::move(value));
    thread_ = std::thread([this] { run(); });
  }

  store_server(const store_server&) = delete;
  store_server& operator=(const store_server&) = delete;

  ~store_server() {
    stop_.store(true);
    std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(wake_.get(), &one, sizeof one);
    if (thread_.joinable()) thread_.join();
  }

  std::uint16_t port() const { return port_; }

  // Connections open now (authenticated or not), as of the server's last loop turn.
  std::size_t connections() const { return open_connections_.load(); }

  // Waits until every client has disconnected or `bound` has passed; true if they all
  // did. A process serving the store calls this before it exits, so that ranks still
  // finishing their last store operations are not cut off.
  bool drain(std::chrono::milliseconds bound) const {
    auto until = clock::now() + bound;
    while (open_connections_.load() != 0) {
      if (clock::now() >= until) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return true;
  }
  // 32 random hex digits, also stored under store_protocol::instance_key.
  const std::string& instance_id() const { return instance_id_; }

 private:
  struct connection {
    detail::fd_handle fd;
    std::uint64_t id = 0;
    std::string peer;
    std::unique_ptr<auth_exchange> auth;  // until the handshake succeeds
    clock::time_point auth_deadline{};
    // request being read: header, then key, then value
    std::array<std::byte, store_protocol::request_header_bytes> head{};
    std::size_t head_have = 0;
    bool head_done = false;
    store_protocol::request_header req;
    std::string key;
    std::size_t key_have = 0;
    std::vector<std::byte> value;
    std::size_t value_have = 0;
    // response being written
    bool out_active = false;
    std::array<std::byte, store_protocol::response_header_bytes> out_head{};
    value_ptr out_value;
    std::size_t out_sent = 0;
    // a GET waiting for its key: (key, request id)
    std::optional<std::pair<std::string, std::uint32_t>> waiting;
    bool dead = false;
  };

  bool wants_read(connection& c) const {
    if (c.dead) return false;
    if (c.auth) return !c.auth->input_space().empty();
    return !c.out_active;
  }
  bool wants_write(const connection& c) const {
    if (c.dead) return false;
    if (c.auth) return !c.auth->pending_output().empty();
    return c.out_active;
  }

  void drop(connection& c, const std::string& why) {
    if (!why.empty()) detail::log(detail::log_level::warn, "store: dropping client ", c.peer, ": ", why);
    c.dead = true;
  }

  void run() noexcept {
    std::vector<pollfd> fds;
    std::vector<connection*> order;
    while (!stop_.load()) {
      fds.clear();
      order.clear();
      fds.push_back({wake_.get(), POLLIN, 0});
      fds.push_back({listen_.get(), POLLIN, 0});
      auto next_deadline = clock::time_point::max();
      for (auto& [id, c] : conns_) {
        short events = 0;
        if (wants_read(*c)) events |= POLLIN;
        if (wants_write(*c)) events |= POLLOUT;
        fds.push_back({c->fd.get(), events, 0});
        order.push_back(c.get());
        if (c->auth) next_deadline = std::min(next_deadline, c->auth_deadline);
      }
      int timeout = 1000;  // the eventfd wakes us for shutdown; this only bounds drift
      if (next_deadline != clock::time_point::max())
        timeout = std::min(timeout, detail::poll_timeout_ms(next_deadline));
      if (::poll(fds.data(), fds.size(), timeout) < 0 && errno != EINTR) {
        detail::log(detail::log_level::warn, "store: poll failed: ", detail::errno_text(errno));
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        continue;
      }
      if (stop_.load()) break;
      if (fds[1].revents & POLLIN) accept_new();
      for (std::size_t i = 0; i < order.size(); ++i) {
        connection& c = *order[i];
        short rev = fds[i + 2].revents;
        if (rev == 0 || c.dead) continue;
        try {
          if (rev & (POLLIN | POLLHUP | POLLERR)) {
            if (wants_read(c))
              on_readable(c);
            else if (rev & (POLLHUP | POLLERR))
              drop(c, "");  // gone while we wrote to it
          }
          if (!c.dead && (rev & POLLOUT)) on_writable(c);
        } catch (const std::exception& e) {
          drop(c, e.what());  // bad_alloc or an unexpected system error: only this client
        }
      }
      auto now = clock::now();
      for (auto it = conns_.begin(); it != conns_.end();) {
        connection& c = *it->second;
        if (!c.dead && c.auth && now >= c.auth_deadline) drop(c, "no valid handshake within the time limit");
        if (c.dead) {
          if (c.waiting) cancel_wait(c);
          it = conns_.erase(it);
        } else {
          ++it;
        }
      }
      open_connections_.store(conns_.size());
    }
    open_connections_.store(0);
  }

  void accept_new() {
    for (int i = 0; i < 64; ++i) {
      detail::fd_handle fd(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
      if (!fd) {
        int e = errno;
        if (e == EAGAIN || e == EWOULDBLOCK) return;
        if (e == EINTR || e == ECONNABORTED || e == EPROTO) continue;
        detail::log(detail::log_level::warn, "store: accept failed: ", detail::errno_text(e));
        if (e == EMFILE || e == ENFILE) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        return;
      }
      std::size_t pending = 0;
      for (auto& [id, c] : conns_) pending += c->auth ? 1 : 0;
      if (conns_.size() >= options_.max_connections || pending >= options_.max_pending_handshakes) {
        detail::log(detail::log_level::warn, "store: refusing a connection from ", detail::peer_endpoint(fd.get()),
                    ": too many connections (", conns_.size(), ") or pending handshakes (", pending, ")");
        continue;  // fd closes here
      }
      int one = 1;
      ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      auto c = std::make_unique<connection>();
      c->id = next_conn_id_++;
      c->peer = detail::peer_endpoint(fd.get());
      c->fd = std::move(fd);
      c->auth = std::make_unique<auth_exchange>(token_, auth_role::server, store_protocol::auth_context);
      c->auth_deadline = clock::now() + options_.handshake_timeout;
      connection& ref = *c;
      conns_.emplace(c->id, std::move(c));
      on_writable(ref);  // our hello goes out at once
    }
  }

  // Non-blocking recv into [p, p+n): bytes read, 0 when it would block; marks the
  // connection dead on EOF or error (returns 0 then too).
  std::size_t read_some(connection& c, void* p, std::size_t n) {
    for (;;) {
      ssize_t k = ::recv(c.fd.get(), p, n, MSG_DONTWAIT);
      if (k > 0) return static_cast<std::size_t>(k);
      if (k == 0) {
        drop(c, "");
        return 0;
      }
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) drop(c, "");
      return 0;
    }
  }

  void on_readable(connection& c) {
    if (c.auth) {
      for (auto in = c.auth->input_space(); !in.empty() && !c.dead; in = c.auth->input_space()) {
        std::size_t k = read_some(c, in.data(), in.size());
        if (k == 0) break;
        c.auth->commit_input(k);
      }
      if (!c.dead) on_writable(c);
      return;
    }
    while (wants_read(c)) {
      std::size_t k = 0;
      if (!c.head_done) {
        k = read_some(c, c.head.data() + c.head_have, c.head.size() - c.head_have);
        c.head_have += k;
        if (c.head_have == c.head.size()) {
          if (!store_protocol::decode(std::span<const std::byte, store_protocol::request_header_bytes>(c.head), c.req))
            return drop(c, "malformed or over-limit request header");
          c.head_done = true;
          c.key.assign(c.req.key_len, '\0');
          c.key_have = 0;
          c.value.clear();
          c.value_have = 0;
        }
      } else if (c.key_have < c.key.size()) {
        k = read_some(c, c.key.data() + c.key_have, c.key.size() - c.key_have);
        c.key_have += k;
      } else {
        // Grow the value with the bytes that arrive, never by the announced length alone.
        std::size_t total = static_cast<std::size_t>(c.req.value_len);
        std::size_t chunk = std::min<std::size_t>(total - c.value_have, 64 * 1024);
        if (c.value.size() < c.value_have + chunk) {
          if (c.value.capacity() < c.value_have + chunk)
            c.value.reserve(std::min(total, std::max(2 * c.value.capacity(), c.value_have + chunk)));
          c.value.resize(c.value_have + chunk);
        }
        k = read_some(c, c.value.data() + c.value_have, chunk);
        c.value_have += k;
      }
      if (c.head_done && c.key_have == c.key.size() && c.value_have == c.req.value_len) {
        c.value.resize(c.value_have);
        c.head_done = false;
        c.head_have = 0;
        handle_request(c);
        continue;
      }
      if (k == 0) break;
    }
  }

  void on_writable(connection& c) {
    if (c.auth) {
      for (auto out = c.auth->pending_output(); !out.empty(); out = c.auth->pending_output()) {
        ssize_t k = ::send(c.fd.get(), out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k < 0) {
          if (errno == EINTR) continue;
          if (errno != EAGAIN && errno != EWOULDBLOCK) drop(c, "");
          break;
        }
        c.auth->consume_output(static_cast<std::size_t>(k));
      }
      if (!c.dead && c.auth->finished()) {
        if (c.auth->failed()) {
          try {
            c.auth->check();
          } catch (const error& e) {
            drop(c, e.message());
          }
        } else {
          c.auth.reset();
          detail::log(detail::log_level::trace, "store: client ", c.peer, " authenticated");
        }
      }
      return;
    }
    while (c.out_active) {
      std::size_t head_left = c.out_sent < c.out_head.size() ? c.out_head.size() - c.out_sent : 0;
      std::size_t value_off = c.out_sent - (c.out_head.size() - head_left);
      iovec iov[2];
      int n = 0;
      if (head_left) iov[n++] = {c.out_head.data() + c.out_sent, head_left};
      if (c.out_value && value_off < c.out_value->size())
        iov[n++] = {const_cast<std::byte*>(c.out_value->data()) + value_off, c.out_value->size() - value_off};
      if (n == 0) {
        c.out_active = false;
        c.out_value.reset();
        break;
      }
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = static_cast<std::size_t>(n);
      ssize_t k = ::sendmsg(c.fd.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (k < 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) drop(c, "");
        return;
      }
      c.out_sent += static_cast<std::size_t>(k);
    }
  }

  void respond(connection& c, store_protocol::status code, std::uint32_t id, value_ptr value) {
    store_protocol::response_header h;
    h.code = code;
    h.id = id;
    h.value_len = value ? value->size() : 0;
    c.out_head = store_protocol::encode(h);
    c.out_value = std::move(value);
    c.out_sent = 0;
    c.out_active = true;
    on_writable(c);
  }

  void refuse(connection& c, std::uint32_t id, const std::string& why) {
    auto text = std::make_shared<const std::vector<std::byte>>(
        reinterpret_cast<const std::byte*>(why.data()), reinterpret_cast<const std::byte*>(why.data()) + why.size());
    respond(c, store_protocol::status::refused, id, std::move(text));
  }

  void cancel_wait(connection& c) {
    auto it = waiters_.find(c.waiting->first);
    if (it != waiters_.end()) {
      std::erase(it->second, c.id);
      if (it->second.empty()) waiters_.erase(it);
    }
    c.waiting.reset();
  }

  // Stores key = value within the store-wide caps; returns the refusal, if any.
  std::optional<std::string> store(const std::string& key, value_ptr value) {
    auto it = data_.find(key);
    std::size_t old = it != data_.end() ? key.size() + it->second->size() : 0;
    std::size_t added = key.size() + value->size();
    if (it == data_.end() && data_.size() >= options_.max_keys)
      return "the store already holds " + std::to_string(options_.max_keys) +
             " keys, its limit; a job that needs more is publishing too much through the store";
    if (total_bytes_ - old + added > options_.max_total_bytes)
      return "the store would exceed its limit of " + std::to_string(options_.max_total_bytes) +
             " bytes; publish less through the store";
    total_bytes_ = total_bytes_ - old + added;
    data_[key] = value;
    // Wake the GETs waiting for this key.
    if (auto w = waiters_.find(key); w != waiters_.end()) {
      auto ids = std::move(w->second);
      waiters_.erase(w);
      for (auto id : ids) {
        auto c = conns_.find(id);
        if (c == conns_.end() || c->second->dead || !c->second->waiting) continue;
        auto request_id = c->second->waiting->second;
        c->second->waiting.reset();
        respond(*c->second, store_protocol::status::ok, request_id, value);
      }
    }
    return std::nullopt;
  }

  void handle_request(connection& c) {
    using store_protocol::op;
    using store_protocol::status;
    if (c.waiting) cancel_wait(c);  // the client gave up on its earlier GET
    const auto id = c.req.id;
    switch (c.req.opcode) {
      case op::set: {
        auto value = std::make_shared<const std::vector<std::byte>>(std::move(c.value));
        if (auto why = store(c.key, std::move(value))) return refuse(c, id, *why);
        return respond(c, status::ok, id, nullptr);
      }
      case op::get:
      case op::try_get: {
        auto it = data_.find(c.key);
        if (it != data_.end()) return respond(c, status::ok, id, it->second);
        if (c.req.opcode == op::try_get) return respond(c, status::not_found, id, nullptr);
        c.waiting.emplace(c.key, id);
        waiters_[c.key].push_back(c.id);
        return;
      }
      case op::add: {
        std::uint64_t current = 0;
        if (auto it = data_.find(c.key); it != data_.end()) {
          if (it->second->size() != 8)
            return refuse(
                c, id,
                "key '" + c.key + "' holds " + std::to_string(it->second->size()) + " bytes, not an 8-byte counter");
          current = store_protocol::get_le(it->second->data(), 8);
        }
        std::uint64_t next = current + store_protocol::get_le(c.value.data(), 8);  // wraps like int64 two's complement
        std::vector<std::byte> bytes(8);
        store_protocol::put_u64(bytes.data(), next);
        auto value = std::make_shared<const std::vector<std::byte>>(std::move(bytes));
        if (auto why = store(c.key, value)) return refuse(c, id, *why);
        return respond(c, status::ok, id, std::move(value));
      }
      case op::del: {
        if (auto it = data_.find(c.key); it != data_.end()) {
          total_bytes_ -= it->first.size() + it->second->size();
          data_.erase(it);
        }
        return respond(c, status::ok, id, nullptr);
      }
    }
  }

  std::vector<std::byte> token_;
  store_options options_;
  detail::fd_handle listen_;
  detail::fd_handle wake_;
  std::uint16_t port_ = 0;
  std::string instance_id_;
  std::atomic<bool> stop_{false};
  std::atomic<std::size_t> open_connections_{0};
  // Owned by the server thread once it runs.
  std::unordered_map<std::string, value_ptr> data_;
  std::size_t total_bytes_ = 0;
  std::unordered_map<std::string, std::vector<std::uint64_t>> waiters_;
  std::map<std::uint64_t, std::unique_ptr<connection>> conns_;
  std::uint64_t next_conn_id_ = 1;
  std::thread thread_;  // last: starts after every member above is constructed
};

}  // namespace plait::bootstrap
