// plaitrun end to end: output tagging, the environment it gives ranks, failure
// handling with the grace period, signal forwarding, usage errors, and ranks that
// really join through its store. The executables come from the environment
// (PLAITRUN, RANK_PROG), set by meson.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <plait/detail/socket.hpp>

#include "bootstrap_support.hpp"

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

std::string exe(const char* var) {
  const char* p = std::getenv(var);
  if (!p) FAIL(std::string(var) + " is not set; run this test through meson");
  return p;
}

// A child process with its stdout and stderr captured.
class process {
 public:
  explicit process(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env = {}) {
    int out[2], err[2];
    REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
    REQUIRE(::pipe2(err, O_CLOEXEC) == 0);
    std::vector<char*> args;
    std::vector<std::string> copy = argv;
    for (auto& a : copy) args.push_back(a.data());
    args.push_back(nullptr);
    std::fflush(nullptr);
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      ::dup2(out[1], 1);
      ::dup2(err[1], 2);
      for (const auto& e : extra_env) ::putenv(const_cast<char*>(e.c_str()));
      ::execv(args[0], args.data());
      ::_exit(126);
    }
    ::close(out[1]);
    ::close(err[1]);
    out_fd_ = out[0];
    err_fd_ = err[0];
    start_ = clock_type::now();
  }
  ~process() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (out_fd_ >= 0) ::close(out_fd_);
    if (err_fd_ >= 0) ::close(err_fd_);
  }
  process(const process&) = delete;
  process& operator=(const process&) = delete;

  pid_t pid() const { return pid_; }

  // Reads output until pred(stdout so far) holds or the deadline passes.
  bool read_until(const std::function<bool(const std::string&)>& pred, clock_type::time_point deadline) {
    while (!pred(out_)) {
      if (clock_type::now() >= deadline) return false;
      if (!pump(deadline)) return pred(out_);
    }
    return true;
  }

  // Waits for exit (killing it at the deadline); returns the raw wait status.
  int finish(clock_type::time_point deadline) {
    while (pump(deadline)) {
    }
    if (clock_type::now() >= deadline && (out_fd_ >= 0 || err_fd_ >= 0)) ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    reaped_ = true;
    elapsed_ = clock_type::now() - start_;
    return status;
  }

  const std::string& out() const { return out_; }
  const std::string& err() const { return err_; }
  clock_type::duration elapsed() const { return elapsed_; }

 private:
  // One poll round; false once both pipes are closed or the deadline passed.
  bool pump(clock_type::time_point deadline) {
    if (out_fd_ < 0 && err_fd_ < 0) return false;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_type::now()).count();
    if (left <= 0) return false;
    pollfd fds[2] = {{out_fd_, POLLIN, 0}, {err_fd_, POLLIN, 0}};
    ::poll(fds, 2, static_cast<int>(std::min<long long>(left, 100)));
    for (int i = 0; i < 2; ++i) {
      int& fd = i == 0 ? out_fd_ : err_fd_;
      if (fd < 0 || !fds[i].revents) continue;
      char buf[4096];
      ssize_t n = ::read(fd, buf, sizeof buf);
      if (n > 0)
        (i == 0 ? out_ : err_).append(buf, static_cast<std::size_t>(n));
      else if (n == 0 || errno != EINTR) {
        ::close(fd);
        fd = -1;
      }
    }
    return true;
  }

  pid_t pid_ = -1;
  int out_fd_ = -1, err_fd_ = -1;
  bool reaped_ = false;
  std::string out_, err_;
  clock_type::time_point start_;
  clock_type::duration elapsed_{};
};

std::multiset<std::string> lines(const std::string& s) {
  std::multiset<std::string> out;
  std::istringstream in(s);
  for (std::string line; std::getline(in, line);) out.insert(line);
  return out;
}

int exit_code(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : -1; }

}  // namespace

TEST_CASE("plaitrun tags every line with its rank", "[plaitrun]") {
  process p({exe("PLAITRUN"), "-n", "3", "/bin/sh", "-c",
             "echo hi $PLAIT_RANK; echo err $PLAIT_RANK >&2; printf tail$PLAIT_RANK"});
  int status = p.finish(clock_type::now() + 20s);
  CHECK(exit_code(status) == 0);
  CHECK(lines(p.out()) ==
        std::multiset<std::string>{"[0] hi 0", "[1] hi 1", "[2] hi 2", "[0] tail0", "[1] tail1", "[2] tail2"});
  CHECK(lines(p.err()) == std::multiset<std::string>{"[0] err 0", "[1] err 1", "[2] err 2"});
}

TEST_CASE("plaitrun gives each rank its PLAIT_* environment and a fresh token", "[plaitrun]") {
  const char* script =
      "echo \"$PLAIT_RANK $PLAIT_LOCAL_RANK $PLAIT_WORLD_SIZE $PLAIT_STORE_SERVED ${#PLAIT_TOKEN}\"; "
      "echo store=$PLAIT_STORE; echo token=$PLAIT_TOKEN";
  process a({exe("PLAITRUN"), "-n", "2", "/bin/sh", "-c", script}, {"PLAIT_TOKEN=inherited-token-must-not-win"});
  CHECK(exit_code(a.finish(clock_type::now() + 20s)) == 0);
  auto out = lines(a.out());
  CHECK(out.count("[0] 0 0 2 1 64") == 1);
  CHECK(out.count("[1] 1 1 2 1 64") == 1);
  std::set<std::string> stores, tokens;
  for (const auto& l : out) {
    if (l.find("store=") != std::string::npos) stores.insert(l.substr(l.find('=') + 1));
    if (l.find("token=") != std::string::npos) tokens.insert(l.substr(l.find('=') + 1));
  }
  REQUIRE(stores.size() == 1);  // the same store and token for every rank
  REQUIRE(tokens.size() == 1);
  CHECK(stores.begin()->rfind("127.0.0.1:", 0) == 0);

  process b({exe("PLAITRUN"), "-n", "1", "/bin/sh", "-c", "echo token=$PLAIT_TOKEN"});
  CHECK(exit_code(b.finish(clock_type::now() + 20s)) == 0);
  CHECK(b.out().find(*tokens.begin()) == std::string::npos);  // a new job, a new token
}

TEST_CASE("a failing rank: the others get the grace period, then are stopped", "[plaitrun]") {
  // Rank 1 fails; the others would sleep for a minute.
  process p({exe("PLAITRUN"), "-n", "3", "--grace", "0.5", "/bin/sh", "-c",
             "if [ $PLAIT_RANK = 1 ]; then echo failing >&2; exit 3; fi; sleep 60"});
  int status = p.finish(clock_type::now() + 20s);
  CHECK(exit_code(status) == 3);
  CHECK_THAT(p.err(), Catch::Contains("plaitrun: rank 1 failed first (exit status 3)"));
  CHECK_THAT(p.err(), Catch::Contains("[1] failing"));
  CHECK(p.elapsed() >= 400ms);  // the grace period was given
  CHECK(p.elapsed() < 4s);      // and the sleepers stopped right after it
}

TEST_CASE("ranks ignoring SIGTERM are killed one second after the grace period", "[plaitrun]") {
  process p({exe("PLAITRUN"), "-n", "2", "--grace", "0.3", "/bin/sh", "-c",
             "trap '' TERM; if [ $PLAIT_RANK = 0 ]; then kill -KILL $$; fi; sleep 60"});
  int status = p.finish(clock_type::now() + 20s);
  CHECK(exit_code(status) == 128 + SIGKILL);
  CHECK_THAT(p.err(), Catch::Contains("plaitrun: rank 0 failed first (signal SIGKILL)"));
  CHECK(p.elapsed() >= 1200ms);  // 0.3 s grace + 1 s before SIGKILL
  CHECK(p.elapsed() < 5s);
}

TEST_CASE("PLAIT_GRACE sets the grace period; --grace wins", "[plaitrun]") {
  process p({exe("PLAITRUN"), "-n", "2", "/bin/sh", "-c", "if [ $PLAIT_RANK = 1 ]; then exit 9; fi; sleep 60"},
            {"PLAIT_GRACE=0.2"});
  CHECK(exit_code(p.finish(clock_type::now() + 20s)) == 9);
  CHECK(p.elapsed() < 3s);
}

TEST_CASE("plaitrun forwards SIGTERM to every rank", "[plaitrun]") {
  process p({exe("PLAITRUN"), "-n", "2", "/bin/sh", "-c",
             "trap 'echo got TERM $PLAIT_RANK; exit 7' TERM; echo ready $PLAIT_RANK; "
             "while :; do sleep 0.05; done"});
  REQUIRE(p.read_until(
      [](const std::string& out) {
        return out.find("[0] ready 0") != std::string::npos && out.find("[1] ready 1") != std::string::npos;
      },
      clock_type::now() + 15s));
  auto start = clock_type::now();
  ::kill(p.pid(), SIGTERM);
  int status = p.finish(clock_type::now() + 20s);
  CHECK(clock_type::now() - start < 3s);
  CHECK_THAT(p.out(), Catch::Contains("[0] got TERM 0") && Catch::Contains("[1] got TERM 1"));
  CHECK(exit_code(status) != 0);
  CHECK_THAT(p.err(), Catch::Contains("failed first (exit status 7)"));
}

TEST_CASE("plaitrun binds each rank to one CPU, round robin when there are more ranks than CPUs", "[plaitrun]") {
  cpu_set_t allowed;
  REQUIRE(::sched_getaffinity(0, sizeof allowed, &allowed) == 0);
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  // What the kernel says each rank may run on (the list of this test's own, when unbound).
  const char* script = "echo $PLAIT_RANK $(grep Cpus_allowed_list: /proc/self/status | cut -f2)";
  process self({"/bin/sh", "-c", "echo $(grep Cpus_allowed_list: /proc/self/status | cut -f2)"});
  REQUIRE(exit_code(self.finish(clock_type::now() + 10s)) == 0);
  const std::string all = self.out().substr(0, self.out().find('\n'));
  const int fit = static_cast<int>(cpus.size());

  process bound({exe("PLAITRUN"), "-n", std::to_string(fit), "/bin/sh", "-c", script});
  REQUIRE(exit_code(bound.finish(clock_type::now() + 20s)) == 0);
  std::multiset<std::string> want;
  for (int r = 0; r < fit; ++r)
    want.insert("[" + std::to_string(r) + "] " + std::to_string(r) + " " +
                std::to_string(cpus[static_cast<std::size_t>(r)]));
  CHECK(lines(bound.out()) == want);

  // More ranks than CPUs: rank r on CPU r mod C, so every CPU carries the same number
  // of ranks, give or take one.
  const int more_ranks = 2 * fit + 1;
  process more({exe("PLAITRUN"), "-n", std::to_string(more_ranks), "/bin/sh", "-c", script});
  REQUIRE(exit_code(more.finish(clock_type::now() + 20s)) == 0);
  want.clear();
  for (int r = 0; r < more_ranks; ++r)
    want.insert("[" + std::to_string(r) + "] " + std::to_string(r) + " " +
                std::to_string(cpus[static_cast<std::size_t>(r % fit)]));
  CHECK(lines(more.out()) == want);

  for (const auto& [args, env] : std::vector<std::pair<std::vector<std::string>, std::vector<std::string>>>{
           {{"--bind", "none"}, {}}, {{}, {"PLAIT_BIND=none"}}}) {
    std::vector<std::string> argv = {exe("PLAITRUN"), "-n", "1"};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.insert(argv.end(), {"/bin/sh", "-c", script});
    process none(argv, env);
    REQUIRE(exit_code(none.finish(clock_type::now() + 20s)) == 0);
    CHECK(lines(none.out()) == std::multiset<std::string>{"[0] 0 " + all});
  }
}

TEST_CASE("plaitrun usage errors exit 2 with a message; --help documents it", "[plaitrun]") {
  const std::vector<std::vector<std::string>> bad = {{},
                                                     {"-n"},
                                                     {"-n", "0", "/bin/true"},
                                                     {"-n", "x", "/bin/true"},
                                                     {"-n", "2"},
                                                     {"--bogus", "-n", "2", "/bin/true"},
                                                     {"-n", "2", "--grace", "soon", "/bin/true"},
                                                     {"-n", "2", "--bind", "socket", "/bin/true"},
                                                     {"-n", "2", "--bind"}};
  for (const auto& args : bad) {
    std::vector<std::string> argv = {exe("PLAITRUN")};
    argv.insert(argv.end(), args.begin(), args.end());
    process p(argv);
    int status = p.finish(clock_type::now() + 10s);
    CAPTURE(args);
    CHECK(exit_code(status) == 2);
    CHECK_THAT(p.err(), Catch::Contains("plaitrun: "));
  }
  process help({exe("PLAITRUN"), "--help"});
  CHECK(exit_code(help.finish(clock_type::now() + 10s)) == 0);
  CHECK_THAT(help.out(), Catch::Contains("usage: plaitrun -n N") && Catch::Contains("--grace") &&
                             Catch::Contains("PLAIT_GRACE") && Catch::Contains("SIGTERM") &&
                             Catch::Contains("--bind") && Catch::Contains("PLAIT_BIND"));

  process missing({exe("PLAITRUN"), "-n", "1", "no-such-program-xyz"});
  CHECK(exit_code(missing.finish(clock_type::now() + 10s)) == 127);
  CHECK_THAT(missing.err(), Catch::Contains("no-such-program-xyz"));
}

TEST_CASE("ranks launched by plaitrun join through its store", "[plaitrun]") {
  process p({exe("PLAITRUN"), "-n", "4", exe("RANK_PROG")});
  int status = p.finish(clock_type::now() + 60s);
  INFO(p.err());
  CHECK(exit_code(status) == 0);
  std::set<std::string> keys;
  for (int r = 0; r < 4; ++r) {
    std::string prefix = "[" + std::to_string(r) + "] rank " + std::to_string(r) + " of 4 ok ";
    auto at = p.out().find(prefix);
    REQUIRE(at != std::string::npos);
    auto end = p.out().find('\n', at);
    keys.insert(p.out().substr(at + prefix.size(), end - at - prefix.size()));
  }
  CHECK(keys.size() == 1);  // one job key for the whole job
}

TEST_CASE("ranks launched by hand: rank 0 serves the store and outlives its clients", "[plaitrun]") {
  auto probe = plait::detail::listen_tcp("127.0.0.1", 0);
  auto port = plait::detail::local_port(probe.get());
  probe.reset();
  std::vector<std::unique_ptr<process>> ranks;
  for (int r = 0; r < 3; ++r)
    ranks.push_back(
        std::make_unique<process>(std::vector<std::string>{exe("RANK_PROG")},
                                  std::vector<std::string>{"PLAIT_RANK=" + std::to_string(r), "PLAIT_WORLD_SIZE=3",
                                                           "PLAIT_STORE=127.0.0.1:" + std::to_string(port),
                                                           "PLAIT_TOKEN=by-hand-0123456789abc"}));
  for (int r = 0; r < 3; ++r) {
    auto& p = *ranks[static_cast<std::size_t>(r)];
    int status = p.finish(clock_type::now() + 60s);
    CAPTURE(r, p.err());
    CHECK(exit_code(status) == 0);
    CHECK_THAT(p.out(), Catch::Contains("rank " + std::to_string(r) + " of 3 ok"));
  }
}
