// What the ceiling programs (tcp-ceiling, shm-ceiling) share: N forked processes on
// this host, a control channel from rank 0 to each other rank (socketpairs: barriers
// between measurements, each rank's result gathered), the binding of ranks to CPUs as
// plaitrun binds them, and the command line. No plait dependency. Every read of the
// control channel ends when the other side stops: a rank that dies is an error on
// every other rank, not a hang.
#pragma once

#include <sched.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_report.hpp"

namespace bench::ranks {

// The program name errors start with (set by main).
inline const char*& program() {
  static const char* name = "ceiling";
  return name;
}

[[noreturn]] inline void die(const char* what) {
  std::fprintf(stderr, "%s: %s: %s\n", program(), what, std::strerror(errno));
  std::_Exit(1);
}

// Full reads and writes on a blocking control socket.
inline void put_all(int fd, const void* p, std::size_t n) {
  if (::write(fd, p, n) != static_cast<ssize_t>(n)) die("control write");
}
inline void get_all(int fd, void* p, std::size_t n) {
  auto* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t k = ::read(fd, c, n);
    if (k <= 0) die("control read (another rank stopped)");
    c += k;
    n -= static_cast<std::size_t>(k);
  }
}

// What rank 0 gathers from every rank after a measurement.
struct result {
  double median = 0;  // maximum over ranks
  long faults = 0;    // maximum over ranks
  long wrong = 0;     // sum over ranks
};

// The control channels (socketpairs between rank 0 and each other rank).
struct control {
  std::vector<int> fds;  // rank 0: one per other rank; any other rank: its one to rank 0
  bool root = false;

  void barrier() const {
    char b = 0;
    if (root) {
      for (int fd : fds) get_all(fd, &b, 1);
      for (int fd : fds) put_all(fd, &b, 1);
    } else {
      put_all(fds[0], &b, 1);
      get_all(fds[0], &b, 1);
    }
  }
  // Rank 0's n bytes at p to every other rank, into their p.
  void share(void* p, std::size_t n) const {
    if (root) {
      for (int fd : fds) put_all(fd, p, n);
    } else {
      get_all(fds[0], p, n);
    }
  }
  // Rank 0: every rank's result combined into r (its own given); the others send theirs.
  void gather(result& r) const {
    if (!root) {
      put_all(fds[0], &r, sizeof r);
      return;
    }
    for (int fd : fds) {
      result x;
      get_all(fd, &x, sizeof x);
      r.median = std::max(r.median, x.median);
      r.faults = std::max(r.faults, x.faults);
      r.wrong += x.wrong;
    }
  }
};

// The CPUs this process may run on.
inline int allowed_cpus() {
  cpu_set_t allowed;
  if (::sched_getaffinity(0, sizeof allowed, &allowed) != 0) return 1;
  return CPU_COUNT(&allowed);
}

// The CPUs this process may run on, as a set.
inline cpu_set_t allowed_set() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (::sched_getaffinity(0, sizeof allowed, &allowed) != 0) CPU_SET(0, &allowed);
  return allowed;
}

// Rank r on the (r mod C)-th of the C CPUs in `allowed`, as plaitrun's default `--bind
// core` binds: one CPU each where there are enough, else round robin (ranks r and r + C
// share a CPU).
inline void bind_to_cpu(int rank, const cpu_set_t& allowed) {
  const int n = CPU_COUNT(&allowed);
  if (n <= 0) return;
  int seen = 0;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (!CPU_ISSET(c, &allowed)) continue;
    if (seen++ == rank % n) {
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(c, &one);
      ::sched_setaffinity(0, sizeof one, &one);
      return;
    }
  }
}

// Bound as bind_to_cpu binds, or (not `bound`) every CPU in `allowed` again: the
// scheduler places the rank (plaitrun --bind none).
inline void place(int rank, const cpu_set_t& allowed, bool bound) {
  if (bound) {
    bind_to_cpu(rank, allowed);
  } else {
    ::sched_setaffinity(0, sizeof allowed, &allowed);
  }
}

// The ranks in the order of their CPUs under bind_to_cpu (stable: 0, C, 2C, ..., 1, C + 1,
// ...), so that ranks sharing a CPU stand next to each other, as plait's broadcast chain
// takes them (comm_config::chain); rank order where there is a CPU per rank.
inline std::vector<int> cpu_order(int ranks, int cpus) {
  std::vector<int> order;
  const int c = std::max(cpus, 1);
  for (int first = 0; first < std::min(c, ranks); ++first)
    for (int r = first; r < ranks; r += c) order.push_back(r);
  return order;
}

// cpus: what allowed_cpus() gave before any rank bound itself (team::cpus).
inline std::string placement(int ranks, int cpus) {
  const std::string n = std::to_string(ranks);
  if (cpus >= ranks) return n + " processes bound to CPUs 0.." + std::to_string(ranks - 1);
  return n + " processes on " + std::to_string(cpus) + " CPUs, bound round robin (rank r on CPU r mod " +
         std::to_string(cpus) + ", as plaitrun binds)";
}

constexpr int max_ranks = 16;

// A ceiling's command line: -N ranks (2 to 16, default 2) and the common bench options,
// for one of all_reduce, all_gather, reduce_scatter, broadcast from root 0; anything
// else is a usage error (exit 2).
inline options parse_options(int argc, char** argv, const char* transport, int& ranks) {
  ranks = 2;
  std::vector<char*> rest{argv[0]};
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "-N") == 0 && i + 1 < argc) {
      char* end = nullptr;
      const long n = std::strtol(argv[++i], &end, 10);
      if (end == argv[i] || *end != '\0' || n < 2 || n > max_ranks)
        usage(argv[0], "-N must be a rank count from 2 to 16");
      ranks = static_cast<int>(n);
      continue;
    }
    rest.push_back(argv[i]);
  }
  options defaults;
  defaults.transport = transport;
  defaults.algo = "best of grid";
  const options o =
      parse(static_cast<int>(rest.size()), rest.data(), defaults, "  -N n   ranks, 2 to 16 (default 2)\n");
  if (o.op != "broadcast" && o.op != "all_gather" && o.op != "reduce_scatter" && o.op != "all_reduce")
    usage(argv[0], "-o must be all_reduce, all_gather, reduce_scatter or broadcast");
  if (o.root != 0) usage(argv[0], "-R: only root 0 is measured");
  return o;
}

// A size's row from the best setting of the grid (rank 0's figures: time, the most page
// faults of any setting over its timed calls, wrong elements or -1), and which setting won.
inline void add_best(report& rep, const options& o, std::size_t bytes, std::size_t count, double time_us, long faults,
                     long long wrong, const std::string& setting) {
  row r;
  r.bytes = bytes;
  r.count = count;
  r.root = o.op == "broadcast" ? 0 : -1;
  r.time_us = time_us;
  r.minflt = static_cast<double>(faults) / o.iters;
  r.wrong = wrong;
  rep.add(r);
  if (rep.printer()) std::printf("#   best at %zu B: %s\n", bytes, setting.c_str());
}

// This process's place in the team forked by fork_team.
struct team {
  int rank = 0;
  control ctl;
  std::vector<pid_t> children;  // rank 0: ranks 1.. in order
  // The CPUs the team may run on, counted before the fork: once a rank has bound itself
  // (bind_to_cpu) its own affinity is one CPU.
  int cpus = 1;
  cpu_set_t allowed{};
};

// Forks ranks - 1 children, each with a control channel to rank 0 (the caller).
inline team fork_team(int ranks) {
  team t;
  t.cpus = allowed_cpus();
  t.allowed = allowed_set();
  std::vector<int> to_children;
  std::fflush(nullptr);
  for (int r = 1; r < ranks; ++r) {
    int pair[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM, 0, pair) != 0) die("socketpair");
    const pid_t child = ::fork();
    if (child < 0) die("fork");
    if (child == 0) {
      for (int fd : to_children) ::close(fd);
      ::close(pair[0]);
      t.rank = r;
      t.ctl = control{{pair[1]}, false};
      t.children.clear();
      return t;
    }
    ::close(pair[1]);
    to_children.push_back(pair[0]);
    t.children.push_back(child);
  }
  t.ctl = control{to_children, true};
  return t;
}

// Ends a rank: the others exit with rc; rank 0 waits for them and returns 1 if any failed.
inline int finish_team(const team& t, int rc) {
  if (t.rank != 0) std::_Exit(rc);
  bool children_ok = true;
  for (std::size_t i = 0; i < t.children.size(); ++i) {
    int status = 0;
    if (::waitpid(t.children[i], &status, 0) != t.children[i]) die("waitpid");
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "%s: rank %zu failed (status %d)\n", program(), i + 1, status);
      children_ok = false;
    }
  }
  return rc != 0 || !children_ok ? 1 : 0;
}

}  // namespace bench::ranks
