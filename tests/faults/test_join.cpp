// A rank that never connects (DESIGN.md section 6): it exits before calling
// from_env(), and every other rank's from_env() fails with `timeout` naming it
// (error.peer() and the message), within T_op + 1 s of its start (T_op =
// PLAIT_TIMEOUT = 3 s). The failed set-up leaves nothing behind: no descriptors,
// no threads, no /dev/shm entries, and the rank exits within 2 s.
// PLAIT_FAULT_REPEAT=N runs every case N times (tools/fault-repeat.sh).
#include <catch2/catch.hpp>

#include "support/faults.hpp"

using namespace plait::testing::faults;

namespace {

constexpr double t_op_ms = 3000;

void missing_once(transport_kind t, int n, int missing, int run) {
  const std::string name =
      std::string("never connected ") + name_of(t) + " n=" + std::to_string(n) + " missing=" + std::to_string(missing);
  job_options opt;
  opt.join_timeout = "";  // the join is what fails here: its deadline is T_op
  fault_job job(n, t, opt);
  job.start(
      [&](int, rank_board& me) {
        return with_transport(t, [&]<class Tr>() {
          // from_env() must fail; if it ever returns, the body says so.
          return with_communicator<Tr>(me, [&](plait::communicator<Tr>&) {
            me.set_note("from_env() returned although a rank never started");
            return 3;
          });
        });
      },
      {missing});
  const bool exited = job.wait_exit(std::chrono::seconds(30));
  std::string all;
  for (int r = 0; r < n; ++r) all += describe(job, r) + "\n";
  INFO(name << ", run " << run << "\n" << all);
  CHECK(exited);
  CHECK(job.leftover_segments().empty());
  for (int s = 0; s < n; ++s) {
    if (s == missing) continue;
    const rank_board& b = job.rank(s);
    measurement m;
    m.case_name = name;
    m.survivor = s;
    m.hi_ms = t_op_ms + 1000;
    m.ms = b.throw_ns != 0 ? ms_between(b.call_start_ns, b.throw_ns) : -1;
    const bool timed_out = b.code == static_cast<int>(plait::errc::timeout);
    const bool named = b.peer == missing;
    const bool in_message = std::string(b.what).find("rank " + std::to_string(missing)) != std::string::npos;
    // from_env() threw, so the exit status is 1; the rest must be clean.
    std::vector<std::string> problems;
    if (job.exit_status(s) != 1) problems.push_back("exit status " + std::to_string(job.exit_status(s)));
    if (b.fds_after != b.fds_before)
      problems.push_back(std::to_string(b.fds_before) + " descriptors before from_env(), " +
                         std::to_string(b.fds_after) + " after");
    if (b.threads_after != 1) problems.push_back(std::to_string(b.threads_after) + " threads after");
    if (b.throw_ns != 0 && job.reaped_at(s) != 0 && ms_between(b.throw_ns, job.reaped_at(s)) > 2000)
      problems.push_back("exited " + std::to_string(static_cast<int>(ms_between(b.throw_ns, job.reaped_at(s)))) +
                         " ms after from_env() threw");
    m.correct = timed_out && named && in_message && problems.empty() && m.ms >= 0 && m.ms <= m.hi_ms;
    m.detail = code_text(b.code) + " peer " + std::to_string(b.peer) +
               (in_message ? "" : ", not named in the message") + (problems.empty() ? "" : "; " + joined(problems));
    log_measurement(m);
    INFO(describe(job, s));
    CHECK(timed_out);
    CHECK(named);
    CHECK(in_message);
    CHECK(m.ms >= 0);
    CHECK(m.ms <= m.hi_ms);
    CHECK(joined(problems) == "");
  }
}

}  // namespace

TEST_CASE("a rank that never connects is timeout naming it on the others within T_op + 1 s", "[faults][join]") {
  const int runs = repeats(1);
  for (int run = 1; run <= runs; ++run)
    for (transport_kind t : {transport_kind::shm, transport_kind::tcp, transport_kind::hybrid})
      for (int missing : {0, 2}) missing_once(t, 3, missing, run);
}

// The harness forks its ranks only from a process with one thread (the store server
// starts after the forks): a thread running at fork time can hold a lock, OpenSSL's
// inside RAND_bytes for one, that the child then waits on forever (port_pipe.hpp).
TEST_CASE("fault_job forks its ranks only from a process with one thread", "[faults][join]") {
  std::atomic<bool> release{false};
  std::thread other([&] {
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  {
    fault_job job(2, transport_kind::shm);
    CHECK_THROWS_AS(job.start([](int, rank_board&) { return 0; }), std::logic_error);
    CHECK(!job.running(0));
    CHECK(!job.running(1));
  }
  release.store(true);
  other.join();
  fault_job job(2, transport_kind::shm);
  job.start([](int, rank_board&) { return 0; });
  CHECK(job.wait_exit(std::chrono::seconds(30)));
  CHECK(job.exit_status(0) == 0);
  CHECK(job.exit_status(1) == 0);
}
