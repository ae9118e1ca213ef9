// peer-gloo-bench: the plait-bench measurement (bench_report.hpp) through Gloo.
//
//   peer-gloo-bench -N 4 -o all_reduce -a halving_doubling -b 4K -e 16M -f 4
//
// The program launches its own ranks: it forks -N processes that rendezvous
// through a gloo::rendezvous::FileStore in a fresh mkdtemp directory (removed at
// the end) and connect with Gloo's TCP transport on 127.0.0.1. The parent waits
// for all of them with a bound (PEER_TIMEOUT seconds, default 600): if one rank
// fails or the bound passes it kills every rank and exits 1.
//
// Collectives, float sum only, through Gloo's algorithm classes, which bind their
// buffers at construction: all_reduce -a ring | ring_chunked | halving_doubling
// (AllreduceRing, AllreduceRingChunked, AllreduceHalvingDoubling; in place),
// all_gather (AllgatherRing), broadcast (BroadcastOneToAll, in place, root -R).
// Gloo's newer gloo::allreduce() function only offers ring and bcube, so the
// classes are used for every algorithm, as Gloo's own benchmark does. Each object
// is constructed once per size outside the timed loop and only run() is timed.
// Exit status: 0, 1 (a rank failed, timed out, or #wrong > 0), 2 (bad options).
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gloo/allgather_ring.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier_all_to_all.h>
#include <gloo/broadcast_one_to_all.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench_report.hpp"

#ifndef PLAIT_GLOO_VERSION
#define PLAIT_GLOO_VERSION "unknown"
#endif

namespace {

constexpr const char* prog = "peer-gloo-bench";
// Gloo's context timeout: every pair operation (connect, send, receive) throws
// after it, so a rank never waits forever on a peer that died.
constexpr int gloo_timeout_s = 60;
constexpr double default_launch_timeout_s = 600;

const char* extra_usage =
    "  -N ranks                 processes to fork (default 2)\n"
    "  -o all_reduce | all_gather | broadcast   (float sum only)\n"
    "  -a ring | ring_chunked | halving_doubling   (all_reduce; default ring)\n"
    "  -t tcp                   Gloo's TCP transport on 127.0.0.1 (the only one)\n"
    "  env PEER_TIMEOUT=seconds bound on the whole run (default 600)\n";

// Same small-integer pattern as plait-bench: every sum is exact.
float value(int rank, std::size_t i) { return static_cast<float>((i * 7 + static_cast<std::size_t>(rank) * 3) % 11); }

bool same(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

std::string settings_for(const bench::options& o, int ranks, double launch_timeout_s) {
  std::string algo;
  if (o.op == "all_reduce")
    algo = o.algo == "ring"           ? "gloo::AllreduceRing<float>"
           : o.algo == "ring_chunked" ? "gloo::AllreduceRingChunked<float>"
                                      : "gloo::AllreduceHalvingDoubling<float>";
  else if (o.op == "all_gather")
    algo = "gloo::AllgatherRing<float>";
  else
    algo = "gloo::BroadcastOneToAll<float> from root " + std::to_string(o.root);
  const bool in_place = o.op != "all_gather";
  return algo + " (algorithm class, " + (in_place ? "in place, " : "") +
         "constructed once per size outside the timed loop, run() timed); transport tcp on 127.0.0.1, "
         "pairs in Gloo's default async mode (epoll device thread, blocking waits, no busy-poll); "
         "context timeout " +
         std::to_string(gloo_timeout_s) + " s; rendezvous FileStore in a mkdtemp directory; " + std::to_string(ranks) +
         " forked ranks, launcher timeout " + std::to_string(static_cast<long>(launch_timeout_s)) + " s; -O2";
}

// One rank's whole sweep.
class rank_bench {
 public:
  rank_bench(std::shared_ptr<gloo::Context> ctx, const bench::options& o, std::string settings)
      : ctx_(std::move(ctx)), o_(o), settings_(std::move(settings)), rank_(ctx_->rank), n_(ctx_->size) {}

  // Returns this rank's exit status.
  int run() {
    const std::size_t max_count = bench::count_for(o_, o_.max_bytes, sizeof(float), n_);
    in_.assign(max_count, 0.0f);  // allocated and touched here, never in the timed loop
    out_.assign(max_count, 0.0f);
    // Per size each rank contributes {median us, minflt per call, #wrong}.
    stat_in_.assign(3, 0.0);
    stat_out_.assign(3 * static_cast<std::size_t>(n_), 0.0);
    gloo::AllgatherRing<double> stats(ctx_, {stat_in_.data()}, stat_out_.data(), 3);
    gloo::BarrierAllToAll barrier(ctx_);

    bench::report rep(o_, "gloo", PLAIT_GLOO_VERSION, n_, settings_, rank_ == 0);
    rep.header();
    const std::vector<std::size_t> sizes = bench::sizes(o_);
    for (std::size_t s = 0; s < sizes.size(); ++s) {
      const std::size_t count = bench::count_for(o_, sizes[s], sizeof(float), n_);
      rep.progress(s, sizes.size(), count * sizeof(float));
      // Lives until after the stats exchange, so no rank unregisters its buffers
      // while a peer may still be sending into them.
      const std::unique_ptr<gloo::Algorithm> alg = make(count);
      fill(count, false);
      const bench::timed_calls t = bench::time_calls(
          o_.warmup, o_.iters, [&] { alg->run(); }, [&] { barrier.run(); });
      stat_in_[1] = static_cast<double>(t.faults) / o_.iters;
      stat_in_[0] = bench::median(t.us());
      stat_in_[2] = 0;
      if (o_.check) {
        // The barrier keeps a fast neighbour from writing its check data into
        // out_ before this rank's fill() (ring all-gather writes into out_
        // directly as soon as the previous run's last round allows it).
        fill(count, true);
        barrier.run();
        alg->run();
        stat_in_[2] = static_cast<double>(wrong(count));
      }
      stats.run();
      bench::row r;
      r.bytes = count * sizeof(float);
      r.count = count;
      r.root = o_.op == "broadcast" ? o_.root : -1;
      long long bad = 0;
      for (int k = 0; k < n_; ++k) {
        const double* st = &stat_out_[3 * static_cast<std::size_t>(k)];
        r.time_us = std::max(r.time_us, st[0]);
        r.minflt = std::max(r.minflt, st[1]);
        bad += static_cast<long long>(st[2]);
      }
      r.wrong = o_.check ? bad : -1;
      r.calls_us = t.calls;
      rep.add(r);
    }
    const bool written = rep.finish();
    return written && rep.total_wrong() == 0 ? 0 : 3;
  }

 private:
  std::unique_ptr<gloo::Algorithm> make(std::size_t count) {
    const int c = static_cast<int>(count);
    const std::vector<float*> out{out_.data()};
    if (o_.op == "all_reduce") {
      if (o_.algo == "ring") return std::make_unique<gloo::AllreduceRing<float>>(ctx_, out, c);
      if (o_.algo == "ring_chunked") return std::make_unique<gloo::AllreduceRingChunked<float>>(ctx_, out, c);
      return std::make_unique<gloo::AllreduceHalvingDoubling<float>>(ctx_, out, c);
    }
    if (o_.op == "all_gather") {
      const std::vector<const float*> in{in_.data()};
      return std::make_unique<gloo::AllgatherRing<float>>(ctx_, in, out_.data(), c / n_);
    }
    return std::make_unique<gloo::BroadcastOneToAll<float>>(ctx_, out, count, o_.root);
  }

  // Inputs for `count` elements; for the check, outputs are set to -1 first so
  // an element the collective never wrote is counted as wrong.
  void fill(std::size_t count, bool for_check) {
    const std::size_t block = count / static_cast<std::size_t>(n_);
    if (o_.op == "all_reduce") {
      for (std::size_t i = 0; i < count; ++i) out_[i] = value(rank_, i);
    } else if (o_.op == "all_gather") {
      for (std::size_t i = 0; i < block; ++i) in_[i] = value(rank_, i);
      if (for_check) std::fill_n(out_.begin(), count, -1.0f);
    } else {
      for (std::size_t i = 0; i < count; ++i) out_[i] = rank_ == o_.root ? value(o_.root, i) : -1.0f;
    }
  }

  long long wrong(std::size_t count) const {
    const std::size_t block = count / static_cast<std::size_t>(n_);
    long long bad = 0;
    for (std::size_t i = 0; i < count; ++i) {
      float want = 0;
      if (o_.op == "all_reduce") {
        for (int r = 0; r < n_; ++r) want += value(r, i);
      } else if (o_.op == "all_gather") {
        want = value(static_cast<int>(i / block), i % block);
      } else {
        want = value(o_.root, i);
      }
      bad += !same(out_[i], want);
    }
    return bad;
  }

  std::shared_ptr<gloo::Context> ctx_;
  const bench::options& o_;
  std::string settings_;
  int rank_, n_;
  std::vector<float> in_, out_;
  std::vector<double> stat_in_, stat_out_;
};

// A forked rank: connect, measure, return the exit status (0 ok, 1 error, 3 wrong).
int rank_main(int rank, int ranks, const std::string& dir, const bench::options& o, const std::string& settings) {
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    attr.ai_family = AF_INET;
    auto dev = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore store(dir);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, ranks);
    ctx->setTimeout(std::chrono::seconds(gloo_timeout_s));
    ctx->connectFullMesh(store, dev);
    const int rc = rank_bench(ctx, o, settings).run();
    // Nobody closes its connections while a peer may still be in a collective: a
    // barrier through the store, not the sockets (after a last socket barrier a rank
    // could leave and close while its peer still waited on that barrier's send, which
    // Gloo reports as "Connection closed by peer").
    store.set("finished/" + std::to_string(rank), {'1'});
    std::vector<std::string> finished;
    for (int r = 0; r < ranks; ++r) finished.push_back("finished/" + std::to_string(r));
    store.wait(finished, std::chrono::seconds(gloo_timeout_s));
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: rank %d of %d: %s\n", prog, rank, ranks, e.what());
    return 1;
  }
}

volatile sig_atomic_t interrupted = 0;
extern "C" void on_signal(int) { interrupted = 1; }

void kill_all(const std::vector<pid_t>& pids, std::vector<bool>& done) {
  for (std::size_t r = 0; r < pids.size(); ++r)
    if (!done[r]) kill(pids[r], SIGKILL);
  for (std::size_t r = 0; r < pids.size(); ++r)
    if (!done[r]) {
      waitpid(pids[r], nullptr, 0);
      done[r] = true;
    }
}

// Waits for every rank within timeout_s; returns the program's exit status.
int supervise(const std::vector<pid_t>& pids, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  std::vector<bool> done(pids.size(), false);
  std::size_t left = pids.size();
  int rc = 0;
  while (left > 0) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      std::size_t r = 0;
      while (r < pids.size() && pids[r] != pid) ++r;
      if (r == pids.size()) continue;
      done[r] = true;
      --left;
      if (WIFEXITED(status) && WEXITSTATUS(status) == 3) {
        rc = 1;  // finished, but #wrong > 0 or the JSON was not written: already reported
      } else if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
        if (WIFSIGNALED(status))
          std::fprintf(stderr, "%s: rank %zu killed by signal %d; stopping the other ranks\n", prog, r,
                       WTERMSIG(status));
        else
          std::fprintf(stderr, "%s: rank %zu exited with status %d; stopping the other ranks\n", prog, r,
                       WEXITSTATUS(status));
        kill_all(pids, done);
        return 1;
      }
    } else if (pid < 0 && errno != EINTR) {
      std::fprintf(stderr, "%s: waitpid: %s\n", prog, std::strerror(errno));
      kill_all(pids, done);
      return 1;
    } else if (interrupted) {
      std::fprintf(stderr, "%s: interrupted; stopping all ranks\n", prog);
      kill_all(pids, done);
      return 1;
    } else if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr,
                   "%s: %zu of %zu ranks still running after %.0f s (PEER_TIMEOUT); killing them. "
                   "Raise PEER_TIMEOUT or shrink the sweep (-e, -n).\n",
                   prog, left, pids.size(), timeout_s);
      kill_all(pids, done);
      return 1;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  // -N is ours; everything else goes to bench::parse.
  int ranks = 2;
  std::vector<char*> args{argv[0]};
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "-N") == 0) {
      if (i + 1 >= argc) bench::usage(prog, "missing value for -N", extra_usage);
      char* end = nullptr;
      const long v = std::strtol(argv[++i], &end, 10);
      if (*end != '\0' || v < 2 || v > 256) bench::usage(prog, "-N takes a rank count from 2 to 256", extra_usage);
      ranks = static_cast<int>(v);
    } else {
      args.push_back(argv[i]);
    }
  }
  bench::options defaults;
  defaults.transport = "tcp";
  bench::options o = bench::parse(static_cast<int>(args.size()), args.data(), defaults, extra_usage);
  if (o.type != "float" || o.redop != "sum")
    bench::usage(prog, "only -d float -r sum are measured for Gloo", extra_usage);
  if (o.transport != "tcp") bench::usage(prog, "only -t tcp (Gloo's TCP transport) is supported", extra_usage);
  if (o.op == "all_reduce") {
    if (o.algo.empty()) o.algo = "ring";
    if (o.algo != "ring" && o.algo != "ring_chunked" && o.algo != "halving_doubling")
      bench::usage(prog, "all_reduce algorithms: ring, ring_chunked, halving_doubling", extra_usage);
  } else if (o.op == "all_gather") {
    if (o.algo.empty()) o.algo = "ring";
    if (o.algo != "ring") bench::usage(prog, "all_gather algorithm: ring", extra_usage);
  } else if (o.op == "broadcast") {
    if (o.algo.empty()) o.algo = "one_to_all";
    if (o.algo != "one_to_all") bench::usage(prog, "broadcast algorithm: one_to_all", extra_usage);
    if (o.root < 0 || o.root >= ranks) bench::usage(prog, "-R must name a rank below -N", extra_usage);
  } else {
    bench::usage(prog, "collectives: all_reduce, all_gather, broadcast", extra_usage);
  }
  // Gloo's algorithm classes count bytes in an int.
  if (o.max_bytes > static_cast<std::size_t>(INT_MAX))
    bench::usage(prog, "-e must stay below 2G: Gloo's algorithm classes count bytes in an int", extra_usage);

  double timeout_s = default_launch_timeout_s;
  if (const char* e = std::getenv("PEER_TIMEOUT")) {
    char* end = nullptr;
    timeout_s = std::strtod(e, &end);
    if (end == e || *end != '\0' || !(timeout_s > 0))
      bench::usage(prog, "PEER_TIMEOUT must be seconds > 0", extra_usage);
  }

  const char* tmp = std::getenv("TMPDIR");
  std::string dir = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/peer-gloo-XXXXXX";
  if (mkdtemp(dir.data()) == nullptr) {
    std::fprintf(stderr, "%s: cannot create a rendezvous directory %s: %s\n", prog, dir.c_str(), std::strerror(errno));
    return 1;
  }
  const std::string settings = settings_for(o, ranks, timeout_s);

  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::fflush(nullptr);  // nothing buffered may be printed twice
  const pid_t parent = getpid();
  std::vector<pid_t> pids;
  for (int r = 0; r < ranks; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      signal(SIGINT, SIG_DFL);
      signal(SIGTERM, SIG_DFL);
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // a rank never outlives its launcher
      if (getppid() != parent) _exit(1);
      const int rc = rank_main(r, ranks, dir, o, settings);
      std::fflush(nullptr);
      _exit(rc);
    }
    if (pid < 0) {
      std::fprintf(stderr, "%s: fork: %s\n", prog, std::strerror(errno));
      for (pid_t p : pids) kill(p, SIGKILL);
      for (pid_t p : pids) waitpid(p, nullptr, 0);
      std::filesystem::remove_all(dir);
      return 1;
    }
    pids.push_back(pid);
  }
  const int rc = supervise(pids, timeout_s);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (ec) std::fprintf(stderr, "%s: could not remove %s: %s\n", prog, dir.c_str(), ec.message().c_str());
  return rc;
}
