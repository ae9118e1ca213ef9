// tcp-ceiling: how fast two processes on this host do what a 2-rank collective must do
// over loopback TCP sockets, per size: move its bytes, plus the memory work no
// implementation can skip. The ceiling plait's tcp transport (or any library over TCP)
// works under here.
//
// Usage: tcp-ceiling [-N 2] [common bench options: -o -b -e -f -w -n -J ...]
// Two processes, bound to CPUs 0 and 1 as plaitrun and mpirun bind 2 ranks, joined by
// loopback TCP connections; no library, no framing, no data check. Per call:
//   broadcast       rank 0 sends S bytes, rank 1 receives them into its buffer;
//   all_gather      each rank copies its S/2 bytes into its block of the output (out of
//                   place, as measured) and swaps S/2 with the other, received into the
//                   other block;
//   reduce_scatter  each rank sends the S/2 bytes the other owns and receives S/2, summed
//                   with its own half into the output (one pass of a float sum);
//   all_reduce      each rank sends and receives S bytes (every algorithm for 2 ranks moves
//                   at least that: each rank must hear about every element of the other),
//                   summing one half (S/2: the ranks share the reduction).
// No framing, no slots, no schedule.
// Each size is run under every setting of a grid, and the best is reported:
//   write size  64K, 256K, 1M, 4M (at most the payload);
//   landing     straight into the destination (each recv asks for all that is still to
//               come), or through a bounce buffer that stays in cache: each recv takes at
//               most the write size there, and plait's copy loop moves it on, or adds it
//               to the rank's input on the way where the collective reduces (the reduce
//               fused with the landing, as plait's kernel reads a slot);
//   buffers     the kernel's (autotuned), or SO_SNDBUF = SO_RCVBUF = 4 MiB;
//   waiting     poll(2) when a socket would block, or spin on non-blocking calls.
// Times and busbw as every benchmark in bench/ (bench_report.hpp): each rank's median
// over the timed calls, the maximum over ranks, nccl-tests' bus factors; the settings
// that won are printed after each row. Every wait is bounded (30 s per call): a stuck
// socket is an error, not a hang.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <plait/kernel/copy.hpp>

#include "bench_report.hpp"

namespace {

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "tcp-ceiling: %s: %s\n", what, std::strerror(errno));
  std::_Exit(1);
}

constexpr int big_buffers = 4 << 20;
constexpr std::size_t chunk_sizes[] = {std::size_t{64} << 10, std::size_t{256} << 10, std::size_t{1} << 20,
                                       std::size_t{4} << 20};

struct setting {
  std::size_t write = 0;
  bool bounce = false;  // land through a bounce buffer (else straight into the destination)
  bool big = false;     // SO_SNDBUF = SO_RCVBUF = 4 MiB (else the kernel's)
  bool spin = false;    // spin on non-blocking calls (else poll)

  std::string text() const {
    return "write " + std::to_string(write >> 10) + "K, " + (bounce ? "through a bounce buffer" : "landing direct") +
           ", buffers " + (big ? "4M" : "auto") + ", " + (spin ? "spin" : "poll");
  }
};

// out[i] = a[i] + b[i]: the one reduce pass (vectorised: the file is built at -O3).
void add(float* out, const float* a, const float* b, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

// Where the received stream goes: byte p of it to dst[p], or, for p in [add_lo, add_hi)
// (multiples of 4), the float sum of it and add_to[p] to dst[p].
struct landing {
  char* dst = nullptr;
  const char* add_to = nullptr;
  std::size_t add_lo = 0, add_hi = 0;
  char* bounce = nullptr;  // the bounce buffer (the write size and 4 bytes more)

  // Stream bytes [pos, pos + n) are at p: copied or added on to their place.
  void put(std::size_t pos, const char* p, std::size_t n) const {
    const std::size_t lo = std::clamp(add_lo, pos, pos + n), hi = std::clamp(add_hi, pos, pos + n);
    if (lo > pos) plait::kernel::copy_bytes(dst + pos, p, lo - pos);
    if (hi > lo)
      add(reinterpret_cast<float*>(dst + lo), reinterpret_cast<const float*>(add_to + lo),
          reinterpret_cast<const float*>(p + (lo - pos)), (hi - lo) / sizeof(float));
    if (pos + n > hi) plait::kernel::copy_bytes(dst + hi, p + (hi - pos), pos + n - hi);
  }
  // After a direct landing: the sum pass over [add_lo, add_hi), in place.
  void finish_direct() const {
    if (add_hi > add_lo)
      add(reinterpret_cast<float*>(dst + add_lo), reinterpret_cast<const float*>(add_to + add_lo),
          reinterpret_cast<const float*>(dst + add_lo), (add_hi - add_lo) / sizeof(float));
  }
};

// The control channel (a socketpair): barriers and each rank's median.
struct control {
  int fd = -1;
  void put(const void* p, std::size_t n) const {
    if (::write(fd, p, n) != static_cast<ssize_t>(n)) die("control write");
  }
  void get(void* p, std::size_t n) const {
    auto* c = static_cast<char*>(p);
    while (n > 0) {
      const ssize_t k = ::read(fd, c, n);
      if (k <= 0) die("control read (the other rank stopped)");
      c += k;
      n -= static_cast<std::size_t>(k);
    }
  }
  void barrier() const {
    char b = 0;
    put(&b, 1);
    get(&b, 1);
  }
};

void set_nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) die("fcntl(O_NONBLOCK)");
}

// Sends `out` bytes of `src` and receives `in` bytes into `dst` on one socket at once,
// as the setting says. A call that makes no progress for 30 s is an error.
void move(int fd, const char* src, std::size_t out, const landing& to, std::size_t in, const setting& s) {
  std::size_t sent = 0, got = 0;
  std::size_t carry = 0;  // bytes in the bounce buffer not yet put (less than a float)
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (sent < out || got < in) {
    bool progress = false;
    if (sent < out) {
      const ssize_t k = ::send(fd, src + sent, std::min(s.write, out - sent), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (k > 0) {
        sent += static_cast<std::size_t>(k);
        progress = true;
      } else if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        die("send");
      }
    }
    if (got < in) {
      char* at = s.bounce ? to.bounce + carry : to.dst + got;
      const ssize_t k = ::recv(fd, at, s.bounce ? std::min(s.write, in - got) : in - got, MSG_DONTWAIT);
      if (k > 0) {
        got += static_cast<std::size_t>(k);
        progress = true;
        if (s.bounce) {  // whole floats on, the rest kept for the next recv (all of it at the end)
          const std::size_t have = carry + static_cast<std::size_t>(k);
          const std::size_t n = got == in ? have : have / sizeof(float) * sizeof(float);
          to.put(got - have, to.bounce, n);
          carry = have - n;
          std::memmove(to.bounce, to.bounce + n, carry);
        }
      } else if (k == 0) {
        errno = ECONNRESET;
        die("recv (the other rank closed)");
      } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        die("recv");
      }
    }
    if (progress) {
      deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      continue;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      errno = ETIMEDOUT;
      die("no progress for 30 s");
    }
    if (!s.spin) {
      pollfd p{fd, static_cast<short>((sent < out ? POLLOUT : 0) | (got < in ? POLLIN : 0)), 0};
      if (::poll(&p, 1, 1000) < 0 && errno != EINTR) die("poll");
    }
  }
  if (!s.bounce) to.finish_direct();
}

// Bytes each rank sends and receives per call: {rank 0 out, rank 0 in}; rank 1 mirrors.
std::pair<std::size_t, std::size_t> traffic(const std::string& op, std::size_t bytes) {
  if (op == "broadcast") return {bytes, 0};
  if (op == "all_reduce") return {bytes, bytes};
  return {bytes / 2, bytes / 2};
}

// One call of `op` on `rank`: its bytes through the socket and its local memory work.
// src and dst hold `bytes`, scratch half of them.
void one_call(const std::string& op, int rank, int fd, char* src, char* dst, char* bounce, std::size_t bytes,
              std::size_t out, std::size_t in, const setting& s) {
  const std::size_t half = bytes / 2, mine = rank == 0 ? 0 : half, theirs = half - mine;
  if (op == "broadcast") {
    move(fd, src, out, landing{dst, nullptr, 0, 0, bounce}, in, s);
  } else if (op == "all_gather") {  // own block into the output, the other's received into its block
    plait::kernel::copy_bytes(dst + mine, src, half);
    move(fd, src, half, landing{dst + theirs, nullptr, 0, 0, bounce}, half, s);
  } else if (op == "reduce_scatter") {  // the other's part of my half, added to mine into the output
    move(fd, src + theirs, half, landing{dst, src + mine, 0, half, bounce}, half, s);
  } else {  // all_reduce: all of the other's buffer, my half added to mine
    move(fd, src, bytes, landing{dst, src, mine, mine + half, bounce}, bytes, s);
  }
}

// A loopback connection pair: `listener` was made before the fork; rank 1 connects.
int connect_to(const sockaddr_in& a, bool big) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) die("socket");
  if (big) {
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &big_buffers, sizeof big_buffers);
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &big_buffers, sizeof big_buffers);
  }
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) die("connect");
  return fd;
}

int listen_on_loopback(sockaddr_in& a, bool big) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) die("socket");
  if (big) {  // set on the listener, before listen: the accepted socket's window scale follows
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &big_buffers, sizeof big_buffers);
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &big_buffers, sizeof big_buffers);
  }
  a = {};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, 1) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    die("listen on 127.0.0.1");
  return fd;
}

void bind_to_cpu(int rank) {
  cpu_set_t allowed;
  if (::sched_getaffinity(0, sizeof allowed, &allowed) != 0 || CPU_COUNT(&allowed) < 2) return;
  int seen = 0;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (!CPU_ISSET(c, &allowed)) continue;
    if (seen++ == rank) {
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(c, &one);
      ::sched_setaffinity(0, sizeof one, &one);
      return;
    }
  }
}

int run(int rank, const bench::options& o, control ctl, int fd_auto, int fd_big) {
  bind_to_cpu(rank);
  for (int fd : {fd_auto, fd_big}) {
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    set_nonblocking(fd);
  }
  const std::vector<std::size_t> sizes = bench::sizes(o);
  const std::size_t top = sizes.empty() ? 0 : sizes.back();
  // Touched now, not while timing.
  std::vector<char> src(std::max<std::size_t>(top, 1), 1), dst(std::max<std::size_t>(top, 1), 0),
      bounce(chunk_sizes[std::size(chunk_sizes) - 1] + sizeof(float), 0);

  // What the kernel gave for the 4 MiB asked (capped by net.core.wmem_max / rmem_max;
  // getsockopt reports twice the size, bookkeeping included).
  int given_snd = 0, given_rcv = 0;
  socklen_t len = sizeof given_snd;
  ::getsockopt(fd_big, SOL_SOCKET, SO_SNDBUF, &given_snd, &len);
  len = sizeof given_rcv;
  ::getsockopt(fd_big, SOL_SOCKET, SO_RCVBUF, &given_rcv, &len);
  bench::report rep(
      o, "tcp-ceiling", "0.1", 2,
      "2 processes bound to CPUs 0 and 1, loopback TCP (TCP_NODELAY), the bytes and local memory work "
      "the collective must do (own block copied, one float-sum pass), no framing; per size the best of "
      "write 64K/256K/1M/4M x landing (direct, through a bounce buffer) x buffers (the kernel's autotuned, or "
      "SO_SNDBUF = SO_RCVBUF = 4 MiB asked: getsockopt gives " +
          std::to_string(given_snd >> 10) + "K / " + std::to_string(given_rcv >> 10) + "K) x wait (poll, spin)",
      rank == 0);
  rep.header();
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    rep.progress(i, sizes.size(), sizes[i]);
    const std::size_t count = bench::count_for(o, sizes[i], sizeof(float), 2);
    const std::size_t bytes = count * sizeof(float);
    auto [out, in] = traffic(o.op, bytes);
    if (rank == 1 && o.op == "broadcast") std::swap(out, in);
    double best = 0;
    long faults = 0;
    setting best_setting;
    bool tried = false;
    for (std::size_t c : chunk_sizes) {
      const std::size_t payload = std::max(out, in);
      const std::size_t write = std::min(c, std::max<std::size_t>(payload, 1));
      for (bool through_bounce : {false, true})
        for (bool big : {false, true})
          for (bool spin : {false, true}) {
            const setting s{write, through_bounce, big, spin};
            const int fd = big ? fd_big : fd_auto;
            const bench::timed_calls t = bench::time_calls(
                o.warmup, o.iters,
                [&] { one_call(o.op, rank, fd, src.data(), dst.data(), bounce.data(), bytes, out, in, s); },
                [&] { ctl.barrier(); });
            double mine = bench::median(t.us), theirs = 0;
            long their_faults = 0;
            // Rank 1 sends its median and faults; rank 0 takes the maximum.
            if (rank == 1) {
              ctl.put(&mine, sizeof mine);
              ctl.put(&t.faults, sizeof t.faults);
            } else {
              ctl.get(&theirs, sizeof theirs);
              ctl.get(&their_faults, sizeof their_faults);
              const double both = std::max(mine, theirs);
              if (!tried || both < best) {
                best = both;
                best_setting = s;
              }
              faults = std::max({faults, t.faults, their_faults});
            }
            tried = true;
            ctl.barrier();
          }
      if (write == payload) break;  // one write per call already
    }
    bench::row r;
    r.bytes = bytes;
    r.count = count;
    r.root = o.op == "broadcast" ? 0 : -1;
    r.time_us = best;
    r.minflt = static_cast<double>(faults) / o.iters;
    rep.add(r);
    if (rank == 0) std::printf("#   best at %zu B: %s\n", bytes, best_setting.text().c_str());
  }
  return rep.finish() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  // -N: the only rank count measured is 2 (taken for bench/compare's sake).
  std::vector<char*> rest{argv[0]};
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "-N") == 0 && i + 1 < argc) {
      if (std::strcmp(argv[++i], "2") != 0) bench::usage(argv[0], "only 2 ranks (-N 2) are measured");
      continue;
    }
    rest.push_back(argv[i]);
  }
  bench::options defaults;
  defaults.transport = "tcp";
  defaults.algo = "best of grid";
  const bench::options o =
      bench::parse(static_cast<int>(rest.size()), rest.data(), defaults, "  -N 2   ranks (2 only)\n");
  if (o.op != "broadcast" && o.op != "all_gather" && o.op != "reduce_scatter" && o.op != "all_reduce")
    bench::usage(argv[0], "-o must be all_reduce, all_gather, reduce_scatter or broadcast");
  if (o.root != 0) bench::usage(argv[0], "-R: only root 0 is measured");

  sockaddr_in a_auto{}, a_big{};
  const int l_auto = listen_on_loopback(a_auto, false), l_big = listen_on_loopback(a_big, true);
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM, 0, pair) != 0) die("socketpair");
  std::fflush(nullptr);
  const pid_t child = ::fork();
  if (child < 0) die("fork");
  if (child == 0) {
    ::close(pair[0]);
    ::close(l_auto);
    ::close(l_big);
    const int fa = connect_to(a_auto, false), fb = connect_to(a_big, true);
    std::_Exit(run(1, o, control{pair[1]}, fa, fb));
  }
  ::close(pair[1]);
  const int fa = ::accept(l_auto, nullptr, nullptr), fb = ::accept(l_big, nullptr, nullptr);
  if (fa < 0 || fb < 0) die("accept");
  ::close(l_auto);
  ::close(l_big);
  const int rc = run(0, o, control{pair[0]}, fa, fb);
  int status = 0;
  if (::waitpid(child, &status, 0) != child) die("waitpid");
  const bool child_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  if (!child_ok) std::fprintf(stderr, "tcp-ceiling: rank 1 failed (status %d)\n", status);
  return rc != 0 || !child_ok ? 1 : 0;
}
