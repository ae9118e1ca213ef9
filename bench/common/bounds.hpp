// The bounds plait-bench prints next to its busbw, measured in the same run:
//   copy:     memory copy bandwidth per thread while `threads` threads each copy
//             `bytes` from their own source to their own destination at once (small
//             sizes repeated: the rate of a stream of copies of that size) — the
//             memory bound for a rank's busbw over shared memory (every byte a rank
//             sends is written into a slot and read out of it at least once);
//   loopback: TCP throughput per connection while `pairs` connections on 127.0.0.1
//             each stream `bytes`-sized writes (4 MiB at least) to a reader thread — the link
//             bound for a rank's busbw over tcp. Both ends use the congestion control
//             `congestion` names (plait's links on one host: link_config::
//             host_congestion), or the system's when it is empty.
// Both are GB/s (1e9 bytes/s), the median of a few repetitions after one warm-up.
// Buffers are kept between calls (allocated and touched once for the largest size).
// The threads run on every CPU the machine lets them, not only on the measuring
// rank's own (a launcher may have bound it to one core: plaitrun --bind core).
// Not thread-safe; called by one rank while the others wait.
#pragma once

#include <arpa/inet.h>
#include <sched.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <plait/detail/socket.hpp>

namespace bench {

// The system's TCP congestion control (net.ipv4.tcp_congestion_control), or "unknown".
inline std::string system_congestion() {
  std::string name = "unknown";
  if (std::ifstream f("/proc/sys/net/ipv4/tcp_congestion_control"); f) std::getline(f, name);
  return name;
}

class bounds {
 public:
  std::string congestion;  // TCP_CONGESTION of the loopback connections ("": the system's)

  double copy_gbps(std::size_t bytes, int threads) {
    if (bytes == 0 || threads < 1) return 0;
    grow(copy_src_, bytes, threads);
    grow(copy_dst_, bytes, threads);
    const std::size_t times = repeats(bytes);
    return per_worker(bytes * times, threads, [&](int t) {
      for (std::size_t k = 0; k < times; ++k)
        std::memcpy(copy_dst_[static_cast<std::size_t>(t)].data(), copy_src_[static_cast<std::size_t>(t)].data(),
                    bytes);
    });
  }

  double loopback_gbps(std::size_t bytes, int pairs) {
    if (bytes == 0 || pairs < 1) return 0;
    grow(net_buf_, bytes, 2 * pairs);
    std::vector<int> send_fd(static_cast<std::size_t>(pairs), -1), recv_fd(static_cast<std::size_t>(pairs), -1);
    for (int p = 0; p < pairs; ++p)
      connect_pair(send_fd[static_cast<std::size_t>(p)], recv_fd[static_cast<std::size_t>(p)], congestion);
    // Workers 2p and 2p+1 are pair p's writer and reader.
    const std::size_t times = repeats(bytes);
    const double gbps = per_worker(bytes * times, 2 * pairs, [&](int w) {
      const auto up = static_cast<std::size_t>(w / 2);
      if (w % 2 == 0)
        for (std::size_t k = 0; k < times; ++k) write_all(send_fd[up], net_buf_[2 * up].data(), bytes);
      else
        read_all(recv_fd[up], net_buf_[2 * up + 1].data(), bytes * times, bytes);
    });
    for (int fd : send_fd) ::close(fd);
    for (int fd : recv_fd) ::close(fd);
    return gbps;
  }

 private:
  // Small sizes repeat the copy or write so a rep moves at least 4 MiB: the bound is
  // the streaming rate at that size, not a thread wake-up.
  static std::size_t repeats(std::size_t bytes) { return std::max<std::size_t>(1, (std::size_t{4} << 20) / bytes); }

  static void grow(std::vector<std::vector<char>>& bufs, std::size_t bytes, int n) {
    bufs.resize(std::max(bufs.size(), static_cast<std::size_t>(n)));
    for (auto& b : bufs)
      if (b.size() < bytes) b.assign(bytes, 1);  // touched now, not while timing
  }

  // Lets the calling thread run on any CPU (the kernel keeps it within its cpuset).
  static void unbind() noexcept {
    cpu_set_t all;
    CPU_ZERO(&all);
    for (int c = 0; c < CPU_SETSIZE; ++c) CPU_SET(c, &all);
    ::sched_setaffinity(0, sizeof all, &all);
  }

  // Runs work(i) on `workers` threads at once, a few times after one warm-up;
  // returns `bytes` over the median time of a rep (all workers done): GB/s per worker.
  template <class F>
  static double per_worker(std::size_t bytes, int workers, F work) {
    const int reps = bytes >= (std::size_t{16} << 20) ? 3 : bytes >= (std::size_t{1} << 20) ? 5 : 20;
    std::vector<double> secs;
    for (int r = 0; r <= reps; ++r) {
      std::barrier start(workers + 1);
      std::vector<std::thread> pool;
      for (int w = 0; w < workers; ++w)
        pool.emplace_back([&, w] {
          unbind();
          start.arrive_and_wait();
          work(w);
        });
      const auto t0 = std::chrono::steady_clock::now();
      start.arrive_and_wait();
      for (auto& t : pool) t.join();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r > 0) secs.push_back(s);
    }
    std::nth_element(secs.begin(), secs.begin() + static_cast<std::ptrdiff_t>(secs.size() / 2), secs.end());
    return static_cast<double>(bytes) / secs[secs.size() / 2] / 1e9;
  }

  static void connect_pair(int& out, int& in, const std::string& congestion) {
    const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (listener < 0 || ::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::listen(listener, 1) != 0 || ::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      throw std::runtime_error("loopback bound: cannot listen on 127.0.0.1");
    out = ::socket(AF_INET, SOCK_STREAM, 0);
    if (out < 0 || ::connect(out, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
      throw std::runtime_error("loopback bound: cannot connect to 127.0.0.1");
    in = ::accept(listener, nullptr, nullptr);
    ::close(listener);
    if (in < 0) throw std::runtime_error("loopback bound: accept failed");
    const int one = 1;
    ::setsockopt(out, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (!congestion.empty())
      for (int fd : {out, in})
        if (plait::detail::set_congestion(fd, congestion) != 0)
          throw std::runtime_error("loopback bound: the kernel refuses congestion control " + congestion);
  }

  static void write_all(int fd, const char* p, std::size_t n) {
    while (n > 0) {
      const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
      if (k <= 0) return;
      p += k;
      n -= static_cast<std::size_t>(k);
    }
  }
  // Reads n bytes into a buffer of `room` bytes, reusing it.
  static void read_all(int fd, char* p, std::size_t n, std::size_t room) {
    while (n > 0) {
      const ssize_t k = ::recv(fd, p, std::min(n, room), 0);
      if (k <= 0) return;
      n -= static_cast<std::size_t>(k);
    }
  }

  std::vector<std::vector<char>> copy_src_, copy_dst_, net_buf_;
};

}  // namespace bench
