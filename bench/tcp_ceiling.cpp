// tcp-ceiling: how fast N processes on this host do what an N-rank collective must do
// over loopback TCP sockets, per size: move its bytes, plus the memory work no
// implementation can skip. The ceiling plait's tcp transport (or any library over TCP)
// works under here.
//
// Usage: tcp-ceiling [-N ranks] [common bench options: -o -b -e -f -w -n -J ...]
// N processes (default 2) joined by loopback TCP connections (every pair; with 2 ranks,
// one connection both ways). They are bound as plaitrun binds ranks: one CPU each where
// there are enough, else round robin (rank r on CPU r mod C); with more ranks than CPUs,
// also not bound, left to the scheduler. No library, no framing, no data check. With S
// bytes and b = S/N (a block) per call:
//   broadcast       rank 0's S bytes to every other rank: a chain (each middle rank
//                   receives S and sends S: (N-1) S through sockets, the least any
//                   broadcast moves), or a tree, or the root sending to each;
//   all_gather      each rank copies its block into the output (out of place, as
//                   measured), and sends and receives S - b, received into the other
//                   blocks;
//   reduce_scatter  each rank sends and receives S - b, summed with its own input on
//                   the way (one pass of a float sum over what arrives);
//   all_reduce      each rank sends and receives 2 (S - b), summing the first S - b
//                   (a reduce-scatter, then an all-gather: the least any all_reduce
//                   moves per rank; with 2 ranks, each rank's whole buffer), or, in
//                   plait's tree, S to and from the parent and each child (the fewest
//                   bytes between ranks on different CPUs when they share CPUs).
// What a rank sends does not wait on what it receives, as it must in a collective (a
// relay cannot send what has not arrived): the ceiling is the bytes and the memory
// work alone. No framing, no slots, no schedule.
// Each size is run under every setting of a grid:
//   pattern     (3 ranks and more) the ring (to rank r + 1, from r - 1), the ring in CPU
//               order (ranks sharing a CPU next to each other, where some do), all pairs,
//               plait's binary tree from rank 0 (all_reduce and broadcast);
//   placement   bound as plaitrun binds, or (more ranks than CPUs) not bound;
//   write size  64K, 256K, 1M, 4M (at most the payload);
//   landing     straight into the destination (each recv asks for all that is still to
//               come), or through a bounce buffer that stays in cache: each recv takes at
//               most the write size there, and plait's copy loop moves it on, or adds it
//               to the rank's input on the way where the collective reduces (the reduce
//               fused with the landing, as plait's kernel reads a slot);
//   buffers     the kernel's (autotuned), or SO_SNDBUF = SO_RCVBUF = 4 MiB;
//   waiting     poll(2) when a socket would block, or spin on non-blocking calls (only
//               with a CPU per rank: a spinning rank would hold the CPU its peer needs).
// Every setting is screened with 1 warm-up and 3 timed calls; the 3 fastest are timed
// with the calls asked (-w, -n), and the best of them is reported.
// Every connection uses the congestion control plait gives its links on one host
// (reno with a CPU per rank, else the system's; PLAIT_TCP_CONGESTION as for plait).
// Times and busbw as every benchmark in bench/ (bench_report.hpp): each rank's median
// over the timed calls, the maximum over ranks, nccl-tests' bus factors; the settings
// that won are printed after each row. Every wait is bounded (30 s per call): a stuck
// socket is an error, not a hang.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <plait/communicator.hpp>
#include <plait/detail/socket.hpp>
#include <plait/kernel/copy.hpp>

#include "bench_report.hpp"
#include "bounds.hpp"
#include "ranks.hpp"

namespace {

using bench::ranks::bind_to_cpu;
using bench::ranks::control;
using bench::ranks::die;
using bench::ranks::get_all;
using bench::ranks::max_ranks;
using bench::ranks::placement;
using bench::ranks::put_all;

constexpr int big_buffers = 4 << 20;
constexpr std::size_t chunk_sizes[] = {std::size_t{64} << 10, std::size_t{256} << 10, std::size_t{1} << 20,
                                       std::size_t{4} << 20};

// Who sends to whom (3 ranks and more; with 2 there is one connection, used both ways).
enum class pattern : std::uint8_t {
  ring,         // to rank r + 1, from rank r - 1 (broadcast: the chain 0 -> 1 -> ... -> N-1)
  ring_by_cpu,  // the same along the ranks in CPU order (0, 2, 1, 3 on 2 CPUs): ranks
                // sharing a CPU next to each other, as plait's broadcast chain takes them
  pairs,        // every pair of ranks exchanges directly
  tree,         // plait's binary tree from rank 0 (all_reduce: up and down; broadcast: down)
};

std::string name(pattern p, const std::vector<int>& order) {
  switch (p) {
    case pattern::ring:
      return "ring";
    case pattern::ring_by_cpu: {
      std::string s = "ring in CPU order ";
      for (std::size_t i = 0; i < order.size(); ++i) {
        if (i > 0) s += '-';
        s += std::to_string(order[i]);
      }
      return s;
    }
    case pattern::pairs:
      return "all pairs";
    case pattern::tree:
      return "tree";
  }
  return "?";
}

struct setting {
  std::size_t write = 0;
  bool bounce = false;  // land through a bounce buffer (else straight into the destination)
  bool big = false;     // SO_SNDBUF = SO_RCVBUF = 4 MiB (else the kernel's)
  bool spin = false;    // spin on non-blocking calls (else poll)
  pattern shape = pattern::ring;
  bool bound = true;  // each rank on its CPU as plaitrun binds (else anywhere: more ranks than CPUs)

  std::string text(int ranks, int cpus, const std::vector<int>& order) const {
    return (ranks > 2 ? name(shape, order) + ", " : std::string()) +
           (cpus < ranks ? std::string(bound ? "bound round robin, " : "not bound, ") : std::string()) + "write " +
           std::to_string(write >> 10) + "K, " + (bounce ? "through a bounce buffer" : "landing direct") +
           ", buffers " + (big ? "4M" : "auto") + ", " + (spin ? "spin" : "poll");
  }
};

// out[i] = a[i] + b[i]: the one reduce pass (vectorised: the file is built at -O3).
void add(float* out, const float* a, const float* b, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

// Where a received stream goes: byte p of it to dst[(base + p) % wrap], or, for p in
// [add_lo, add_hi) (multiples of 4), the float sum of it and add_to[p] there.
struct landing {
  char* dst = nullptr;
  std::size_t wrap = 0, base = 0;  // dst holds wrap bytes; the stream starts at dst + base
  const char* add_to = nullptr;
  std::size_t add_lo = 0, add_hi = 0;

  // Where stream byte pos lands, and how many bytes from there fit before dst's end.
  char* at(std::size_t pos) const noexcept { return dst + (base + pos) % wrap; }
  std::size_t room(std::size_t pos) const noexcept { return wrap - (base + pos) % wrap; }

  // Stream bytes [pos, pos + n) are at p: copied or added on to their place.
  void put(std::size_t pos, const char* p, std::size_t n) const {
    for_pieces(pos, n, [&](std::size_t at_pos, std::size_t k) { put_piece(at_pos, p + (at_pos - pos), k); });
  }
  // After a direct landing: the sum pass over [add_lo, add_hi), in place.
  void finish_direct() const {
    if (add_hi <= add_lo) return;
    for_pieces(add_lo, add_hi - add_lo, [&](std::size_t pos, std::size_t k) {
      add(reinterpret_cast<float*>(at(pos)), reinterpret_cast<const float*>(add_to + pos),
          reinterpret_cast<const float*>(at(pos)), k / sizeof(float));
    });
  }

 private:
  // f(pos, k) for the pieces of [pos, pos + n) that do not cross dst's end.
  template <class F>
  void for_pieces(std::size_t pos, std::size_t n, F&& f) const {
    while (n > 0) {
      const std::size_t k = std::min(n, room(pos));
      f(pos, k);
      pos += k;
      n -= k;
    }
  }
  void put_piece(std::size_t pos, const char* p, std::size_t n) const {
    char* d = at(pos);
    const std::size_t lo = std::clamp(add_lo, pos, pos + n), hi = std::clamp(add_hi, pos, pos + n);
    if (lo > pos) plait::kernel::copy_bytes(d, p, lo - pos);
    if (hi > lo)
      add(reinterpret_cast<float*>(d + (lo - pos)), reinterpret_cast<const float*>(add_to + lo),
          reinterpret_cast<const float*>(p + (lo - pos)), (hi - lo) / sizeof(float));
    if (pos + n > hi) plait::kernel::copy_bytes(d + (hi - pos), p + (hi - pos), pos + n - hi);
  }
};

void set_nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) die("fcntl(O_NONBLOCK)");
}

// One byte stream a rank sends (out bytes of src, wrapping at src_bytes, on out_fd) and
// one it receives (in bytes from in_fd, to `to`); either may be empty.
struct stream {
  int out_fd = -1;
  const char* src = nullptr;
  std::size_t src_bytes = 0, out = 0;
  int in_fd = -1;
  landing to;
  std::size_t in = 0;
};

// Moves every stream at once, as the setting says. bounce: the write size and 4 bytes
// more. A call that makes no progress for 30 s is an error.
void move(const std::vector<stream>& streams, char* bounce, const setting& s) {
  struct state {
    std::size_t sent = 0, got = 0;
    std::size_t carry = 0;  // received bytes not yet put (less than a float, through the bounce buffer)
    char carried[sizeof(float)] = {};
  };
  std::vector<state> st(streams.size());
  std::vector<pollfd> waits;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (;;) {
    bool progress = false, left = false;
    for (std::size_t i = 0; i < streams.size(); ++i) {
      const stream& x = streams[i];
      state& y = st[i];
      if (y.sent < x.out) {
        const std::size_t from = y.sent % x.src_bytes;
        const ssize_t k = ::send(x.out_fd, x.src + from, std::min({s.write, x.out - y.sent, x.src_bytes - from}),
                                 MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k > 0) {
          y.sent += static_cast<std::size_t>(k);
          progress = true;
        } else if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
          die("send");
        }
      }
      if (y.got < x.in) {
        if (s.bounce) std::memcpy(bounce, y.carried, y.carry);
        char* at = s.bounce ? bounce + y.carry : x.to.at(y.got);
        const std::size_t want = s.bounce ? std::min(s.write, x.in - y.got) : std::min(x.in - y.got, x.to.room(y.got));
        const ssize_t k = ::recv(x.in_fd, at, want, MSG_DONTWAIT);
        if (k > 0) {
          y.got += static_cast<std::size_t>(k);
          progress = true;
          if (s.bounce) {  // whole floats on, the rest kept for the next recv (all of it at the end)
            const std::size_t have = y.carry + static_cast<std::size_t>(k);
            const std::size_t n = y.got == x.in ? have : have / sizeof(float) * sizeof(float);
            x.to.put(y.got - have, bounce, n);
            y.carry = have - n;
            std::memcpy(y.carried, bounce + n, y.carry);
          }
        } else if (k == 0) {
          errno = ECONNRESET;
          die("recv (the other rank closed)");
        } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
          die("recv");
        }
      }
      left = left || y.sent < x.out || y.got < x.in;
    }
    if (!left) break;
    if (progress) {
      deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      continue;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      errno = ETIMEDOUT;
      die("no progress for 30 s");
    }
    if (s.spin) continue;
    waits.clear();
    auto wait_for = [&](int fd, short events) {
      for (pollfd& p : waits)
        if (p.fd == fd) {
          p.events = static_cast<short>(p.events | events);
          return;
        }
      waits.push_back({fd, events, 0});
    };
    for (std::size_t i = 0; i < streams.size(); ++i) {
      if (st[i].sent < streams[i].out) wait_for(streams[i].out_fd, POLLOUT);
      if (st[i].got < streams[i].in) wait_for(streams[i].in_fd, POLLIN);
    }
    if (::poll(waits.data(), waits.size(), 1000) < 0 && errno != EINTR) die("poll");
  }
  for (const stream& x : streams)
    if (!s.bounce && x.in > 0) x.to.finish_direct();
}

// A rank's connections: peer[q] to rank q (-1 for itself), for each kind of buffers.
struct links {
  std::vector<int> peer[2];  // [0]: the kernel's buffers, [1]: 4 MiB asked
};

// What one rank does per call of `op` on S = bytes: the own block it copies into the
// output first (all_gather), and its streams. src and dst hold `bytes` each; the block b
// is bytes / n in whole floats, and the rest r = bytes - b is what every rank sends and
// receives in a reduce-scatter or an all-gather.
struct plan {
  std::size_t own_block = 0;
  std::vector<stream> streams;
};

plan plan_for(const std::string& op, int rank, int n, const std::vector<int>& peer, pattern shape,
              const std::vector<int>& order, const char* src, char* dst, std::size_t bytes) {
  const std::size_t block = bytes / static_cast<std::size_t>(n) / sizeof(float) * sizeof(float);
  const std::size_t rest = bytes - block;
  const auto un = static_cast<std::size_t>(n), urank = static_cast<std::size_t>(rank);
  plan p;
  auto add_stream = [&](int out_peer, std::size_t out, int in_peer, std::size_t in, std::size_t base,
                        std::size_t add_hi) {
    stream x;
    x.out_fd = out_peer < 0 ? -1 : peer[static_cast<std::size_t>(out_peer)];
    x.src = src;
    x.src_bytes = bytes;
    x.out = out;
    x.in_fd = in_peer < 0 ? -1 : peer[static_cast<std::size_t>(in_peer)];
    x.to = landing{dst, bytes, base % bytes, src, 0, add_hi};
    x.in = in;
    p.streams.push_back(x);
  };
  if (op == "all_gather") p.own_block = block;
  if (shape == pattern::tree) {  // parent (v - 1) / 2, children 2v + 1 and 2v + 2, from rank 0
    // all_reduce: its sum to the parent and the result back; each child's sum added to
    // this rank's input as it lands, the result sent down. broadcast: the down half.
    const bool reduce = op != "broadcast";
    if (rank > 0) add_stream(reduce ? (rank - 1) / 2 : -1, reduce ? bytes : 0, (rank - 1) / 2, bytes, 0, 0);
    for (int child : {2 * rank + 1, 2 * rank + 2})
      if (child < n) add_stream(child, bytes, reduce ? child : -1, reduce ? bytes : 0, 0, reduce ? bytes : 0);
    return p;
  }
  if (shape != pattern::pairs) {  // the ring: to the next rank, from the one before, in `order`
    const auto pos = static_cast<std::size_t>(std::find(order.begin(), order.end(), rank) - order.begin());
    const int next = order[(pos + 1) % un], prev = order[(pos + un - 1) % un];
    if (op == "broadcast")  // a chain from rank 0 (order starts there)
      add_stream(pos < un - 1 ? next : -1, pos < un - 1 ? bytes : 0, pos > 0 ? prev : -1, pos > 0 ? bytes : 0, 0, 0);
    else if (op == "all_gather")  // the others' blocks land after the own, around the output
      add_stream(next, rest, prev, rest, (urank + 1) % un * block, 0);
    else if (op == "reduce_scatter")  // all that arrives summed with the rank's input
      add_stream(next, rest, prev, rest, 0, rest);
    else  // all_reduce: the reduce-scatter's bytes summed, the all-gather's landed
      add_stream(next, 2 * rest, prev, 2 * rest, 0, rest);
    return p;
  }
  // All pairs: a stream with every other rank, its bytes split evenly among them.
  for (int q = 0, i = 0; q < n; ++q) {
    if (q == rank) continue;
    const auto idx = static_cast<std::size_t>(i++);
    if (op == "broadcast") {  // rank 0 sends every other rank all of it
      if (rank == 0) add_stream(q, bytes, -1, 0, 0, 0);
      if (q == 0) add_stream(-1, 0, 0, bytes, 0, 0);
    } else if (op == "all_gather") {  // the own block to each; each one's block into its place
      add_stream(q, block, q, block, static_cast<std::size_t>(q) * block, 0);
    } else if (op == "reduce_scatter") {  // each its block; theirs of mine summed with my input
      add_stream(q, block, q, block, idx * block, block);
    } else {  // all_reduce: as reduce_scatter, then the all-gather's block
      add_stream(q, 2 * block, q, 2 * block, idx * 2 * block, block);
    }
  }
  return p;
}

void one_call(const plan& p, int rank, const char* src, char* dst, char* bounce, const setting& s) {
  if (p.own_block > 0) plait::kernel::copy_bytes(dst + static_cast<std::size_t>(rank) * p.own_block, src, p.own_block);
  move(p.streams, bounce, s);
}

int make_socket(bool big) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) die("socket");
  if (big) {  // on a listener: set before listen, the accepted socket's window scale follows
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &big_buffers, sizeof big_buffers);
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &big_buffers, sizeof big_buffers);
  }
  return fd;
}

int connect_to(const sockaddr_in& a, bool big) {
  const int fd = make_socket(big);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) die("connect");
  return fd;
}

int listen_on_loopback(sockaddr_in& a, bool big, int backlog) {
  const int fd = make_socket(big);
  a = {};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, backlog) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    die("listen on 127.0.0.1");
  return fd;
}

int run(int rank, int ranks, const bench::ranks::team& team, const bench::options& o, const links& net) {
  const int cpus = team.cpus;
  const control& ctl = team.ctl;
  bind_to_cpu(rank, team.allowed);
  // The congestion control of plait's tcp links on one host (PLAIT_TCP_CONGESTION).
  const std::string congestion =
      plait::detail::config_from_env().host_congestion.value_or(plait::detail::comm_config::host_congestion_for(ranks));
  for (const std::vector<int>& kind : net.peer)
    for (int fd : kind) {
      if (fd < 0) continue;
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      if (!congestion.empty() && plait::detail::set_congestion(fd, congestion) != 0) die("TCP_CONGESTION");
      set_nonblocking(fd);
    }
  const bool may_spin = cpus >= ranks;  // counted before binding
  const std::vector<std::size_t> sizes = bench::sizes(o);
  const std::size_t top = sizes.empty() ? 0 : sizes.back();
  // Touched now, not while timing.
  std::vector<char> src(std::max<std::size_t>(top, 1), 1), dst(std::max<std::size_t>(top, 1), 0),
      bounce(chunk_sizes[std::size(chunk_sizes) - 1] + sizeof(float), 0);

  // The patterns tried (3 ranks and more): the ring, in rank order and, where ranks share
  // a CPU, in CPU order; all pairs; plait's tree where the collective has one.
  const std::vector<int> order = bench::ranks::cpu_order(ranks, cpus);
  std::vector<int> rank_order(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) rank_order[static_cast<std::size_t>(r)] = r;
  const bool by_cpu = ranks > 2 && order != rank_order;
  const bool tree_too = ranks > 2 && (o.op == "all_reduce" || o.op == "broadcast");
  std::vector<pattern> shapes{pattern::ring};
  if (by_cpu) shapes.push_back(pattern::ring_by_cpu);
  if (ranks > 2) shapes.push_back(pattern::pairs);
  if (tree_too) shapes.push_back(pattern::tree);
  auto order_of = [&](pattern p) -> const std::vector<int>& { return p == pattern::ring_by_cpu ? order : rank_order; };
  constexpr int finalists = 3;

  // What the kernel gave for the 4 MiB asked (capped by net.core.wmem_max / rmem_max;
  // getsockopt reports twice the size, bookkeeping included).
  const int some_big = net.peer[1][rank == 0 ? 1 : 0];
  int given_snd = 0, given_rcv = 0;
  socklen_t len = sizeof given_snd;
  ::getsockopt(some_big, SOL_SOCKET, SO_SNDBUF, &given_snd, &len);
  len = sizeof given_rcv;
  ::getsockopt(some_big, SOL_SOCKET, SO_RCVBUF, &given_rcv, &len);
  bench::report rep(
      o, "tcp-ceiling", "0.1", ranks,
      placement(ranks, cpus) + ", loopback TCP (TCP_NODELAY, congestion control " +
          (congestion.empty() ? std::string("the system's") : congestion) +
          ", as plait's links on one host; system: " + bench::system_congestion() +
          "), the bytes and local memory work the collective must do (own "
          "block copied, one float-sum pass), no framing; per size the best of " +
          (ranks > 2 ? std::string("pattern (ring, ") + (by_cpu ? name(pattern::ring_by_cpu, order) + ", " : "") +
                           "all pairs" + (tree_too ? ", tree" : "") + ") x "
                     : std::string()) +
          (cpus < ranks ? "placement (bound round robin, not bound) x " : "") +
          "write 64K/256K/1M/4M x landing (direct, through a bounce buffer) x buffers (the kernel's "
          "autotuned, or SO_SNDBUF = SO_RCVBUF = 4 MiB asked: getsockopt gives " +
          std::to_string(given_snd >> 10) + "K / " + std::to_string(given_rcv >> 10) + "K) x wait (poll" +
          (may_spin ? ", spin)" : "; no spin: more ranks than CPUs)") +
          "; each setting screened with 1 + 3 calls, the best " + std::to_string(finalists) +
          " timed with the calls asked",
      rank == 0);
  rep.header();
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    rep.progress(i, sizes.size(), sizes[i]);
    const std::size_t count = bench::count_for(o, sizes[i], sizeof(float), ranks);
    const std::size_t bytes = count * sizeof(float);
    // The grid: every rank walks the same settings in the same order.
    std::vector<setting> grid;
    for (pattern shape : shapes) {
      // The most bytes one stream carries sets the write sizes worth trying.
      std::size_t payload = 0;
      for (int r = 0; r < ranks; ++r)
        for (const stream& x :
             plan_for(o.op, r, ranks, net.peer[0], shape, order_of(shape), src.data(), dst.data(), bytes).streams)
          payload = std::max({payload, x.out, x.in});
      for (bool bound : {true, false}) {
        if (!bound && (cpus >= ranks || shape == pattern::ring_by_cpu)) continue;  // CPU order: bound only
        for (std::size_t c : chunk_sizes) {
          const std::size_t write = std::min(c, std::max<std::size_t>(payload, 1));
          for (bool through_bounce : {false, true})
            for (bool big : {false, true})
              for (bool spin : {false, true})
                if (!spin || may_spin) grid.push_back(setting{write, through_bounce, big, spin, shape, bound});
          if (write == payload) break;  // one write per call already
        }
      }
    }
    // One setting's calls; rank 0 gets the slowest rank's median and the most faults.
    auto measure = [&](const setting& s, int warmup, int iters) {
      bench::ranks::place(rank, team.allowed, s.bound);
      const plan p = plan_for(o.op, rank, ranks, net.peer[s.big ? 1 : 0], s.shape, order_of(s.shape), src.data(),
                              dst.data(), bytes);
      ctl.barrier();
      const bench::timed_calls t = bench::time_calls(
          warmup, iters, [&] { one_call(p, rank, src.data(), dst.data(), bounce.data(), s); }, [&] { ctl.barrier(); });
      bench::ranks::result got{bench::median(t.us()), t.faults, 0};
      ctl.gather(got);
      ctl.barrier();
      return got;
    };
    // Screened with a few calls each, then the fastest few timed as asked: the grid is
    // up to 112 settings, and a 128 MiB call takes a fifth of a second on 4 ranks.
    std::vector<int> pick(static_cast<std::size_t>(finalists), -1);
    if (grid.size() > static_cast<std::size_t>(finalists)) {
      std::vector<std::pair<double, int>> screened;
      for (std::size_t k = 0; k < grid.size(); ++k)
        screened.emplace_back(measure(grid[k], 1, 3).median, static_cast<int>(k));
      std::sort(screened.begin(), screened.end());
      for (std::size_t k = 0; k < pick.size(); ++k) pick[k] = screened[k].second;
    } else {
      for (std::size_t k = 0; k < grid.size(); ++k) pick[k] = static_cast<int>(k);
    }
    ctl.share(pick.data(), pick.size() * sizeof(int));  // rank 0's ranking for every rank
    double best = 0;
    long faults = 0;
    setting best_setting;
    bool tried = false;
    for (int k : pick) {
      if (k < 0) continue;
      const setting& s = grid[static_cast<std::size_t>(k)];
      const bench::ranks::result got = measure(s, o.warmup, o.iters);
      if (rank == 0) {
        if (!tried || got.median < best) {
          best = got.median;
          best_setting = s;
        }
        faults = std::max(faults, got.faults);
      }
      tried = true;
    }
    if (!best_setting.bound) bind_to_cpu(rank, team.allowed);
    bench::ranks::add_best(rep, o, bytes, count, best, faults, -1, best_setting.text(ranks, cpus, order));
  }
  return rep.finish() ? 0 : 1;
}

// Connects every pair of ranks (the kernel's buffers and 4 MiB asked): rank r connects to
// each rank below it and says who it is; it accepts the ranks above it. A connect
// completes in the listener's backlog, so no rank waits for another's accept.
links connect_all(int rank, int ranks, const std::vector<sockaddr_in>& addr, const std::vector<int>& listener) {
  links net;
  for (int big = 0; big < 2; ++big) {
    std::vector<int>& peer = net.peer[big];
    peer.assign(static_cast<std::size_t>(ranks), -1);
    for (int q = 0; q < rank; ++q) {
      const int fd = connect_to(addr[2 * static_cast<std::size_t>(q) + static_cast<std::size_t>(big)], big != 0);
      put_all(fd, &rank, sizeof rank);
      peer[static_cast<std::size_t>(q)] = fd;
    }
    for (int k = rank + 1; k < ranks; ++k) {
      const int fd =
          ::accept(listener[2 * static_cast<std::size_t>(rank) + static_cast<std::size_t>(big)], nullptr, nullptr);
      if (fd < 0) die("accept");
      int who = -1;
      get_all(fd, &who, sizeof who);
      if (who <= rank || who >= ranks || peer[static_cast<std::size_t>(who)] >= 0) {
        errno = EPROTO;
        die("accept (a connection from no rank expected)");
      }
      peer[static_cast<std::size_t>(who)] = fd;
    }
  }
  return net;
}

}  // namespace

int main(int argc, char** argv) {
  bench::ranks::program() = "tcp-ceiling";
  int ranks = 2;
  const bench::options o = bench::ranks::parse_options(argc, argv, "tcp", ranks);

  // Every rank's listeners (the kernel's buffers, 4 MiB asked), made before the fork.
  std::vector<sockaddr_in> addr(2 * static_cast<std::size_t>(ranks));
  std::vector<int> listener(addr.size(), -1);
  for (std::size_t k = 0; k < addr.size(); ++k) listener[k] = listen_on_loopback(addr[k], k % 2 == 1, max_ranks);
  const bench::ranks::team team = bench::ranks::fork_team(ranks);
  const int rank = team.rank;
  const links net = connect_all(rank, ranks, addr, listener);
  for (int fd : listener) ::close(fd);
  return bench::ranks::finish_team(team, run(rank, ranks, team, o, net));
}
