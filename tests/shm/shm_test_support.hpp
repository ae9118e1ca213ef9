// Forked ranks for the shm transport tests.
//
// Each rank is a real process (fork) running a body that returns its report as a
// string; the report travels back through a pipe and the parent asserts on it
// (Catch2 cannot be used in a child). Children leave through _exit, so nothing of
// the parent's state (Catch2, stdio buffers) runs twice. Every wait is bounded: a
// child still running at its deadline is killed, and every child is reaped.
#pragma once

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <plait/transport/shm.hpp>

#include "support/file_bootstrap.hpp"

namespace plait::testing::shm_test {

using namespace std::chrono_literals;

// A fresh directory for one job's file_bootstrap; removed with its contents.
class temp_dir {
 public:
  temp_dir() {
    char tmpl[] = "/tmp/pshm-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  // The job key file_bootstrap derives from this directory.
  std::string job_key() const { return file_bootstrap(path_, 0, 1).job_key(); }

 private:
  std::filesystem::path path_;
};

// Entries of /dev/shm that belong to the job with this key.
inline std::vector<std::string> shm_leftovers(const std::string& job_key) {
  std::vector<std::string> found;
  const std::string prefix = "plait-" + job_key + "-";
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(d))
      if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) found.emplace_back(e->d_name);
    ::closedir(d);
  }
  return found;
}

inline std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(clock::now().time_since_epoch()).count();
}

// Writes one line to the parent (the child's side of the pipe).
inline void tell(int fd, const std::string& line) {
  std::string s = line + "\n";
  const char* p = s.data();
  std::size_t left = s.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n <= 0) return;
    p += n;
    left -= static_cast<std::size_t>(n);
  }
}

class child {
 public:
  // Forks; the child runs body(fd) and _exits with 0 if it returned "ok", else 1
  // after sending the returned text as its last line.
  static child spawn(const std::function<std::string(int fd)>& body) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      ::close(fds[0]);
      std::string result;
      try {
        result = body(fds[1]);
      } catch (const std::exception& e) {
        result = std::string("exception: ") + e.what();
      } catch (...) {
        result = "unknown exception";
      }
      tell(fds[1], result);
      ::_exit(result == "ok" ? 0 : 1);
    }
    ::close(fds[1]);
    child c;
    c.pid_ = pid;
    c.fd_ = fds[0];
    return c;
  }

  child() = default;
  child(child&& o) noexcept : pid_(std::exchange(o.pid_, -1)), fd_(std::exchange(o.fd_, -1)), buf_(std::move(o.buf_)) {}
  child& operator=(child&&) = delete;
  ~child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);  // SIGKILL ends even a stopped process: this returns
    }
    if (fd_ >= 0) ::close(fd_);
  }

  pid_t pid() const { return pid_; }

  // The next line the child wrote, or nullopt at EOF or at the deadline.
  std::optional<std::string> read_line(clock::time_point deadline) {
    for (;;) {
      if (auto nl = buf_.find('\n'); nl != std::string::npos) {
        std::string line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return line;
      }
      if (fd_ < 0) return std::nullopt;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count();
      if (left <= 0) return std::nullopt;
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left)) <= 0) continue;
      char tmp[4096];
      const ssize_t n = ::read(fd_, tmp, sizeof tmp);
      if (n <= 0) {
        ::close(fd_);
        fd_ = -1;
      } else {
        buf_.append(tmp, static_cast<std::size_t>(n));
      }
    }
  }

  // The child's last line (its result), after waiting for it to exit; kills it at the deadline.
  std::string finish(clock::time_point deadline) {
    std::string last = "(no report)";
    while (auto line = read_line(deadline)) last = *line;
    for (;;) {
      int status = 0;
      const pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        pid_ = -1;
        if (WIFSIGNALED(status)) return last + " [killed by signal " + std::to_string(WTERMSIG(status)) + "]";
        return last;
      }
      if (clock::now() > deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
        pid_ = -1;
        return last + " [did not finish in time: killed]";
      }
      std::this_thread::sleep_for(1ms);
    }
  }

  void signal(int sig) const { ::kill(pid_, sig); }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  std::string buf_;
};

// Runs body(rank, fd) in `n` forked ranks; returns each rank's result ("ok" or what failed).
inline std::vector<std::string> run_ranks(int n, std::chrono::seconds limit,
                                          const std::function<std::string(int rank, int fd)>& body) {
  std::vector<child> children;
  children.reserve(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) children.push_back(child::spawn([&, r](int fd) { return body(r, fd); }));
  const auto deadline = clock::now() + limit;
  std::vector<std::string> results;
  for (auto& c : children) results.push_back(c.finish(deadline));
  return results;
}

// Runs body(rank, bootstrap, links, bell) in two forked ranks connected by shm
// through a fresh directory's file_bootstrap; returns each rank's result.
inline std::vector<std::string> run_linked_pair(
    const link_config& cfg,
    const std::function<std::string(int, file_bootstrap&, link_set&, plait::detail::doorbell&)>& body,
    std::chrono::seconds limit = std::chrono::seconds(60)) {
  temp_dir dir;
  return run_ranks(2, limit, [&](int r, int) -> std::string {
    file_bootstrap ctx(dir.path(), r, 2);
    plait::detail::doorbell bell;
    const std::vector<int> peers{1 - r};
    auto links = plait::transport::shm::connect(ctx, bell, cfg, peers);
    return body(r, ctx, *links, bell);
  });
}

// A link_config for tests.
inline link_config config(std::size_t slot_bytes, std::size_t depth, std::chrono::nanoseconds timeout = 20s) {
  link_config cfg;
  cfg.slot_bytes = slot_bytes;
  cfg.depth = depth;
  cfg.connect_timeout = timeout;
  return cfg;
}

// A data slot's header: sender, sequence number and payload bytes.
inline plait::detail::slot_header header_for(int sender, std::uint64_t sequence, std::uint32_t bytes) {
  plait::detail::slot_header h;
  h.sender = sender;
  h.desc.sequence = sequence;
  h.bytes = bytes;
  return h;
}

// Waits (bounded, 10 s) until peek(peer) returns a slot; health(peer) throws meanwhile.
inline plait::slot_view wait_for_slot(plait::link_set& links, plait::detail::doorbell& bell, int peer) {
  const auto deadline = clock::now() + std::chrono::seconds(10);
  for (;;) {
    const auto seen = bell.snapshot();
    if (auto v = links.peek(peer); v.header != nullptr) return v;
    links.health(peer);
    if (clock::now() > deadline) throw std::runtime_error("no slot from rank " + std::to_string(peer) + " in 10 s");
    bell.wait(seen, std::chrono::milliseconds(10));
  }
}

inline std::vector<int> all_but(int me, int n) {
  std::vector<int> peers;
  for (int p = 0; p < n; ++p)
    if (p != me) peers.push_back(p);
  return peers;
}

}  // namespace plait::testing::shm_test
