// Fault-test harness: ranks forked and launched "by hand" (PLAIT_RANK,
// PLAIT_WORLD_SIZE, PLAIT_STORE, PLAIT_TOKEN; the parent serves the store, as
// tests/support/ranks.hpp does), a board in shared memory through which the ranks
// say where they are and what they saw, and the parent's tools to kill or stop a
// rank at a chosen moment and time what every survivor reports.
//
//   fault_job job(4, transport_kind::tcp);
//   job.start([&](int rank, rank_board& me) { ...; return 0; });  // runs in each child
//   job.wait_until([&] { return job.rank(2).iterations >= 3; });
//   job.signal(2, SIGKILL);                   // records the moment
//   job.wait_exit(std::chrono::seconds(30));  // reaps every rank, records when
//
// Times are steady_clock nanoseconds (CLOCK_MONOTONIC: one clock for every process
// on the host). Children never use Catch2: they fill their board slot and exit; the
// parent asserts. Every wait is bounded; the destructor kills and reaps whatever is
// left. Not thread-safe: one fault_job per test, driven by the test's thread.
#pragma once

#include <dirent.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <new>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <plait/bootstrap/store_server.hpp>
#include <plait/bootstrap/token.hpp>
#include <plait/plait.hpp>
#include <plait/transport/hybrid.hpp>
#include <plait/transport/shm.hpp>
#include <plait/transport/tcp.hpp>

#include "port_pipe.hpp"

namespace plait::testing::faults {

inline std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
inline double ms_between(std::int64_t from_ns, std::int64_t to_ns) {
  return static_cast<double>(to_ns - from_ns) / 1e6;
}

enum class transport_kind { shm, tcp, hybrid };
inline const char* name_of(transport_kind k) {
  return k == transport_kind::shm ? "shm" : k == transport_kind::tcp ? "tcp" : "hybrid";
}

// Calls f.template operator()<Transport>() for the transport `k` names.
template <class F>
decltype(auto) with_transport(transport_kind k, F&& f) {
  switch (k) {
    case transport_kind::shm:
      return f.template operator()<plait::transport::shm>();
    case transport_kind::tcp:
      return f.template operator()<plait::transport::tcp>();
    case transport_kind::hybrid:
      break;
  }
  return f.template operator()<plait::transport::hybrid<plait::transport::shm, plait::transport::tcp>>();
}

// hybrid's two "hosts": the lower half of the ranks and the upper half (PLAIT_HOST_ID).
inline int host_of(int rank, int n) { return rank < (n + 1) / 2 ? 0 : 1; }

// Where a rank is; written by the rank, read by the parent.
enum class phase : int { starting, in_call, between, sleeping, failed, done };

// One rank's slot on the board: progress, then what it saw.
struct rank_board {
  std::atomic<int> where{static_cast<int>(phase::starting)};
  std::atomic<std::int64_t> iterations{0};  // collectives completed
  std::atomic<int> reported{0};             // the fields below are final
  int code = 0;                             // errc of the first error, 0 = none
  int peer = -1;
  std::int64_t call_start_ns = 0;  // start of the call (or from_env) that threw
  std::int64_t throw_ns = 0;       // when it threw
  int later_code = -1;             // errc of a later call; 0 = it did not throw; -1 = not tried
  int fds_before = -1, fds_after = -1, threads_after = -1;
  std::int64_t destroy_start_ns = 0, destroy_end_ns = 0;
  double longest_call_ms = 0;  // the slow-rank test: how long the others waited
  char what[1024] = {};        // the error's what()
  char note[512] = {};         // a failure of the test itself (wrong data, never failed, ...)

  void set_what(const char* s) { std::snprintf(what, sizeof what, "%s", s); }
  void set_note(const std::string& s) {
    if (note[0] == '\0') std::snprintf(note, sizeof note, "%s", s.c_str());
  }
  void record(const plait::error& e, std::int64_t call_start) {
    throw_ns = now_ns();
    code = static_cast<int>(e.code());
    peer = e.peer();
    call_start_ns = call_start;
    set_what(e.what());
  }
  void at(phase p) { where.store(static_cast<int>(p), std::memory_order_release); }
  phase now() const { return static_cast<phase>(where.load(std::memory_order_acquire)); }
};

inline constexpr int max_ranks = 16;

struct board {
  std::atomic<int> go{0};  // a go-ahead from the parent, used as each test needs
  rank_board ranks[max_ranks];
};

// Open descriptors and threads of the calling process (Linux /proc). The listing's
// own descriptor is counted every time, so two counts compare equal.
inline int count_entries(const char* dir) {
  DIR* d = ::opendir(dir);
  if (d == nullptr) return -1;
  int n = 0;
  while (dirent* e = ::readdir(d))
    if (e->d_name[0] != '.') ++n;
  ::closedir(d);
  return n;
}
inline int open_fds() { return count_entries("/proc/self/fd"); }
inline int threads() { return count_entries("/proc/self/task"); }
// The threads of this process once those the communicator joined are gone from
// /proc/self/task too: pthread_join returns when the thread clears its tid, a moment
// before the kernel stops listing it, so a count taken at once can include a thread
// that has already ended (seen once in CI: "2 threads after destruction", tcp, 8 ranks
// on 2 cores). Waits up to 1 s for the main thread alone; a thread still running is
// still counted.
inline int threads_settled() {
  int n = threads();
  for (int i = 0; i < 200 && n != 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    n = threads();
  }
  return n;
}

// Sleeps until `until` in short steps (a victim that waits to be killed).
inline void idle_until(std::int64_t until_ns) {
  while (now_ns() < until_ns) std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

struct job_options {
  std::string timeout = "3";  // T_op: every collective's deadline in the ranks
  // The deadline for joining (PLAIT_TIMEOUT while from_env() runs; the ranks then set
  // T_op with set_timeout). Apart from T_op because the faults under test come after
  // the join, and a start-up of 4 ranks on 2 busy cores can take seconds.
  // Empty: T_op for the join too (test_join, whose fault is the join).
  std::string join_timeout = "30";
  std::string slice_bytes = "128K";   // the library's default slice
  std::chrono::seconds deadline{60};  // the whole job; ranks still there are killed
  bool split_hosts = true;            // hybrid: two PLAIT_HOST_IDs (host_of)
};

class fault_job {
 public:
  fault_job(int n, transport_kind kind, job_options opt = {})
      : n_(n),
        kind_(kind),
        opt_(std::move(opt)),
        token_(bootstrap::generate_token_hex()),
        pids_(static_cast<std::size_t>(n), -1),
        status_(static_cast<std::size_t>(n), -1),
        reaped_ns_(static_cast<std::size_t>(n), 0) {
    if (n > max_ranks) throw std::invalid_argument("fault_job: at most 16 ranks");
    void* p = ::mmap(nullptr, sizeof(board), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("fault_job: mmap failed");
    board_ = new (p) board();
  }

  fault_job(const fault_job&) = delete;
  fault_job& operator=(const fault_job&) = delete;

  ~fault_job() {
    for (int r = 0; r < n_; ++r)
      if (running(r)) {
        ::kill(pids_[idx(r)], SIGKILL);
        ::waitpid(pids_[idx(r)], nullptr, 0);
      }
    board_->~board();
    ::munmap(board_, sizeof(board));
  }

  // Forks the ranks, then starts the store server and tells them its port through
  // pipes: the ranks are forked from a process with one thread (port_pipe.hpp says
  // why; it throws std::logic_error otherwise). body(rank, its board slot) runs in
  // each and returns its exit status. `skip` ranks exit at once, before from_env (a
  // rank that never connects).
  void start(const std::function<int(int, rank_board&)>& body, std::vector<int> skip = {}) {
    if (server_) throw std::logic_error("fault_job::start: the job has started already");
    if (const int t = threads_settled(); t != 1)
      throw std::logic_error("fault_job::start: the test process runs " + std::to_string(t) +
                             " threads; ranks are forked from one thread only");
    const auto port_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    std::vector<int> port_pipes;  // write ends, one per forked rank
    std::fflush(nullptr);
    // On a failure midway the write ends are closed: the ranks forked so far read end
    // of file and exit, and the destructor reaps them.
    const auto fail = [&port_pipes](const char* what, int err) {
      for (int w : port_pipes) ::close(w);
      throw std::runtime_error(std::string("fault_job: ") + what + " failed: " + std::strerror(err));
    };
    for (int r = 0; r < n_; ++r) {
      int fds[2];
      if (::pipe(fds) != 0) fail("pipe", errno);
      const pid_t pid = ::fork();
      if (pid < 0) {
        const int err = errno;
        ::close(fds[0]);
        ::close(fds[1]);
        fail("fork", err);
      }
      if (pid == 0) {
        ::close(fds[1]);
        for (int w : port_pipes) ::close(w);
        if (std::find(skip.begin(), skip.end(), r) != skip.end()) ::_exit(0);
        const std::uint16_t port = read_port(fds[0], port_deadline);
        ::close(fds[0]);
        int status = 2;
        if (port == 0) {
          board_->ranks[r].set_note("the rank never got the store's port from the test process");
        } else {
          set_env(r, port);
          try {
            status = body(r, board_->ranks[r]);
          } catch (const std::exception& e) {
            board_->ranks[r].set_note(std::string("the rank's test body threw: ") + e.what());
          }
        }
        board_->ranks[r].reported.store(1, std::memory_order_release);
        std::fflush(nullptr);
        std::exit(status);  // a normal exit: static destructors and atexit handlers run
      }
      ::close(fds[0]);
      pids_[idx(r)] = pid;
      port_pipes.push_back(fds[1]);
    }
    try {
      server_.emplace("127.0.0.1", 0, token_bytes(token_));
    } catch (...) {
      for (int w : port_pipes) ::close(w);  // the ranks read end of file and exit
      throw;
    }
    send_port(port_pipes, server_->port());
  }

  board& state() { return *board_; }
  rank_board& rank(int r) { return board_->ranks[r]; }
  int size() const { return n_; }
  transport_kind kind() const { return kind_; }

  // Sends `sig` to rank r and records the moment (just before the signal leaves).
  void signal(int r, int sig) {
    signal_ns_[{r, sig}] = now_ns();
    ::kill(pids_[idx(r)], sig);
  }
  // When `sig` was last sent to rank r (0: never).
  std::int64_t signalled_at(int r, int sig) const {
    auto it = signal_ns_.find({r, sig});
    return it == signal_ns_.end() ? 0 : it->second;
  }

  // Reaps ranks that have exited (records status and when). Never blocks.
  void poll() {
    for (int r = 0; r < n_; ++r) {
      if (!running(r)) continue;
      int st = 0;
      if (::waitpid(pids_[idx(r)], &st, WNOHANG) == pids_[idx(r)]) {
        reaped_ns_[idx(r)] = now_ns();
        status_[idx(r)] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
    }
  }
  bool running(int r) const { return pids_[idx(r)] > 0 && reaped_ns_[idx(r)] == 0; }
  int exit_status(int r) const { return status_[idx(r)]; }  // -1 while running; 128 + signal
  std::int64_t reaped_at(int r) const { return reaped_ns_[idx(r)]; }

  // Waits (reaping as it goes, 0.5 ms steps) until pred() holds; false after `bound`.
  template <class Pred>
  bool wait_until(Pred pred, std::chrono::milliseconds bound = std::chrono::seconds(30)) {
    const auto until = now_ns() + std::chrono::nanoseconds(bound).count();
    for (;;) {
      poll();
      if (pred()) return true;
      if (now_ns() > until) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
  }

  // Waits for every rank to exit; kills the rest after `bound`. True when all exited.
  bool wait_exit(std::chrono::milliseconds bound) {
    const bool all = wait_until(
        [&] {
          for (int r = 0; r < n_; ++r)
            if (running(r)) return false;
          return true;
        },
        bound);
    for (int r = 0; r < n_; ++r)
      if (running(r)) {
        ::kill(pids_[idx(r)], SIGKILL);
        ::waitpid(pids_[idx(r)], nullptr, 0);
        reaped_ns_[idx(r)] = now_ns();
        status_[idx(r)] = 128 + SIGKILL;
      }
    return all;
  }

  // /dev/shm entries of this job (its segments are named after the store's instance).
  std::vector<std::string> leftover_segments() const {
    std::vector<std::string> out;
    if (!server_) return out;
    const std::string prefix = "plait-plait" + server_->instance_id().substr(0, 16);
    if (DIR* d = ::opendir("/dev/shm")) {
      while (dirent* e = ::readdir(d))
        if (std::strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0) out.emplace_back(e->d_name);
      ::closedir(d);
    }
    return out;
  }

 private:
  static std::size_t idx(int r) { return static_cast<std::size_t>(r); }
  static std::vector<std::byte> token_bytes(const std::string& t) {
    std::vector<std::byte> b(t.size());
    std::memcpy(b.data(), t.data(), t.size());
    return b;
  }

  void set_env(int r, std::uint16_t store_port) const {
    ::setenv("PLAIT_RANK", std::to_string(r).c_str(), 1);
    ::setenv("PLAIT_WORLD_SIZE", std::to_string(n_).c_str(), 1);
    ::setenv("PLAIT_STORE", ("127.0.0.1:" + std::to_string(store_port)).c_str(), 1);
    ::setenv("PLAIT_STORE_SERVED", "1", 1);
    ::setenv("PLAIT_TOKEN", token_.c_str(), 1);
    if (opt_.join_timeout.empty()) {
      ::setenv("PLAIT_TIMEOUT", opt_.timeout.c_str(), 1);
      ::unsetenv("PLAIT_FAULT_T_OP");
    } else {
      ::setenv("PLAIT_TIMEOUT", opt_.join_timeout.c_str(), 1);
      ::setenv("PLAIT_FAULT_T_OP", opt_.timeout.c_str(), 1);
    }
    ::setenv("PLAIT_SLICE_BYTES", opt_.slice_bytes.c_str(), 1);
    ::unsetenv("PLAIT_LOCAL_RANK");
    if (kind_ == transport_kind::hybrid && opt_.split_hosts)
      ::setenv("PLAIT_HOST_ID", host_of(r, n_) == 0 ? "fault-host-a" : "fault-host-b", 1);
  }

  int n_;
  transport_kind kind_;
  job_options opt_;
  std::string token_;
  std::optional<bootstrap::store_server> server_;  // from start(), after the forks
  board* board_ = nullptr;
  std::vector<pid_t> pids_;
  std::vector<int> status_;
  std::vector<std::int64_t> reaped_ns_;
  std::map<std::pair<int, int>, std::int64_t> signal_ns_;  // (rank, signal) -> when
};

// ---- the collectives the ranks loop on ------------------------------------------

// Mostly all_reduce<ring> of 1M floats, with all_reduce<tree> of 64K floats and a
// broadcast (tree or ring, rotating root) of 256K floats mixed in. Every result is
// checked: a wrong one throws std::logic_error (the rank reports it as its note).
class workload {
 public:
  workload(int rank, int size) : rank_(rank), size_(size) {}

  template <class Comm>
  void step(Comm& c, std::int64_t i) {
    const float want = static_cast<float>(size_ * (size_ + 1) / 2);
    switch (i % 4) {
      case 1:
        std::fill(mid_.begin(), mid_.end(), static_cast<float>(rank_ + 1));
        plait::all_reduce<plait::tree>(c, std::span<float>(mid_), plait::sum{});
        expect(mid_, want, "all_reduce<tree>", i);
        break;
      case 3: {
        const int root = static_cast<int>((i / 4) % size_);
        const float value = static_cast<float>(i);
        std::fill(bcast_.begin(), bcast_.end(), rank_ == root ? value : -1.0f);
        if ((i / 4) % 2 == 0)
          plait::broadcast<plait::tree>(c, std::span<float>(bcast_), root);
        else
          plait::broadcast<plait::ring>(c, std::span<float>(bcast_), root);
        expect(bcast_, value, "broadcast", i);
        break;
      }
      default:
        std::fill(big_.begin(), big_.end(), static_cast<float>(rank_ + 1));
        plait::all_reduce<plait::ring>(c, std::span<float>(big_), plait::sum{});
        expect(big_, want, "all_reduce<ring>", i);
    }
  }

 private:
  void expect(const std::vector<float>& v, float want, const char* what, std::int64_t i) const {
    for (std::size_t k : {std::size_t{0}, v.size() / 2, v.size() - 1})
      if (v[k] != want)
        throw std::logic_error(std::string(what) + " #" + std::to_string(i) + " on rank " + std::to_string(rank_) +
                               ": element " + std::to_string(k) + " is " + std::to_string(v[k]) + ", expected " +
                               std::to_string(want));
  }

  int rank_, size_;
  std::vector<float> big_ = std::vector<float>(std::size_t{1} << 20);
  std::vector<float> mid_ = std::vector<float>(std::size_t{1} << 16);
  std::vector<float> bcast_ = std::vector<float>(std::size_t{1} << 18);
};

// ---- a rank's life ---------------------------------------------------------------

// Joins through from_env(), runs body(comm) (its return value is the exit status),
// destroys the communicator, then counts descriptors and threads: destruction must
// give back everything creation took. A from_env() that throws is recorded as the
// rank's error (status 1).
template <class Tr, class Body>
int with_communicator(rank_board& me, Body body) {
  me.fds_before = open_fds();
  int status = 0;
  {
    std::optional<plait::communicator<Tr>> comm;
    const std::int64_t t0 = now_ns();
    try {
      comm.emplace(plait::communicator<Tr>::from_env());
      if (const char* t = std::getenv("PLAIT_FAULT_T_OP"))
        comm->set_timeout(std::chrono::duration<double>(std::stod(t)));
    } catch (const plait::error& e) {
      me.record(e, t0);
      status = 1;
    }
    if (comm) {
      status = body(*comm);
      me.destroy_start_ns = now_ns();
      comm.reset();
    } else {
      me.destroy_start_ns = now_ns();
    }
    me.destroy_end_ns = now_ns();
  }
  me.fds_after = open_fds();
  me.threads_after = threads_settled();
  me.at(phase::done);
  return status;
}

// Loops on the workload until a call throws plait::error (recorded in `me`), then
// makes one more call (its code goes to later_code: a broken communicator fails it
// too). before(i) runs ahead of call i (a victim sleeps there). Status 3 when
// nothing failed before `until_ns`.
template <class Comm>
int loop_until_error(Comm& c, rank_board& me, std::int64_t until_ns,
                     const std::function<void(std::int64_t)>& before = {}) {
  workload w(c.rank(), c.size());
  std::int64_t i = 0;
  for (;; ++i) {
    if (before) before(i);
    if (now_ns() > until_ns) {
      me.set_note("no call failed before the rank's own deadline (" + std::to_string(i) + " calls done)");
      return 3;
    }
    const std::int64_t t = now_ns();
    me.at(phase::in_call);
    try {
      w.step(c, i);
    } catch (const plait::error& e) {
      me.record(e, t);
      me.at(phase::failed);
      break;
    }
    me.at(phase::between);
    me.iterations.fetch_add(1, std::memory_order_acq_rel);
  }
  try {
    w.step(c, i + 1);
    me.later_code = 0;
  } catch (const plait::error& e) {
    me.later_code = static_cast<int>(e.code());
  }
  return 0;
}

// "peer_lost" for a code on the board ("none" for 0).
inline std::string code_text(int code) {
  return code == 0 ? "none" : std::string(plait::to_string(static_cast<plait::errc>(code)));
}

// ---- results ------------------------------------------------------------------

// One survivor's measurement in one run, for the log and the per-case verdicts.
struct measurement {
  std::string case_name;
  int survivor = -1;
  double ms = 0;                // the measured time
  double lo_ms = 0, hi_ms = 0;  // the bound: lo <= ms <= hi
  bool correct = false;         // right code, right peer, clean afterwards
  std::string detail;           // what the survivor reported
};

// Repeats per case: PLAIT_FAULT_REPEAT overrides the CI default (tools/fault-repeat.sh).
inline int repeats(int ci_default) {
  if (const char* v = std::getenv("PLAIT_FAULT_REPEAT")) {
    const int n = std::atoi(v);
    if (n > 0) return n;
  }
  return ci_default;
}

// One tab-separated line per measurement on stdout and, with PLAIT_FAULT_LOG set,
// appended to that file: case, survivor, ms, lo, hi, correct, detail.
inline void log_measurement(const measurement& m) {
  char line[2048];
  std::snprintf(line, sizeof line, "fault\t%s\t%d\t%.1f\t%.0f\t%.0f\t%d\t%s\n", m.case_name.c_str(), m.survivor, m.ms,
                m.lo_ms, m.hi_ms, m.correct ? 1 : 0, m.detail.c_str());
  std::fputs(line, stdout);
  std::fflush(stdout);
  if (const char* path = std::getenv("PLAIT_FAULT_LOG"); path && *path) std::ofstream(path, std::ios::app) << line;
}

// What rank r reported, for failure messages.
inline std::string describe(fault_job& job, int r) {
  const rank_board& b = job.rank(r);
  std::string s = "rank " + std::to_string(r) + ": exit " + std::to_string(job.exit_status(r)) + ", error " +
                  code_text(b.code) + " peer " + std::to_string(b.peer);
  if (b.what[0] != '\0') s += " [" + std::string(b.what) + "]";
  if (b.note[0] != '\0') s += " note: " + std::string(b.note);
  return s;
}

// What a rank that saw an error left wrong afterwards (empty = nothing): it did not
// exit 0, a later call did not fail with the same code, it took over 2 s from the
// start of destruction to its exit, or descriptors or threads were left.
inline std::vector<std::string> cleanup_problems(fault_job& job, int r, bool later_call = true) {
  const rank_board& b = job.rank(r);
  std::vector<std::string> out;
  if (job.exit_status(r) != 0) out.push_back("exit status " + std::to_string(job.exit_status(r)));
  if (b.reported.load() == 0) return out;
  if (later_call && b.later_code != b.code)
    out.push_back("a later call gave " + code_text(b.later_code) + ", not " + code_text(b.code));
  if (b.destroy_start_ns != 0 && job.reaped_at(r) != 0) {
    const double exit_ms = ms_between(b.destroy_start_ns, job.reaped_at(r));
    if (exit_ms > 2000)
      out.push_back("exited " + std::to_string(static_cast<int>(exit_ms)) + " ms after destruction began");
  }
  if (b.fds_after != b.fds_before)
    out.push_back(std::to_string(b.fds_before) + " descriptors before the communicator, " +
                  std::to_string(b.fds_after) + " after");
  if (b.threads_after != 1) out.push_back(std::to_string(b.threads_after) + " threads after destruction");
  return out;
}

inline std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : "; ") + x;
  return s;
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : (v[m - 1] + v[m]) / 2;
}

}  // namespace plait::testing::faults
