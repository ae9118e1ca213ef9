// Helpers for the TCP transport tests: forked ranks that report to the parent, a
// temporary bootstrap directory, recognisable slot payloads, and bounded waits.
//
// run_forked() forks one process per rank; each runs a body that returns a report
// line (or throws: the report is the error and the exit status 1). The parent reads
// the reports through pipes, waits at most `bound` and then SIGKILLs stragglers;
// every child is reaped. Catch2 assertions stay in the parent.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <plait/detail/doorbell.hpp>
#include <plait/error.hpp>
#include <plait/transport.hpp>
#include <plait/wire.hpp>

namespace plait::testing {

struct temp_dir {
  std::filesystem::path path;
  temp_dir() {
    char tmpl[] = "/tmp/plait-tcp-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
    path = tmpl;
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
};

struct rank_outcome {
  int rank = -1;
  bool exited = false;  // exited normally (else killed by a signal, see signal)
  int exit_code = -1;
  int signal = 0;
  bool timed_out = false;
  std::string report;

  bool ok() const { return exited && exit_code == 0; }
  std::string describe() const {
    std::string s = "rank " + std::to_string(rank) + ": ";
    if (timed_out) s += "[did not finish in time] ";
    if (exited)
      s += "exit " + std::to_string(exit_code);
    else
      s += "signal " + std::to_string(signal);
    return s + ", report: " + report;
  }
};

inline std::vector<rank_outcome> run_forked(int n, const std::function<std::string(int)>& body,
                                            std::chrono::seconds bound) {
  std::fflush(nullptr);
  std::vector<pid_t> pids(static_cast<std::size_t>(n), -1);
  std::vector<int> fds(static_cast<std::size_t>(n), -1);
  std::vector<rank_outcome> out(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      ::close(p[0]);
      std::string report;
      int code = 0;
      try {
        report = body(r);
      } catch (const std::exception& e) {
        report = std::string("exception: ") + e.what();
        code = 1;
      } catch (...) {
        report = "unknown exception";
        code = 1;
      }
      std::size_t off = 0;
      while (off < report.size()) {
        const ssize_t k = ::write(p[1], report.data() + off, report.size() - off);
        if (k <= 0) break;
        off += static_cast<std::size_t>(k);
      }
      ::_exit(code);
    }
    ::close(p[1]);
    pids[static_cast<std::size_t>(r)] = pid;
    fds[static_cast<std::size_t>(r)] = p[0];
    out[static_cast<std::size_t>(r)].rank = r;
  }

  const auto deadline = std::chrono::steady_clock::now() + bound;
  int open_pipes = n;
  while (open_pipes > 0 && std::chrono::steady_clock::now() < deadline) {
    std::vector<pollfd> pf;
    for (int fd : fds) pf.push_back({fd, fd >= 0 ? short(POLLIN) : short(0), 0});
    ::poll(pf.data(), pf.size(), 50);
    for (std::size_t i = 0; i < pf.size(); ++i) {
      if (fds[i] < 0 || !(pf[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[4096];
      const ssize_t k = ::read(fds[i], buf, sizeof buf);
      if (k > 0) {
        out[i].report.append(buf, static_cast<std::size_t>(k));
      } else {
        ::close(fds[i]);
        fds[i] = -1;
        --open_pipes;
      }
    }
  }
  for (std::size_t i = 0; i < pids.size(); ++i) {
    int status = 0;
    pid_t got = 0;
    while ((got = ::waitpid(pids[i], &status, WNOHANG)) == 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (got == 0) {
      out[i].timed_out = true;
      ::kill(pids[i], SIGKILL);
      ::waitpid(pids[i], &status, 0);
    }
    if (WIFEXITED(status)) {
      out[i].exited = true;
      out[i].exit_code = WEXITSTATUS(status);
    } else if (WIFSIGNALED(status)) {
      out[i].signal = WTERMSIG(status);
    }
    if (fds[i] >= 0) ::close(fds[i]);
  }
  return out;
}

inline std::string describe_all(const std::vector<rank_outcome>& out) {
  std::string s;
  for (const auto& o : out) s += o.describe() + "\n";
  return s;
}

// ---- inside a rank ------------------------------------------------------------------

inline void touch(const std::filesystem::path& p) { std::ofstream(p) << "1"; }

inline bool wait_for_file(const std::filesystem::path& p, std::chrono::milliseconds bound) {
  const auto until = std::chrono::steady_clock::now() + bound;
  while (!std::filesystem::exists(p)) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

inline void write_time(const std::filesystem::path& p) {
  const auto ns = std::chrono::steady_clock::now().time_since_epoch().count();
  std::ofstream(p) << ns;
}

inline std::chrono::steady_clock::time_point read_time(const std::filesystem::path& p) {
  long long ns = 0;
  std::ifstream(p) >> ns;
  return std::chrono::steady_clock::time_point(std::chrono::steady_clock::duration(ns));
}

// Payload of slot `index` from `sender` to `receiver`: size and bytes both recognisable.
inline std::size_t pattern_size(int sender, int receiver, std::uint64_t index, std::size_t slot_bytes) {
  if (index == 0) return 0;
  if (index == 1) return slot_bytes;
  const std::uint64_t h = (index * 2654435761u) ^ (static_cast<std::uint64_t>(sender) * 40503u) ^
                          (static_cast<std::uint64_t>(receiver) * 9973u);
  return static_cast<std::size_t>(h % (slot_bytes + 1));
}

inline std::byte pattern_byte(int sender, int receiver, std::uint64_t index, std::size_t j) {
  return std::byte(static_cast<unsigned char>(sender * 37 + receiver * 11 + index * 7 + j + (j >> 8)));
}

inline void fill_pattern(std::byte* p, std::size_t n, int sender, int receiver, std::uint64_t index) {
  for (std::size_t j = 0; j < n; ++j) p[j] = pattern_byte(sender, receiver, index, j);
}

// Empty when the slot is the expected one, else what differs.
inline std::string check_pattern(const slot_view& v, int sender, int receiver, std::uint64_t index,
                                 std::size_t slot_bytes) {
  const auto& h = *v.header;
  const std::size_t want = pattern_size(sender, receiver, index, slot_bytes);
  const std::string where = "slot " + std::to_string(index) + " from rank " + std::to_string(sender) + " to rank " +
                            std::to_string(receiver) + ": ";
  if (h.magic != detail::slot_magic || h.sender != sender || h.desc.sequence != index)
    return where + "header sender " + std::to_string(h.sender) + " sequence " + std::to_string(h.desc.sequence);
  if (h.bytes != want) return where + "bytes " + std::to_string(h.bytes) + ", expected " + std::to_string(want);
  for (std::size_t j = 0; j < want; ++j)
    if (v.payload[j] != pattern_byte(sender, receiver, index, j))
      return where + "byte " + std::to_string(j) + " is " + std::to_string(int(v.payload[j])) + ", expected " +
             std::to_string(int(pattern_byte(sender, receiver, index, j)));
  return {};
}

inline detail::slot_header pattern_header(int sender, std::uint64_t index, std::size_t bytes) {
  detail::slot_header h;
  h.bytes = static_cast<std::uint32_t>(bytes);
  h.sender = sender;
  h.desc.sequence = index;
  h.desc.kind = detail::collective_kind::point_to_point;
  return h;
}

// Sends `count` pattern slots to every peer and checks every slot received from each,
// in order, sleeping on the doorbell when nothing moves. Returns what went wrong, or
// empty; link failures throw (health()). With caller_io the waiting thread moves the
// bytes itself (link_set::progress) and now and then hands them back to the link
// set's own thread (release_io), as a communicator's waiting rank does.
inline std::string exchange_all(link_set& links, detail::doorbell& bell, int rank, std::span<const int> peers,
                                std::uint64_t count, std::chrono::seconds bound, bool caller_io = false) {
  const std::size_t slot_bytes = links.slot_bytes();
  std::vector<std::uint64_t> sent(peers.size(), 0), received(peers.size(), 0);
  const auto deadline = std::chrono::steady_clock::now() + bound;
  for (;;) {
    const std::uint32_t seen = bell.snapshot();
    bool moved = false, done = true;
    for (std::size_t i = 0; i < peers.size(); ++i) {
      const int p = peers[i];
      while (sent[i] < count) {
        std::byte* slot = links.acquire(p);
        if (slot == nullptr) break;
        const std::size_t n = pattern_size(rank, p, sent[i], slot_bytes);
        fill_pattern(slot, n, rank, p, sent[i]);
        links.post(p, pattern_header(rank, sent[i], n));
        ++sent[i];
        moved = true;
      }
      while (received[i] < count) {
        const slot_view v = links.peek(p);
        if (v.header == nullptr) break;
        if (auto bad = check_pattern(v, p, rank, received[i], slot_bytes); !bad.empty()) return bad;
        links.release(p);
        ++received[i];
        moved = true;
        if (caller_io && received[i] % 64 == 0) links.release_io(received[i] % 128 == 0);
      }
      done = done && sent[i] == count && received[i] == count;
    }
    if (done) {
      if (caller_io) links.release_io(true);
      return {};
    }
    if (moved) continue;
    for (std::size_t i = 0; i < peers.size(); ++i)
      if (sent[i] < count || received[i] < count) links.health(peers[i]);
    if (std::chrono::steady_clock::now() > deadline) {
      std::string s = "rank " + std::to_string(rank) + " timed out:";
      for (std::size_t i = 0; i < peers.size(); ++i)
        s += " peer " + std::to_string(peers[i]) + " sent " + std::to_string(sent[i]) + " received " +
             std::to_string(received[i]) + ";";
      return s;
    }
    if (caller_io)
      bell.wait(seen, std::chrono::milliseconds(10), io_waiter{&links});
    else
      bell.wait(seen, std::chrono::milliseconds(10));
  }
}

inline std::vector<int> all_but(int rank, int n) {
  std::vector<int> v;
  for (int r = 0; r < n; ++r)
    if (r != rank) v.push_back(r);
  return v;
}

}  // namespace plait::testing
