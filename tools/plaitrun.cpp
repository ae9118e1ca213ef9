// plaitrun: launch N local ranks of a plait program (DESIGN.md section 5).
//
//   plaitrun -n N [--grace S] [--bind core|none] [--] prog args...
//
// Serves the bootstrap store on 127.0.0.1 (ephemeral port) with a fresh token per
// job, starts N ranks with PLAIT_RANK, PLAIT_WORLD_SIZE, PLAIT_LOCAL_RANK, PLAIT_STORE,
// PLAIT_STORE_SERVED=1 and PLAIT_TOKEN set, and prefixes every line they print with
// "[rank] " (stdout to stdout, stderr to stderr). Each rank runs in its own process
// group so that stopping it stops what it started. SIGINT and SIGTERM are forwarded.
// When a rank fails, the others get PLAIT_GRACE seconds (default 5; --grace wins) to
// report their own errors, then SIGTERM, then SIGKILL one second later.
// Each rank is bound to one of the CPUs plaitrun may use (--bind core, the default),
// round robin when there are more ranks than CPUs, as MPI launchers do: left to the
// scheduler, two busy ranks sometimes share a core for a whole run, and oversubscribed
// ranks settle into placements that differ by up to 1.8x from run to run
// (docs/performance.md, "Binding ranks to cores", "Oversubscribed ranks bound round robin").
#include <fcntl.h>
#include <sched.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <plait/bootstrap/store_server.hpp>
#include <plait/bootstrap/token.hpp>
#include <plait/detail/env.hpp>

extern char** environ;

namespace {

using clk = plait::clock;

constexpr const char* usage_text =
    "usage: plaitrun -n N [--grace SECONDS] [--bind core|none] [--] PROGRAM [ARGS...]\n"
    "\n"
    "Runs N ranks of PROGRAM on this host as one plait job.\n"
    "\n"
    "  -n N             number of ranks (at least 1)\n"
    "  --grace SECONDS  after a rank fails, how long the others may run to report their\n"
    "                   own errors before they are stopped (SIGTERM, then SIGKILL one\n"
    "                   second later); decimals allowed; default PLAIT_GRACE or 5\n"
    "  --bind MODE      core: rank r runs only on the r-th of the C CPUs plaitrun may run\n"
    "                   on, counting round (r mod C) when there are more ranks than\n"
    "                   CPUs; none: every rank on all of them; default PLAIT_BIND or core\n"
    "  -h, --help       this text\n"
    "\n"
    "plaitrun serves the bootstrap store on 127.0.0.1 with a fresh token for the job and\n"
    "sets, for each rank: PLAIT_RANK, PLAIT_WORLD_SIZE, PLAIT_LOCAL_RANK, PLAIT_STORE,\n"
    "PLAIT_STORE_SERVED=1 and PLAIT_TOKEN. Every output line is prefixed with \"[rank] \";\n"
    "ranks read standard input from /dev/null. SIGINT and SIGTERM are forwarded to every\n"
    "rank. Exit status: 0 when every rank exits 0; otherwise the status of the rank that\n"
    "failed first (128 + signal number when it was killed by a signal), after a line\n"
    "\"plaitrun: rank R failed first (...)\" on standard error. Usage errors exit 2.\n";

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "plaitrun: %s\n(run plaitrun --help for usage)\n", message.c_str());
  std::exit(2);
}

void write_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    ssize_t k = ::write(fd, p, n);
    if (k < 0) {
      if (errno == EINTR) continue;
      return;  // our own output is gone (closed pipe): nothing useful left to do with it
    }
    p += k;
    n -= static_cast<std::size_t>(k);
  }
}

std::string signal_name(int sig) {
  if (const char* abbrev = ::sigabbrev_np(sig)) return std::string("SIG") + abbrev;
  return "signal " + std::to_string(sig);
}

std::string describe(int status) {
  if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "signal " + signal_name(WTERMSIG(status));
  return "status " + std::to_string(status);
}

// Finds PROGRAM on PATH the way execvp would, before forking (the child of a
// multi-threaded process should only exec).
std::optional<std::string> find_program(const std::string& prog) {
  if (prog.find('/') != std::string::npos) return prog;
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  std::size_t start = 0;
  for (;;) {
    std::size_t end = dirs.find(':', start);
    std::string dir = dirs.substr(start, end == std::string::npos ? std::string::npos : end - start);
    std::string candidate = (dir.empty() ? "." : dir) + "/" + prog;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    if (end == std::string::npos) return std::nullopt;
    start = end + 1;
  }
}

// One rank's output stream: bytes are cut into lines and printed with the rank prefix.
struct stream {
  int fd = -1;  // read end of the pipe; -1 once closed
  int out = 1;  // where its lines go
  std::string prefix;
  std::string pending;

  void emit(std::string_view line) {
    std::string s = prefix;
    s.append(line);
    s += '\n';
    write_all(out, s.data(), s.size());
  }
  void drain_lines(bool at_eof) {
    std::size_t start = 0;
    for (std::size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1)
      emit(std::string_view(pending).substr(start, nl - start));
    pending.erase(0, start);
    if ((at_eof && !pending.empty()) || pending.size() > 64 * 1024) {  // no newline coming: print what we have
      emit(pending);
      pending.clear();
    }
  }
  void close() {
    if (fd >= 0) ::close(fd);
    fd = -1;
    drain_lines(true);
  }
};

struct rank_process {
  pid_t pid = -1;
  bool running = false;
  int status = 0;
};

}  // namespace

int main(int argc, char** argv) {
  // ---- arguments
  int n = 0;
  std::optional<std::chrono::nanoseconds> grace;
  std::optional<std::string> bind;
  int i = 1;
  try {
    for (; i < argc; ++i) {
      std::string a = argv[i];
      if (a == "-h" || a == "--help") {
        std::fputs(usage_text, stdout);
        return 0;
      }
      if (a == "--") {
        ++i;
        break;
      }
      if (a == "-n" || a == "--grace" || a == "--bind") {
        if (i + 1 >= argc) usage_error(a + " needs a value");
        std::string v = argv[++i];
        if (a == "--grace") {
          grace = plait::detail::parse_seconds("--grace", v);
          continue;
        }
        if (a == "--bind") {
          bind = v;
          continue;
        }
        bool digits =
            !v.empty() && v.size() <= 6 && std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; });
        n = digits ? std::stoi(v) : 0;
        if (n < 1) usage_error("-n needs a rank count of at least 1, got '" + v + "'");
        continue;
      }
      if (!a.empty() && a[0] == '-') usage_error("unknown option '" + a + "'");
      break;
    }
    if (!grace) grace = plait::detail::env_seconds("PLAIT_GRACE");
    if (!bind)
      if (const char* e = std::getenv("PLAIT_BIND"); e != nullptr && *e != '\0') bind = e;
    if (bind && *bind != "core" && *bind != "none")
      usage_error("--bind (or PLAIT_BIND) must be core or none, got '" + *bind + "'");
  } catch (const plait::error& e) {
    usage_error(e.message());
  }
  if (n == 0) usage_error("missing -n N");
  if (i >= argc) usage_error("missing the program to run");
  const auto grace_period = grace.value_or(std::chrono::seconds(5));
  const std::string program = argv[i];
  auto path = find_program(program);
  if (!path) {
    std::fprintf(stderr, "plaitrun: cannot find '%s' on PATH\n", program.c_str());
    return 127;
  }

  // ---- signals: block before any thread exists so that only the signalfd sees them
  sigset_t handled;
  sigemptyset(&handled);
  for (int s : {SIGINT, SIGTERM, SIGCHLD, SIGHUP}) sigaddset(&handled, s);
  sigset_t old_mask;
  ::sigprocmask(SIG_BLOCK, &handled, &old_mask);
  ::signal(SIGPIPE, SIG_IGN);
  int sig_fd = ::signalfd(-1, &handled, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sig_fd < 0) {
    std::perror("plaitrun: signalfd");
    return 1;
  }

  // ---- the store and the token
  const std::string token = plait::bootstrap::generate_token_hex();
  std::optional<plait::bootstrap::store_server> server;
  try {
    auto* p = reinterpret_cast<const std::byte*>(token.data());
    server.emplace("127.0.0.1", 0, std::vector<std::byte>(p, p + token.size()));
  } catch (const plait::error& e) {
    std::fprintf(stderr, "plaitrun: cannot start the store: %s\n", e.what());
    return 1;
  }
  const std::string store = "127.0.0.1:" + std::to_string(server->port());

  // ---- one CPU per rank: the CPUs this process may use, in order, round robin
  std::vector<int> cpu_of;
  if (cpu_set_t allowed; bind.value_or("core") == "core" && ::sched_getaffinity(0, sizeof allowed, &allowed) == 0) {
    std::vector<int> cpus;
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
    for (int r = 0; r < n && !cpus.empty(); ++r) cpu_of.push_back(cpus[static_cast<std::size_t>(r) % cpus.size()]);
  }

  // ---- environment and argv for the ranks, built before forking
  std::vector<char*> args;
  args.push_back(path->data());
  for (int k = i + 1; k < argc; ++k) args.push_back(argv[k]);
  args.push_back(nullptr);
  const char* overridden[] = {"PLAIT_RANK=",         "PLAIT_WORLD_SIZE=", "PLAIT_LOCAL_RANK=", "PLAIT_STORE=",
                              "PLAIT_STORE_SERVED=", "PLAIT_TOKEN=",      "PLAIT_TOKEN_FILE="};
  std::vector<std::string> base_env;
  for (char** e = environ; *e; ++e) {
    bool skip = false;
    for (const char* o : overridden) skip = skip || std::strncmp(*e, o, std::strlen(o)) == 0;
    if (!skip) base_env.emplace_back(*e);
  }
  base_env.push_back("PLAIT_WORLD_SIZE=" + std::to_string(n));
  base_env.push_back("PLAIT_STORE=" + store);
  base_env.push_back("PLAIT_STORE_SERVED=1");
  base_env.push_back("PLAIT_TOKEN=" + token);

  int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  std::vector<rank_process> ranks(static_cast<std::size_t>(n));
  std::vector<stream> streams;  // 2 per rank: stdout, stderr
  streams.reserve(static_cast<std::size_t>(2 * n));
  for (int r = 0; r < n; ++r) {
    std::vector<std::string> env = base_env;
    env.push_back("PLAIT_RANK=" + std::to_string(r));
    env.push_back("PLAIT_LOCAL_RANK=" + std::to_string(r));
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);

    cpu_set_t one_cpu;
    CPU_ZERO(&one_cpu);
    if (!cpu_of.empty()) CPU_SET(cpu_of[static_cast<std::size_t>(r)], &one_cpu);

    int out_pipe[2], err_pipe[2];
    if (::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0) {
      std::perror("plaitrun: pipe");
      return 1;
    }
    pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("plaitrun: fork");
      return 1;
    }
    if (pid == 0) {
      // Child: only async-signal-safe calls until exec.
      ::setpgid(0, 0);
      ::dup2(devnull, 0);
      ::dup2(out_pipe[1], 1);
      ::dup2(err_pipe[1], 2);
      ::signal(SIGPIPE, SIG_DFL);
      ::sigprocmask(SIG_SETMASK, &old_mask, nullptr);
      if (!cpu_of.empty() && ::sched_setaffinity(0, sizeof one_cpu, &one_cpu) != 0) {
        const char msg[] = "plaitrun: cannot bind this rank to its CPU; it runs unbound\n";
        [[maybe_unused]] auto w = ::write(2, msg, sizeof msg - 1);
      }
      ::execve(args[0], args.data(), envp.data());
      const char msg[] = "plaitrun: cannot execute the program: ";
      [[maybe_unused]] auto w1 = ::write(2, msg, sizeof msg - 1);
      const char* why = ::strerror(errno);
      [[maybe_unused]] auto w2 = ::write(2, why, std::strlen(why));
      [[maybe_unused]] auto w3 = ::write(2, "\n", 1);
      ::_exit(127);
    }
    ::setpgid(pid, pid);  // also here, so that signals to the group never race the child's own call
    ::close(out_pipe[1]);
    ::close(err_pipe[1]);
    ranks[static_cast<std::size_t>(r)] = {pid, true, 0};
    std::string prefix = "[" + std::to_string(r) + "] ";
    streams.push_back({out_pipe[0], 1, prefix, {}});
    streams.push_back({err_pipe[0], 2, prefix, {}});
  }
  ::close(devnull);

  auto signal_all = [&](int sig) {
    for (auto& p : ranks)
      if (p.running) ::kill(-p.pid, sig);
  };

  // ---- supervise
  int first_failed = -1;
  int interrupted_by = 0;
  std::optional<clk::time_point> term_at, kill_at, reaped_all_at;
  int running = n;
  std::vector<pollfd> fds;
  std::vector<stream*> polled;
  char buf[65536];
  for (;;) {
    bool streams_open = std::any_of(streams.begin(), streams.end(), [](const stream& s) { return s.fd >= 0; });
    if (running == 0 && !streams_open) break;
    auto now = clk::now();
    if (running == 0 && !reaped_all_at) reaped_all_at = now;
    // Output still held open by something a rank left behind: stop waiting after a second.
    if (reaped_all_at && now - *reaped_all_at > std::chrono::seconds(1)) {
      for (auto& s : streams) s.close();
      break;
    }
    if (term_at && now >= *term_at) {
      std::fprintf(stderr, "plaitrun: stopping the remaining ranks (grace period over)\n");
      signal_all(SIGTERM);
      term_at.reset();
      kill_at = now + std::chrono::seconds(1);
    }
    if (kill_at && now >= *kill_at) {
      signal_all(SIGKILL);
      kill_at.reset();
    }

    fds.clear();
    polled.clear();
    fds.push_back({sig_fd, POLLIN, 0});
    for (auto& s : streams)
      if (s.fd >= 0) {
        fds.push_back({s.fd, POLLIN, 0});
        polled.push_back(&s);
      }
    int timeout = 1000;
    for (auto& t :
         {term_at, kill_at, reaped_all_at ? std::optional(*reaped_all_at + std::chrono::seconds(1)) : std::nullopt})
      if (t) timeout = std::min(timeout, plait::detail::poll_timeout_ms(*t));
    if (::poll(fds.data(), fds.size(), timeout) < 0 && errno != EINTR) {
      std::perror("plaitrun: poll");
      signal_all(SIGKILL);
      return 1;
    }

    for (std::size_t k = 0; k < polled.size(); ++k) {
      if (!fds[k + 1].revents) continue;
      stream& s = *polled[k];
      ssize_t got = ::read(s.fd, buf, sizeof buf);
      if (got > 0) {
        s.pending.append(buf, static_cast<std::size_t>(got));
        s.drain_lines(false);
      } else if (got == 0 || (errno != EINTR && errno != EAGAIN)) {
        s.close();
      }
    }

    if (fds[0].revents & POLLIN) {
      signalfd_siginfo info;
      while (::read(sig_fd, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
        int sig = static_cast<int>(info.ssi_signo);
        if (sig == SIGCHLD) continue;  // reaped below
        if (!interrupted_by) interrupted_by = sig;
        int forward = sig == SIGHUP ? SIGTERM : sig;
        std::fprintf(stderr, "plaitrun: got %s, sending %s to every rank\n", signal_name(sig).c_str(),
                     signal_name(forward).c_str());
        signal_all(forward);
      }
    }
    for (;;) {
      int status = 0;
      pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid <= 0) break;
      for (std::size_t r = 0; r < ranks.size(); ++r) {
        if (ranks[r].pid != pid || !ranks[r].running) continue;
        ranks[r].running = false;
        ranks[r].status = status;
        --running;
        bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (!ok && first_failed < 0) {
          first_failed = static_cast<int>(r);
          if (running > 0) term_at = clk::now() + grace_period;
        }
      }
    }
    if (running == 0) {  // nobody left to stop
      term_at.reset();
      kill_at.reset();
    }
  }

  server.reset();
  if (first_failed >= 0) {
    int status = ranks[static_cast<std::size_t>(first_failed)].status;
    std::fprintf(stderr, "plaitrun: rank %d failed first (%s)\n", first_failed, describe(status).c_str());
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  }
  if (interrupted_by) return 128 + interrupted_by;
  return 0;
}
