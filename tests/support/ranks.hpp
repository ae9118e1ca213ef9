// Multi-process test harness: fork the ranks once, run a whole sweep inside them,
// bring their results back to the parent, which asserts (Catch2 is not usable in
// the children). DESIGN.md section 8.
//
//   auto results = plait::testing::run_ranks<plait::transport::shm>(3, [](auto& comm) {
//     std::vector<plait::testing::blob> out;  // one blob per case, in order
//     ...
//     return out;
//   });
//
// The parent serves the rendezvous store (as plaitrun does) and each child joins
// through communicator<T>::from_env() with PLAIT_* set, so the real launch path is
// what the tests exercise. A child that throws reports the error text and exits 1;
// a child that does not finish within the deadline is killed and reported. Every
// wait is bounded.
#pragma once

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <plait/bootstrap/store_server.hpp>
#include <plait/bootstrap/token.hpp>
#include <plait/plait.hpp>

#include "port_pipe.hpp"

namespace plait::testing {

using blob = std::vector<std::byte>;

template <class T>
blob to_blob(const std::vector<T>& v) {
  blob b(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}
template <class T>
std::vector<T> from_blob(const blob& b) {
  std::vector<T> v(b.size() / sizeof(T));
  if (!v.empty()) std::memcpy(v.data(), b.data(), v.size() * sizeof(T));
  return v;
}

struct rank_options {
  std::chrono::seconds deadline{120};       // whole sweep, per rank
  std::string slice_bytes = "4K";           // small slices exercise the multi-slice paths; empty: the default
  std::string copy_slice_bytes = "8K";      // broadcast, send/recv; empty: the transport's default
  std::string timeout = "30";               // PLAIT_TIMEOUT inside the ranks
  std::function<std::string(int)> host_id;  // PLAIT_HOST_ID per rank (hybrid tests)
  std::string stream_bytes;                 // PLAIT_STREAM_BYTES; empty: unset (the default)
  std::string chain;                        // PLAIT_CHAIN; empty: unset (the default)
  std::function<int(int)> cpu;              // the CPU rank r is bound to before it joins (-1: not bound)
};

struct rank_result {
  int exit_status = 0;  // 0 = ok
  std::string error;    // what the child reported (or why it was killed)
  std::vector<blob> blobs;
};

namespace detail_ranks {

inline void write_results(const std::string& path, const std::vector<blob>& blobs) {
  std::ofstream f(path, std::ios::binary);
  const std::uint64_t n = blobs.size();
  f.write(reinterpret_cast<const char*>(&n), sizeof n);
  for (const auto& b : blobs) {
    const std::uint64_t s = b.size();
    f.write(reinterpret_cast<const char*>(&s), sizeof s);
    f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(s));
  }
}

inline std::vector<blob> read_results(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<blob> out;
  std::uint64_t n = 0;
  if (!f.read(reinterpret_cast<char*>(&n), sizeof n)) return out;
  for (std::uint64_t i = 0; i < n; ++i) {
    std::uint64_t s = 0;
    f.read(reinterpret_cast<char*>(&s), sizeof s);
    blob b(s);
    f.read(reinterpret_cast<char*>(b.data()), static_cast<std::streamsize>(s));
    out.push_back(std::move(b));
  }
  return out;
}

inline std::string slurp(const std::string& path) {
  std::ifstream f(path);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

}  // namespace detail_ranks

// Runs fn(comm) in n forked ranks. Returns one rank_result per rank.
// The ranks are forked before the store server's thread starts and are then told its
// port through a pipe (port_pipe.hpp says why).
template <class Transport, class F>
std::vector<rank_result> run_ranks(int n, F&& fn, rank_options opt = {}) {
  namespace fs = std::filesystem;
  char tmpl[] = "/tmp/plait-test-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl);
  const std::string token = bootstrap::generate_token_hex();
  std::vector<std::byte> token_bytes(token.size());
  std::memcpy(token_bytes.data(), token.data(), token.size());
  const auto start_deadline = std::chrono::steady_clock::now() + opt.deadline;

  std::vector<pid_t> pids;
  std::vector<int> port_pipes;  // write ends, one per rank
  for (int r = 0; r < n; ++r) {
    int fds[2];
    if (::pipe(fds) != 0) throw std::runtime_error("pipe failed");
    std::fflush(nullptr);  // nothing buffered is written twice
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[1]);
      for (int w : port_pipes) ::close(w);
      const std::uint16_t port = read_port(fds[0], start_deadline);
      ::close(fds[0]);
      const std::string base = dir + "/rank" + std::to_string(r);
      if (port == 0) {
        std::ofstream(base + ".err") << "rank " << r << " never got the store's port from the test process";
        ::_exit(1);
      }
      const std::string store = "127.0.0.1:" + std::to_string(port);
      ::setenv("PLAIT_RANK", std::to_string(r).c_str(), 1);
      ::setenv("PLAIT_WORLD_SIZE", std::to_string(n).c_str(), 1);
      ::setenv("PLAIT_LOCAL_RANK", std::to_string(r).c_str(), 1);
      ::setenv("PLAIT_STORE", store.c_str(), 1);
      ::setenv("PLAIT_STORE_SERVED", "1", 1);
      ::setenv("PLAIT_TOKEN", token.c_str(), 1);
      if (opt.slice_bytes.empty())
        ::unsetenv("PLAIT_SLICE_BYTES");
      else
        ::setenv("PLAIT_SLICE_BYTES", opt.slice_bytes.c_str(), 1);
      if (opt.copy_slice_bytes.empty())
        ::unsetenv("PLAIT_COPY_SLICE_BYTES");
      else
        ::setenv("PLAIT_COPY_SLICE_BYTES", opt.copy_slice_bytes.c_str(), 1);
      ::setenv("PLAIT_TIMEOUT", opt.timeout.c_str(), 1);
      if (opt.host_id) ::setenv("PLAIT_HOST_ID", opt.host_id(r).c_str(), 1);
      if (opt.stream_bytes.empty())
        ::unsetenv("PLAIT_STREAM_BYTES");
      else
        ::setenv("PLAIT_STREAM_BYTES", opt.stream_bytes.c_str(), 1);
      if (opt.chain.empty())
        ::unsetenv("PLAIT_CHAIN");
      else
        ::setenv("PLAIT_CHAIN", opt.chain.c_str(), 1);
      if (const int c = opt.cpu ? opt.cpu(r) : -1; c >= 0) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(c, &one);
        if (::sched_setaffinity(0, sizeof one, &one) != 0) {
          std::ofstream(base + ".err") << "rank " << r << " cannot be bound to CPU " << c;
          ::_exit(1);
        }
      }
      int status = 0;
      try {
        auto comm = communicator<Transport>::from_env();
        std::vector<blob> out = fn(comm);
        detail_ranks::write_results(base + ".out", out);
      } catch (const std::exception& e) {
        std::ofstream(base + ".err") << e.what();
        status = 1;
      }
      std::fflush(nullptr);
      ::_exit(status);
    }
    ::close(fds[0]);
    pids.push_back(pid);
    port_pipes.push_back(fds[1]);
  }

  // Each rank learns the port, or sees its pipe closed (and exits) if the server failed.
  // SIGPIPE is held while writing: a rank may already be dead.
  std::optional<bootstrap::store_server> server;
  try {
    server.emplace("127.0.0.1", 0, token_bytes);
  } catch (...) {
    for (int w : port_pipes) ::close(w);
    for (pid_t pid : pids) ::waitpid(pid, nullptr, 0);
    throw;
  }
  const std::uint16_t port = server->port();
  send_port(port_pipes, port);

  std::vector<rank_result> results(static_cast<std::size_t>(n));
  std::vector<bool> done(static_cast<std::size_t>(n), false);
  const auto deadline = std::chrono::steady_clock::now() + opt.deadline;
  int left = n;
  while (left > 0) {
    bool reaped = false;
    for (int r = 0; r < n; ++r) {
      if (done[static_cast<std::size_t>(r)]) continue;
      int st = 0;
      if (::waitpid(pids[static_cast<std::size_t>(r)], &st, WNOHANG) == pids[static_cast<std::size_t>(r)]) {
        auto& res = results[static_cast<std::size_t>(r)];
        res.exit_status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        const std::string base = dir + "/rank" + std::to_string(r);
        res.error = detail_ranks::slurp(base + ".err");
        if (res.exit_status != 0 && res.error.empty())
          res.error = "rank " + std::to_string(r) + " exited with status " + std::to_string(res.exit_status);
        res.blobs = detail_ranks::read_results(base + ".out");
        done[static_cast<std::size_t>(r)] = true;
        --left;
        reaped = true;
      }
    }
    if (left == 0) break;
    if (std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < n; ++r) {
        if (done[static_cast<std::size_t>(r)]) continue;
        ::kill(pids[static_cast<std::size_t>(r)], SIGKILL);
        ::waitpid(pids[static_cast<std::size_t>(r)], nullptr, 0);
        results[static_cast<std::size_t>(r)].exit_status = 128 + SIGKILL;
        results[static_cast<std::size_t>(r)].error =
            "rank " + std::to_string(r) + " did not finish within the test deadline (killed)";
      }
      break;
    }
    if (!reaped) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  return results;
}

}  // namespace plait::testing
