// TCP socket utilities shared by the bootstrap store and the TCP transport.
//
// Every blocking call here takes a deadline (plait::clock) and never waits past it:
// send_all/recv_all poll() first and then use MSG_DONTWAIT, so they work the same on
// blocking and non-blocking sockets. Failures are plait::error: timeout when the
// deadline passes, peer_lost when the peer closed or reset the connection, system
// for anything else the kernel refuses, invalid_argument for malformed addresses.
// No function keeps state; they are safe to call from any thread on distinct fds.
// fd_handle is the owner of a descriptor (closes it on destruction, never throws).
// Names are resolved with getaddrinfo; IPv4 and IPv6 both work.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>

#include <plait/error.hpp>
#include <plait/transport.hpp>  // plait::clock

namespace plait::detail {

// Owns one file descriptor. Movable, not copyable; closes on destruction.
class fd_handle {
 public:
  fd_handle() noexcept = default;
  explicit fd_handle(int fd) noexcept : fd_(fd) {}
  fd_handle(fd_handle&& other) noexcept : fd_(other.release()) {}
  fd_handle& operator=(fd_handle&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  fd_handle(const fd_handle&) = delete;
  fd_handle& operator=(const fd_handle&) = delete;
  ~fd_handle() { reset(); }

  int get() const noexcept { return fd_; }
  int release() noexcept { return std::exchange(fd_, -1); }
  void reset(int fd = -1) noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }
  explicit operator bool() const noexcept { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

inline std::string errno_text(int e) { return std::system_category().message(e); }

// Milliseconds left until the deadline, rounded up, clamped to [0, INT_MAX], for poll().
inline int poll_timeout_ms(clock::time_point deadline) {
  auto left = deadline - clock::now();
  if (left <= clock::duration::zero()) return 0;
  auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return static_cast<int>(std::min<long long>(ms, INT_MAX));
}

// Text of a socket address ("1.2.3.4" or "::1"; v4-mapped v6 as plain v4).
inline std::string address_text(const sockaddr_storage& ss) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET) {
    auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf);
  } else if (ss.ss_family == AF_INET6) {
    auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    if (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr))
      ::inet_ntop(AF_INET, &a->sin6_addr.s6_addr[12], buf, sizeof buf);
    else
      ::inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf);
  } else {
    return "?";
  }
  return buf;
}

inline std::uint16_t address_port(const sockaddr_storage& ss) {
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&ss)->sin_port);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_port);
  return 0;
}

// "host:port" with IPv6 hosts in brackets.
inline std::string join_host_port(const std::string& host, std::uint16_t port) {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

inline std::uint16_t local_port(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0)
    throw error(errc::system, "getsockname failed: " + errno_text(errno));
  return address_port(ss);
}

inline std::string local_address(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0)
    throw error(errc::system, "getsockname failed: " + errno_text(errno));
  return address_text(ss);
}

// "host:port" of the other end, or "the remote end" once the socket is disconnected.
inline std::string peer_endpoint(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "the remote end";
  return join_host_port(address_text(ss), address_port(ss));
}

inline void set_nodelay(int fd) {
  int one = 1;
  if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0)
    throw error(errc::system, "setsockopt(TCP_NODELAY) failed: " + errno_text(errno));
}

inline void set_nonblocking(int fd, bool on) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0) throw error(errc::system, "fcntl(F_GETFL) failed: " + errno_text(errno));
  int wanted = on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK);
  if (wanted != flags && ::fcntl(fd, F_SETFL, wanted) != 0)
    throw error(errc::system, "fcntl(F_SETFL) failed: " + errno_text(errno));
}

// "host:port" or "[v6]:port". The port must be a decimal number in 0..65535.
inline std::pair<std::string, std::uint16_t> parse_host_port(std::string_view text) {
  auto bad = [&](const char* why) {
    return error(errc::invalid_argument,
                 "bad address '" + std::string(text) + "': " + why + " (expected host:port or [ipv6]:port)");
  };
  std::string_view host, port;
  if (!text.empty() && text.front() == '[') {
    auto close = text.find(']');
    if (close == std::string_view::npos) throw bad("missing ']'");
    host = text.substr(1, close - 1);
    if (close + 1 >= text.size() || text[close + 1] != ':') throw bad("missing ':' after ']'");
    port = text.substr(close + 2);
  } else {
    auto colon = text.rfind(':');
    if (colon == std::string_view::npos) throw bad("missing ':port'");
    host = text.substr(0, colon);
    if (host.find(':') != std::string_view::npos) throw bad("IPv6 hosts must be in brackets");
    port = text.substr(colon + 1);
  }
  if (host.empty()) throw bad("empty host");
  if (port.empty() || port.size() > 5) throw bad("port must be a number in 0..65535");
  unsigned value = 0;
  for (char c : port) {
    if (c < '0' || c > '9') throw bad("port must be a number in 0..65535");
    value = value * 10 + static_cast<unsigned>(c - '0');
  }
  if (value > 65535) throw bad("port must be a number in 0..65535");
  return {std::string(host), static_cast<std::uint16_t>(value)};
}

inline bool is_loopback_address(const std::string& host_text) {
  std::string host = host_text;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host == "localhost") return true;
  in_addr v4{};
  if (::inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (::inet_pton(AF_INET6, host.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
  }
  return false;
}

// Whether a connected socket's bytes never leave this host: its peer's address is a
// loopback one, or the address of its own end (a rank that reached this host's own
// address). Such a connection runs over the loopback device; false when unknown.
inline bool stays_on_host(int fd) {
  sockaddr_storage mine{}, theirs{};
  socklen_t mine_len = sizeof mine, theirs_len = sizeof theirs;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&mine), &mine_len) != 0 ||
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&theirs), &theirs_len) != 0)
    return false;
  const std::string peer = address_text(theirs);
  return is_loopback_address(peer) || peer == address_text(mine);
}

// TCP congestion control on one socket (TCP_CONGESTION): selects `name`; returns 0,
// or the errno of the refusal (ENOENT: not in this kernel; EPERM: not in
// net.ipv4.tcp_allowed_congestion_control, which binds processes without
// CAP_NET_ADMIN).
inline int set_congestion(int fd, const std::string& name) noexcept {
  if (::setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name.data(), static_cast<socklen_t>(name.size())) == 0) return 0;
  return errno;
}

// The congestion control a socket uses, or "" when the kernel does not say.
inline std::string congestion_of(int fd) {
  char name[32] = {};  // TCP_CA_NAME_MAX 16
  socklen_t len = sizeof name - 1;
  if (::getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &len) != 0) return {};
  return std::string(name, ::strnlen(name, len));
}

// getaddrinfo as an owning list. EAI_AGAIN (temporary) is reported as nullptr so
// callers that retry can retry; any other failure throws invalid_argument.
struct addrinfo_list {
  addrinfo* head = nullptr;
  addrinfo_list() = default;
  addrinfo_list(const addrinfo_list&) = delete;
  addrinfo_list& operator=(const addrinfo_list&) = delete;
  ~addrinfo_list() {
    if (head) ::freeaddrinfo(head);
  }
};

inline bool resolve(const std::string& host, std::uint16_t port, bool passive, addrinfo_list& out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  std::string service = std::to_string(port);
  const char* node = host.empty() ? nullptr : host.c_str();
  int rc = ::getaddrinfo(node, service.c_str(), &hints, &out.head);
  if (rc == 0) return true;
  if (rc == EAI_AGAIN) return false;
  throw error(errc::invalid_argument, "cannot resolve host '" + host + "': " + ::gai_strerror(rc) +
                                          "; check the address (PLAIT_STORE, MASTER_ADDR, PLAIT_ADDR)");
}

// A listening socket on host:port (port 0 = ephemeral; host "" or "0.0.0.0" = all
// IPv4 interfaces). SO_REUSEADDR, close-on-exec, and non-blocking, so that a poll()
// loop never stalls in accept() on a connection that was reset before it was taken.
inline fd_handle listen_tcp(const std::string& host, std::uint16_t port, int backlog = 128) {
  addrinfo_list list;
  if (!resolve(host, port, true, list))
    throw error(errc::system, "cannot resolve '" + host + "' right now (temporary DNS failure)");
  int last_errno = 0;
  // IPv4 first: the common case, and what "0.0.0.0"-style configurations expect.
  for (int family : {AF_INET, AF_INET6}) {
    for (addrinfo* ai = list.head; ai; ai = ai->ai_next) {
      if (ai->ai_family != family) continue;
      fd_handle fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol));
      if (!fd) {
        last_errno = errno;
        continue;
      }
      int one = 1;
      ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd.get(), backlog) != 0) {
        last_errno = errno;
        continue;
      }
      return fd;
    }
  }
  throw error(
      errc::system,
      "cannot listen on " + join_host_port(host.empty() ? "*" : host, port) + ": " + errno_text(last_errno) +
          (last_errno == EADDRINUSE      ? " (another process holds the port; pick another)"
           : last_errno == EADDRNOTAVAIL ? " (the address is not one of this host's; check PLAIT_ADDR/PLAIT_STORE)"
                                         : ""));
}

namespace socket_detail {

// Errors after which connecting again may succeed (the listener is not up yet,
// the route is coming up, the ephemeral ports are momentarily exhausted).
inline bool connect_retryable(int e) {
  switch (e) {
    case ECONNREFUSED:
    case ENETUNREACH:
    case EHOSTUNREACH:
    case ETIMEDOUT:
    case ECONNRESET:
    case ECONNABORTED:
    case EAGAIN:
    case EADDRNOTAVAIL:
    case EINTR:
    case ENETDOWN:
    case EHOSTDOWN:
      return true;
    default:
      return false;
  }
}

// One non-blocking connect attempt, bounded by `until`. Returns 0 and a connected
// (blocking) socket, or the errno of the failure.
inline int try_connect(const addrinfo* ai, clock::time_point until, fd_handle& out) {
  fd_handle fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol));
  if (!fd) return errno;
  if (::connect(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
    if (errno != EINPROGRESS) return errno;
    pollfd p{fd.get(), POLLOUT, 0};
    int n = ::poll(&p, 1, poll_timeout_ms(until));
    if (n < 0) return errno;
    if (n == 0) return ETIMEDOUT;
    int err = 0;
    socklen_t len = sizeof err;
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return err;
  }
  // Loopback connects to an ephemeral port with no listener can "succeed" by TCP
  // simultaneous open onto themselves; that is no peer at all.
  sockaddr_storage self{}, peer{};
  socklen_t ls = sizeof self, lp = sizeof peer;
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&self), &ls) == 0 &&
      ::getpeername(fd.get(), reinterpret_cast<sockaddr*>(&peer), &lp) == 0 && ls == lp &&
      address_port(self) == address_port(peer) && address_text(self) == address_text(peer))
    return ECONNREFUSED;
  set_nonblocking(fd.get(), false);
  set_nodelay(fd.get());
  out = std::move(fd);
  return 0;
}

}  // namespace socket_detail

// Connects to host:port, retrying refused/unreachable attempts with short sleeps
// until the deadline (the peer or store may not be listening yet). Returns a
// blocking socket with TCP_NODELAY set.
inline fd_handle connect_tcp(const std::string& host, std::uint16_t port, clock::time_point deadline) {
  using namespace std::chrono_literals;
  const std::string where = join_host_port(host, port);
  auto backoff = 5ms;
  int last_errno = 0;
  for (;;) {
    addrinfo_list list;
    if (resolve(host, port, false, list)) {
      for (addrinfo* ai = list.head; ai; ai = ai->ai_next) {
        fd_handle fd;
        int e = socket_detail::try_connect(ai, deadline, fd);
        if (e == 0) return fd;
        if (!socket_detail::connect_retryable(e))
          throw error(errc::system, "cannot connect to " + where + ": " + errno_text(e));
        last_errno = e;
      }
    } else {
      last_errno = EAI_AGAIN;
    }
    auto now = clock::now();
    if (now >= deadline) break;
    std::this_thread::sleep_for(std::min<clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
  }
  std::string why = last_errno == EAI_AGAIN ? std::string("name resolution kept failing") : errno_text(last_errno);
  throw error(errc::timeout, "could not connect to " + where + " before the deadline (last error: " + why +
                                 "); is the peer/store running, and is the address right "
                                 "(PLAIT_STORE, MASTER_ADDR/MASTER_PORT, PLAIT_ADDR)?");
}

// Accepts one connection, waiting until the deadline. The result is blocking,
// close-on-exec, with TCP_NODELAY set.
inline fd_handle accept_until(int listen_fd, clock::time_point deadline) {
  for (;;) {
    fd_handle fd(::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC));
    if (fd) {
      set_nodelay(fd.get());
      return fd;
    }
    int e = errno;
    if (e != EAGAIN && e != EWOULDBLOCK && e != EINTR && e != ECONNABORTED && e != EPROTO)
      throw error(errc::system, "accept failed: " + errno_text(e));
    if (e == EINTR || e == ECONNABORTED || e == EPROTO) continue;
    pollfd p{listen_fd, POLLIN, 0};
    int timeout = poll_timeout_ms(deadline);
    if (timeout == 0 || (::poll(&p, 1, timeout) == 0 && clock::now() >= deadline))
      throw error(errc::timeout, "no connection arrived on port " + std::to_string(local_port(listen_fd)) +
                                     " before the deadline; is the peer running and able to reach this host?");
  }
}

// Sends exactly n bytes or throws (timeout at the deadline, peer_lost on EPIPE/reset).
inline void send_all(int fd, const void* data, std::size_t n, clock::time_point deadline) {
  auto* p = static_cast<const std::byte*>(data);
  while (n > 0) {
    ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k > 0) {
      p += k;
      n -= static_cast<std::size_t>(k);
      continue;
    }
    int e = errno;
    if (e == EINTR) continue;
    if (e == EPIPE || e == ECONNRESET || e == ENOTCONN || e == ETIMEDOUT)
      throw error(errc::peer_lost,
                  "connection to " + peer_endpoint(fd) + " was closed by the peer (" + errno_text(e) + ")");
    if (e != EAGAIN && e != EWOULDBLOCK) throw error(errc::system, "send failed: " + errno_text(e));
    pollfd pfd{fd, POLLOUT, 0};
    int timeout = poll_timeout_ms(deadline);
    if (timeout == 0 || ::poll(&pfd, 1, timeout) == 0) {
      if (clock::now() >= deadline)
        throw error(errc::timeout, "sending to " + peer_endpoint(fd) +
                                       " did not complete before the deadline (the peer is not reading)");
    }
  }
}

// Receives exactly n bytes or throws (timeout at the deadline, peer_lost on EOF/reset).
inline void recv_all(int fd, void* data, std::size_t n, clock::time_point deadline) {
  auto* p = static_cast<std::byte*>(data);
  while (n > 0) {
    ssize_t k = ::recv(fd, p, n, MSG_DONTWAIT);
    if (k > 0) {
      p += k;
      n -= static_cast<std::size_t>(k);
      continue;
    }
    if (k == 0) throw error(errc::peer_lost, "connection to " + peer_endpoint(fd) + " was closed by the peer");
    int e = errno;
    if (e == EINTR) continue;
    if (e == ECONNRESET || e == ENOTCONN || e == ETIMEDOUT || e == EPIPE)
      throw error(errc::peer_lost, "connection to " + peer_endpoint(fd) + " was reset (" + errno_text(e) + ")");
    if (e != EAGAIN && e != EWOULDBLOCK) throw error(errc::system, "recv failed: " + errno_text(e));
    pollfd pfd{fd, POLLIN, 0};
    int timeout = poll_timeout_ms(deadline);
    if (timeout == 0 || ::poll(&pfd, 1, timeout) == 0) {
      if (clock::now() >= deadline)
        throw error(errc::timeout, "no data from " + peer_endpoint(fd) + " before the deadline");
    }
  }
}

}  // namespace plait::detail
