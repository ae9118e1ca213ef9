// Building the TCP mesh: one authenticated socket per pair of peers.
//
// Every rank that has lower-ranked peers listens on an ephemeral port of
// ctx.listen_address() and publishes "host:port" under "tcp/<rank>"; the lower rank of
// each pair connects to the higher one, so there is exactly one socket per pair.
// On every connection the two ends run the mutual HMAC handshake (bootstrap/auth.hpp)
// and then exchange a tcp_hello: the acceptor learns which rank connected, and both
// check that they agree on slot size and depth (else invalid_argument on both sides).
// Accepted connections are handshaken on their own threads while this rank connects
// to its higher peers, so a silent or garbage connection (wrong token, a port scanner)
// delays nobody: it is closed and not counted, and accepting goes on until every
// expected rank is in or the deadline passes (timeout naming the ranks still missing).
// Every wait is bounded by the one deadline; every thread is joined before return.
#pragma once

#include <sys/socket.h>

#include <algorithm>
#include <condition_variable>
#include <list>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <plait/bootstrap/auth.hpp>
#include <plait/detail/socket.hpp>
#include <plait/error.hpp>
#include <plait/transport.hpp>
#include <plait/transport/detail/tcp_wire.hpp>

namespace plait::transport::tcp_detail {

using plait::detail::fd_handle;
using socket_list = std::vector<std::pair<int, fd_handle>>;

inline std::string address_key(int rank) { return "tcp/" + std::to_string(rank); }

// Large kernel buffers keep a whole pipeline of slots in flight; best effort (capped by
// net.core.wmem_max / rmem_max).
inline void widen_buffers(int fd) noexcept {
  const int bytes = 4 << 20;
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes);
}

// A link that stays on this host runs under cfg.host_congestion (none: the system's).
// Best effort: a kernel that refuses keeps its default (a name the user chose was
// already tried at start-up: communicator.hpp, config_from_env).
inline void choose_congestion(int fd, const link_config& cfg) {
  if (!cfg.host_congestion.empty() && plait::detail::stays_on_host(fd))
    (void)plait::detail::set_congestion(fd, cfg.host_congestion);
}

inline tcp_hello make_hello(int rank, int peer, const link_config& cfg) {
  tcp_hello h;
  h.rank = rank;
  h.peer = peer;
  h.slot_bytes = cfg.slot_bytes;
  h.depth = cfg.depth;
  return h;
}

// Framing problems of a hello (protocol), or empty.
inline std::string hello_framing_problem(const tcp_hello& h, int me) {
  if (h.magic != hello_magic) return "its first frame is not a plait TCP hello (magic " + hex32(h.magic) + ")";
  if (h.version != tcp_wire_version)
    return "it speaks TCP link version " + std::to_string(h.version) + ", this build " +
           std::to_string(tcp_wire_version) + " (use the same plait version on every rank)";
  if (h.peer != me)
    return "it believes it connected to rank " + std::to_string(h.peer) + ", not rank " + std::to_string(me);
  return {};
}

// The lower rank's side of one pair.
inline fd_handle connect_to_peer(bootstrap_context& ctx, int peer, const link_config& cfg, clock::time_point deadline) {
  const int rank = ctx.rank();
  std::string where;
  try {
    const auto raw = ctx.get(address_key(peer), deadline);
    where.assign(reinterpret_cast<const char*>(raw.data()), raw.size());
  } catch (const error& e) {
    throw error(e.code(),
                "rank " + std::to_string(peer) + " never published its TCP address (" + e.message() +
                    "); did it start, and does it use the same store?",
                rank, peer);
  }
  try {
    const auto [host, port] = plait::detail::parse_host_port(where);
    fd_handle fd = plait::detail::connect_tcp(host, port, deadline);
    bootstrap::authenticate(fd.get(), ctx.token(), bootstrap::auth_role::client, auth_context, deadline);
    const tcp_hello mine = make_hello(rank, peer, cfg);
    plait::detail::send_all(fd.get(), &mine, sizeof mine, deadline);
    tcp_hello theirs;
    plait::detail::recv_all(fd.get(), &theirs, sizeof theirs, deadline);
    if (auto why = hello_framing_problem(theirs, rank); !why.empty()) throw error(errc::protocol, why, rank, peer);
    if (theirs.rank != peer)
      throw error(errc::protocol,
                  "the process listening there is rank " + std::to_string(theirs.rank) + ", not rank " +
                      std::to_string(peer) + " (a stale address from another job?)",
                  rank, peer);
    if (auto why = check_hello_config(theirs, cfg.slot_bytes, cfg.depth); !why.empty())
      throw error(errc::invalid_argument, why, rank, peer);
    return fd;
  } catch (const error& e) {
    throw error(e.code(), "connecting to rank " + std::to_string(peer) + " at " + where + ": " + e.message(), rank,
                peer);
  }
}

// The higher rank's side: accepts and handshakes connections until every expected
// lower rank is in. Threads are stopped and joined by the destructor.
class mesh_acceptor {
 public:
  mesh_acceptor(int listen_fd, int rank, std::vector<int> expected, const link_config& cfg,
                std::span<const std::byte> token, clock::time_point deadline)
      : listen_fd_(listen_fd),
        rank_(rank),
        expected_(std::move(expected)),
        cfg_(cfg),
        token_(token),
        deadline_(deadline) {
    acceptor_ = std::thread([this] { accept_loop(); });
  }

  ~mesh_acceptor() {
    stop_.store(true);
    acceptor_.join();  // within 50 ms; afterwards the list no longer grows
    {
      std::lock_guard lock(mutex_);
      for (auto& h : handshakes_)
        if (h.fd >= 0) ::shutdown(h.fd, SHUT_RDWR);  // wakes a handshake blocked on a silent peer
    }
    for (auto& h : handshakes_) h.thread.join();
  }

  mesh_acceptor(const mesh_acceptor&) = delete;
  mesh_acceptor& operator=(const mesh_acceptor&) = delete;

  // Every expected rank's socket, or throws (timeout naming the missing ranks, or the
  // configuration mismatch an authenticated peer reported).
  socket_list wait() {
    std::unique_lock lock(mutex_);
    done_.wait_until(lock, deadline_, [&] { return fatal_.has_value() || accepted_.size() == expected_.size(); });
    if (fatal_) throw *fatal_;
    if (accepted_.size() == expected_.size()) return std::move(accepted_);
    std::string missing;
    for (int r : expected_) {
      bool in = false;
      for (auto& a : accepted_) in = in || a.first == r;
      if (!in) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
    std::string msg = "rank(s) " + missing + " never connected to this rank before the connect deadline";
    if (rejected_count_ > 0)
      msg += "; " + std::to_string(rejected_count_) +
             " connection(s) were refused meanwhile (last: " + last_rejection_ + ")";
    msg += "; did they start, and do they use the same store and token?";
    throw error(errc::timeout, msg, rank_, -1);
  }

 private:
  struct handshake {
    std::thread thread;
    int fd = -1;  // while the handshake owns an open socket, so the destructor can abort it
    bool done = false;
  };
  static constexpr std::size_t max_handshakes = 64;

  void accept_loop() noexcept {
    while (!stop_.load()) {
      fd_handle fd;
      try {
        fd = plait::detail::accept_until(listen_fd_, std::min(deadline_, clock::now() + std::chrono::milliseconds(50)));
      } catch (const error& e) {
        if (e.code() == errc::timeout) {
          if (clock::now() >= deadline_) return;
          continue;
        }
        return record_fatal(error(e.code(), "accepting TCP connections: " + e.message(), rank_));
      } catch (...) {
        return record_fatal(error(errc::system, "accepting TCP connections failed", rank_));
      }
      std::lock_guard lock(mutex_);
      reap_locked();
      if (handshakes_.size() >= max_handshakes) continue;  // a flood: drop it (fd closes)
      try {
        auto& h = handshakes_.emplace_back();
        h.fd = fd.get();
        h.thread = std::thread([this, &h, owned = std::move(fd)]() mutable { run_handshake(h, std::move(owned)); });
      } catch (...) {
        handshakes_.pop_back();  // could not start a thread: the connection is dropped
      }
    }
  }

  // Joins finished handshake threads so that a stream of bad connections does not pile up.
  void reap_locked() {
    for (auto it = handshakes_.begin(); it != handshakes_.end();) {
      if (it->done) {
        it->thread.join();  // it has only its final unlock left
        it = handshakes_.erase(it);
      } else {
        ++it;
      }
    }
  }

  void run_handshake(handshake& h, fd_handle fd) noexcept {
    std::string rejection;
    try {
      bootstrap::authenticate(fd.get(), token_, bootstrap::auth_role::server, auth_context, deadline_);
      tcp_hello theirs;
      plait::detail::recv_all(fd.get(), &theirs, sizeof theirs, deadline_);
      if (auto why = hello_framing_problem(theirs, rank_); !why.empty()) throw error(errc::protocol, why, rank_);
      if (std::find(expected_.begin(), expected_.end(), theirs.rank) == expected_.end())
        throw error(
            errc::protocol,
            "it claims to be rank " + std::to_string(theirs.rank) + ", which is not a lower-ranked peer of this rank",
            rank_);
      const tcp_hello mine = make_hello(rank_, theirs.rank, cfg_);
      plait::detail::send_all(fd.get(), &mine, sizeof mine, deadline_);
      if (auto why = check_hello_config(theirs, cfg_.slot_bytes, cfg_.depth); !why.empty()) {
        record_fatal(error(errc::invalid_argument, why, rank_, theirs.rank));
      } else {
        std::lock_guard lock(mutex_);
        bool duplicate = false;
        for (auto& a : accepted_) duplicate = duplicate || a.first == theirs.rank;
        if (duplicate) {
          rejection = "a second connection claiming rank " + std::to_string(theirs.rank);
        } else {
          accepted_.emplace_back(theirs.rank, std::move(fd));
          h.fd = -1;
          done_.notify_all();
        }
      }
    } catch (const std::exception& e) {
      rejection = e.what();
    }
    std::lock_guard lock(mutex_);
    if (!rejection.empty()) {
      ++rejected_count_;
      last_rejection_ = std::move(rejection);
    }
    h.fd = -1;  // before the socket closes, so the destructor never shuts down a reused number
    h.done = true;
  }  // fd closes here unless it was accepted

  void record_fatal(error e) noexcept {
    std::lock_guard lock(mutex_);
    if (!fatal_) fatal_.emplace(std::move(e));
    done_.notify_all();
  }

  const int listen_fd_;
  const int rank_;
  const std::vector<int> expected_;
  const link_config cfg_;
  const std::span<const std::byte> token_;
  const clock::time_point deadline_;

  std::mutex mutex_;
  std::condition_variable done_;
  socket_list accepted_;
  std::optional<error> fatal_;
  std::size_t rejected_count_ = 0;
  std::string last_rejection_;
  std::list<handshake> handshakes_;
  std::atomic<bool> stop_{false};
  std::thread acceptor_;
};

// Connects this rank to every peer in `peers`; returns one non-blocking socket per peer.
inline socket_list connect_mesh(bootstrap_context& ctx, const link_config& cfg, std::span<const int> peers) {
  const int rank = ctx.rank();
  const auto deadline = clock::now() + cfg.connect_timeout;
  std::vector<int> lower, higher;
  for (int p : peers) (p < rank ? lower : higher).push_back(p);

  fd_handle listener;
  std::optional<mesh_acceptor> acceptor;  // declared after listener: destroyed first
  if (!lower.empty()) {
    listener = plait::detail::listen_tcp(ctx.listen_address(), 0);
    widen_buffers(listener.get());  // accepted sockets inherit them, window scaling included
    const std::string addr =
        plait::detail::join_host_port(ctx.listen_address(), plait::detail::local_port(listener.get()));
    acceptor.emplace(listener.get(), rank, lower, cfg, ctx.token(), deadline);
    ctx.put(address_key(rank), std::as_bytes(std::span(addr.data(), addr.size())));
  }
  socket_list sockets;
  for (int p : higher) sockets.emplace_back(p, connect_to_peer(ctx, p, cfg, deadline));
  if (acceptor)
    for (auto& s : acceptor->wait()) sockets.push_back(std::move(s));
  acceptor.reset();
  for (auto& [peer, fd] : sockets) {
    widen_buffers(fd.get());
    choose_congestion(fd.get(), cfg);
  }
  return sockets;
}

}  // namespace plait::transport::tcp_detail
