// A stopped rank and a slow one (DESIGN.md section 6), with T_op = 3 s (set_timeout after a join of up to 30 s).
//
// Stopped (SIGSTOP in the middle of a collective, SIGKILL only once the test is
// over): a stopped process is alive, so no survivor may call it lost; each fails
// with `timeout` between T_op and T_op + 1 s after the start of the call that
// fails, on every run. Its communicator is broken afterwards and destroying it is
// clean, with the stopped rank still stopped.
// Slow (sleeps 0.5 x T_op before joining a collective, twice): everyone finishes
// with correct results and no error, and the others did wait for it.
// PLAIT_FAULT_REPEAT=N runs every case N times (tools/fault-repeat.sh).
#include <catch2/catch.hpp>

#include "support/faults.hpp"

using namespace plait::testing::faults;

namespace {

constexpr double t_op_ms = 3000;
constexpr std::int64_t warmup = 3;

std::string case_name(const char* what, transport_kind t, int n, int victim) {
  return std::string(what) + " " + name_of(t) + " n=" + std::to_string(n) + " victim=" + std::to_string(victim);
}

// `hold`: each survivor keeps its broken communicator until every survivor has
// failed, so that what each reports is its own detection; otherwise each destroys
// it and exits at once, as a program that ends on the error does, and the others
// must still report the stopped rank's timeout (not the exit of a survivor).
void stopped_once(transport_kind t, int n, int victim, bool hold, int run) {
  const std::string name = case_name("stopped", t, n, victim) + (hold ? " (survivors hold)" : " (survivors exit)");
  fault_job job(n, t);
  job.start([&](int, rank_board& me) {
    return with_transport(t, [&]<class Tr>() {
      return with_communicator<Tr>(me, [&](plait::communicator<Tr>& c) {
        const int status =
            loop_until_error(c, me, now_ns() + std::chrono::nanoseconds(std::chrono::seconds(40)).count());
        if (hold) {
          const std::int64_t until = now_ns() + std::chrono::nanoseconds(std::chrono::seconds(20)).count();
          while (job.state().go.load() == 0 && now_ns() < until)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        return status;
      });
    });
  });
  const bool warm = job.wait_until([&] {
    for (int r = 0; r < n; ++r)
      if (job.rank(r).iterations.load() < warmup) return false;
    return true;
  });
  const bool in_call = warm && job.wait_until([&] { return job.rank(victim).now() == phase::in_call; });
  if (in_call) job.signal(victim, SIGSTOP);
  if (hold) {
    job.wait_until(
        [&] {
          for (int r = 0; r < n; ++r)
            if (r != victim && job.running(r) && job.rank(r).now() != phase::failed) return false;
          return true;
        },
        std::chrono::seconds(30));
    job.state().go.store(1);
  }
  // The survivors report and exit while the victim is still stopped; then it is killed.
  const bool survivors_exited = job.wait_until(
      [&] {
        for (int r = 0; r < n; ++r)
          if (r != victim && job.running(r)) return false;
        return true;
      },
      std::chrono::seconds(30));
  const bool victim_still_there = job.running(victim);
  job.signal(victim, SIGKILL);
  job.wait_exit(std::chrono::seconds(10));

  std::string all;
  for (int r = 0; r < n; ++r) all += describe(job, r) + "\n";
  INFO(name << ", run " << run << "\n" << all);
  CHECK(warm);
  CHECK(in_call);
  if (!in_call) return;
  CHECK(survivors_exited);
  CHECK(victim_still_there);
  CHECK(job.leftover_segments().empty());
  for (int s = 0; s < n; ++s) {
    if (s == victim) continue;
    const rank_board& b = job.rank(s);
    measurement m;
    m.case_name = name;
    m.survivor = s;
    m.lo_ms = t_op_ms;
    m.hi_ms = t_op_ms + 1000;
    m.ms = b.throw_ns != 0 ? ms_between(b.call_start_ns, b.throw_ns) : -1;
    const auto problems = cleanup_problems(job, s);
    const bool timed_out = b.code == static_cast<int>(plait::errc::timeout);
    m.correct = timed_out && problems.empty() && m.ms >= m.lo_ms && m.ms <= m.hi_ms;
    m.detail = code_text(b.code) + " peer " + std::to_string(b.peer) + ", " +
               std::to_string(static_cast<int>(ms_between(job.signalled_at(victim, SIGSTOP), b.throw_ns))) +
               " ms after SIGSTOP" + (problems.empty() ? "" : "; " + joined(problems));
    log_measurement(m);
    INFO("survivor " << describe(job, s) << "\n" << m.ms << " ms after its call began");
    CHECK(timed_out);
    CHECK(m.ms >= m.lo_ms);
    CHECK(m.ms <= m.hi_ms);
    CHECK(joined(problems) == "");
  }
}

void slow_once(transport_kind t, int n, int slow, int run) {
  const std::string name = case_name("slow", t, n, slow);
  constexpr std::int64_t calls = 8;
  constexpr auto late = std::chrono::milliseconds(static_cast<int>(t_op_ms / 2));
  fault_job job(n, t);
  job.start([&](int r, rank_board& me) {
    return with_transport(t, [&]<class Tr>() {
      return with_communicator<Tr>(me, [&](plait::communicator<Tr>& c) {
        workload w(r, n);
        for (std::int64_t i = 0; i < calls; ++i) {
          // Late for a ring all_reduce and for a broadcast.
          if (r == slow && (i == 2 || i == 7)) std::this_thread::sleep_for(late);
          const std::int64_t t0 = now_ns();
          try {
            w.step(c, i);
          } catch (const plait::error& e) {
            me.record(e, t0);
            return 1;
          }
          me.longest_call_ms = std::max(me.longest_call_ms, ms_between(t0, now_ns()));
          me.iterations.fetch_add(1);
        }
        return 0;
      });
    });
  });
  const bool exited = job.wait_exit(std::chrono::seconds(60));
  std::string all;
  for (int r = 0; r < n; ++r) all += describe(job, r) + "\n";
  INFO(name << ", run " << run << "\n" << all);
  CHECK(exited);
  CHECK(job.leftover_segments().empty());
  for (int r = 0; r < n; ++r) {
    const rank_board& b = job.rank(r);
    INFO(describe(job, r) << ", longest call " << b.longest_call_ms << " ms");
    CHECK(b.code == 0);
    CHECK(b.iterations.load() == calls);
    CHECK(joined(cleanup_problems(job, r, false)) == "");
    if (r == slow) continue;
    measurement m;
    m.case_name = name;
    m.survivor = r;
    m.ms = b.longest_call_ms;
    m.lo_ms = 0;
    m.hi_ms = t_op_ms;
    m.correct = b.code == 0 && b.iterations.load() == calls && job.exit_status(r) == 0;
    m.detail = "longest wait for the slow rank; error " + code_text(b.code);
    log_measurement(m);
    // The others did wait for the slow rank (the test exercised the late join).
    CHECK(b.longest_call_ms >= 0.8 * static_cast<double>(late.count()));
  }
}

}  // namespace

TEST_CASE("a stopped rank is timeout on every other rank, between T_op and T_op + 1 s", "[faults][stop]") {
  const int runs = repeats(1);
  for (int run = 1; run <= runs; ++run)
    for (bool hold : {true, false}) {
      stopped_once(transport_kind::shm, 4, 1, hold, run);
      stopped_once(transport_kind::tcp, 4, 1, hold, run);
      stopped_once(transport_kind::hybrid, 4, 1, hold, run);
    }
}

TEST_CASE("a rank 0.5 x T_op late for its collectives causes no error", "[faults][slow]") {
  const int runs = repeats(1);
  for (int run = 1; run <= runs; ++run) {
    slow_once(transport_kind::shm, 3, 1, run);
    slow_once(transport_kind::tcp, 3, 2, run);
    slow_once(transport_kind::hybrid, 4, 0, run);
  }
}
