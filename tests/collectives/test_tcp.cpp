// Every collective x algorithm over TCP (DESIGN.md section 8).
#include <sched.h>

#include <plait/transport/tcp.hpp>

#include "collectives/matrix.hpp"

using plait::transport::tcp;
using namespace plait::testing;

TEST_CASE("every collective x algorithm over tcp equals the reference", "[collectives][tcp]") {
  const int ranks = GENERATE(1, 2, 3, 4, 5, 8);
  std::vector<std::size_t> counts = {0, 1, 13, 4099};
  if (ranks != 8) counts.push_back((1 << 20) + 3);
  CAPTURE(ranks);
  check_cases<tcp>(ranks, [=] { return representative_cases<tcp>(ranks, counts); });
}

TEST_CASE("every collective over tcp equals the reference with every all_gather output copy streamed",
          "[collectives][tcp]") {
  const int ranks = GENERATE(2, 3);
  CAPTURE(ranks);
  check_streamed<tcp>(ranks);
}

TEST_CASE("16 MiB per rank of float sum over tcp equals the reference", "[collectives][tcp][large]") {
  const int ranks = GENERATE(2, 4);
  CAPTURE(ranks);
  const std::size_t count = (16u << 20) / sizeof(float);
  rank_options large;
  large.slice_bytes = "128K";
  large.copy_slice_bytes = "";  // the default over tcp: the slice
  check_cases<tcp>(
      ranks,
      [=] {
        case_list<tcp> cs;
        add_all_reduce<tcp, float, plait::sum>(cs, ranks, count);
        add_others<tcp, float, plait::sum>(cs, ranks, count);
        return cs;
      },
      large);
}

TEST_CASE("over tcp broadcast and send/recv go in the pipeline slice unless set; a 3-slot window on one host",
          "[collectives][tcp]") {
  using v = std::vector<std::uint64_t>;  // per rank: slice, copy slice, depth, window, all_gather at 2M, at 1M
  CHECK(agreed_slices<tcp>("4K", "") == v{4096, 4096, 4, 3, 4096, 4096, 4096, 4096, 4, 3, 4096, 4096});
  CHECK(agreed_slices<tcp>("4K", "16K") == v{4096, 16384, 4, 3, 4096, 4096, 4096, 16384, 4, 3, 4096, 4096});
}

TEST_CASE("over tcp the ranks agree whether they share one host, and take a 3-slot send window only then",
          "[collectives][tcp]") {
  // Per rank: one host, network, depth, send window, slice, copy slice and all_gather slice (KiB).
  using v = std::vector<int>;
  // On one host all_gather takes 512 KiB slices where each of the 3 ranks has a core.
  const int gather = plait::detail::more_ranks_than_cores(3) ? 256 : 512;
  CHECK(agreed_hosts<tcp>([](int) { return "node-a"; }) ==
        v{1, 1, 4, 3, 256, 256, gather, 1, 1, 4, 3, 256, 256, gather, 1, 1, 4, 3, 256, 256, gather});
  // One rank elsewhere: every rank says no, the two that share a host included.
  CHECK(agreed_hosts<tcp>([](int r) { return r == 2 ? "node-b" : "node-a"; }) ==
        v{0, 1, 4, 4, 256, 256, 256, 0, 1, 4, 4, 256, 256, 256, 0, 1, 4, 4, 256, 256, 256});
  CHECK(agreed_hosts<tcp>([](int r) { return r == 0 ? "node-b" : "node-a"; }) ==
        v{0, 1, 4, 4, 256, 256, 256, 0, 1, 4, 4, 256, 256, 256, 0, 1, 4, 4, 256, 256, 256});
}

namespace {

// 3 ranks over tcp, bound (where `bound`) round robin to the first one or two CPUs
// this test may use, as plaitrun binds them: per rank, the broadcast chain it agreed
// on (comm_config::chain), then the number of broadcasts from each root, by the ring
// and by `automatic`, whose data did not arrive whole.
std::vector<std::vector<int>> chains_over_tcp(bool bound, const std::string& chain_env,
                                              std::function<std::string(int)> host_id = {}) {
  rank_options opt;
  opt.chain = chain_env;
  opt.host_id = std::move(host_id);
  if (bound) opt.cpu = round_robin_on_two_cpus();
  constexpr int n = 3;
  auto results = run_ranks<tcp>(
      n,
      [](plait::communicator<tcp>& c) {
        std::vector<int> v = c.core().config().chain;
        int wrong = 0;
        for (const std::size_t count : {std::size_t{5000}, std::size_t{20000}})  // 3 slices; automatic's ring
          for (int root = 0; root < c.size(); ++root) {
            const auto want = exact_pattern<float>(root, count);
            std::vector<float> ring = c.rank() == root ? want : std::vector<float>(count);
            plait::broadcast<plait::ring>(c, std::span<float>(ring), root);
            std::vector<float> any = c.rank() == root ? want : std::vector<float>(count);
            plait::broadcast(c, std::span<float>(any), root);
            wrong += (ring != want) + (any != want);
          }
        v.push_back(wrong);
        return std::vector<blob>{to_blob(v)};
      },
      opt);
  return first_blobs_as_ints(results);
}

}  // namespace

TEST_CASE("over tcp on one host ranks that share a CPU are next to each other on the broadcast chain",
          "[collectives][tcp][chain]") {
  using v = std::vector<int>;
  const bool two_cpus = cpus_this_test_may_use() >= 2;
  // Bound round robin to two CPUs, ranks 0 and 2 share one: the chain is 0-2-1 (each
  // rank's list ends with the count of broadcasts that went wrong: none). On one CPU
  // all three share it and the chain is rank order.
  const v grouped = two_cpus ? v{0, 2, 1, 0} : v{0, 1, 2, 0};
  CHECK(chains_over_tcp(true, "") == std::vector<v>(3, grouped));
  CHECK(chains_over_tcp(true, "cpus") == std::vector<v>(3, grouped));
  // Rank order where asked, where the ranks are not bound (unless this test itself
  // is, to one CPU), and across hosts.
  CHECK(chains_over_tcp(true, "ranks") == std::vector<v>(3, v{0}));
  CHECK(chains_over_tcp(false, "") == std::vector<v>(3, two_cpus ? v{0} : grouped));
  CHECK(chains_over_tcp(true, "", [](int r) { return r == 1 ? "node-b" : "node-a"; }) == std::vector<v>(3, v{0}));
}

TEST_CASE("over tcp on one host with a core per rank all_gather goes in 512 KiB slices unless the slice is set",
          "[collectives][tcp]") {
  using v = std::vector<std::uint64_t>;  // per rank: slice, copy slice, depth, window, all_gather at 2M, at 1M
  constexpr std::uint64_t K = 1024;
  const std::uint64_t gather = plait::detail::more_ranks_than_cores(2) ? 256 * K : 512 * K;
  CHECK(agreed_slices<tcp>("", "") ==
        v{256 * K, 256 * K, 4, 3, gather, gather, 256 * K, 256 * K, 4, 3, gather, gather});
  CHECK(agreed_slices<tcp>("256K", "") ==
        v{256 * K, 256 * K, 4, 3, 256 * K, 256 * K, 256 * K, 256 * K, 4, 3, 256 * K, 256 * K});
  CHECK(agreed_slices<tcp>("", "64K") ==
        v{256 * K, 64 * K, 4, 3, gather, gather, 256 * K, 64 * K, 4, 3, gather, gather});
}

TEST_CASE(
    "over tcp on one host ranks bound to a shared CPU reduce, and gather under 2 MiB, in 128 KiB slices unless the "
    "slice is set",
    "[collectives][tcp][chain]") {
  using v = std::vector<std::uint64_t>;  // per rank: slice, copy slice, depth, window, all_gather at 2M, at 1M
  constexpr std::uint64_t K = 1024;
  cpu_set_t allowed;
  REQUIRE(::sched_getaffinity(0, sizeof allowed, &allowed) == 0);
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE && cpus.size() < 2; ++c)
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  // Both ranks on one CPU: a reducing step's slice and an all_gather's under 2 MiB
  // of output are 128 KiB; the copies and larger all_gathers keep 256 KiB (slots hold
  // the largest), and the window is 3 frames.
  const auto same = [&](int) { return cpus[0]; };
  CHECK(agreed_slices<tcp>("", "", same) ==
        v{128 * K, 256 * K, 4, 3, 256 * K, 128 * K, 128 * K, 256 * K, 4, 3, 256 * K, 128 * K});
  // A slice or copy slice that was set stays.
  CHECK(agreed_slices<tcp>("64K", "", same) ==
        v{64 * K, 64 * K, 4, 3, 64 * K, 64 * K, 64 * K, 64 * K, 4, 3, 64 * K, 64 * K});
  CHECK(agreed_slices<tcp>("", "64K", same) ==
        v{128 * K, 64 * K, 4, 3, 256 * K, 128 * K, 128 * K, 64 * K, 4, 3, 256 * K, 128 * K});
  // A CPU each: as unbound (with a core per rank, all_gather in 512 KiB slices).
  if (cpus.size() >= 2) {
    const std::uint64_t gather = plait::detail::more_ranks_than_cores(2) ? 256 * K : 512 * K;
    const auto apart = [&](int r) { return cpus[static_cast<std::size_t>(r)]; };
    CHECK(agreed_slices<tcp>("", "", apart) ==
          v{256 * K, 256 * K, 4, 3, gather, gather, 256 * K, 256 * K, 4, 3, gather, gather});
  }
}
