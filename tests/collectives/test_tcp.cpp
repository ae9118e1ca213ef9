// Every collective x algorithm over TCP (DESIGN.md section 8).
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
  using v = std::vector<std::uint64_t>;  // per rank: slice, copy slice, depth, send window, all_gather slice
  CHECK(agreed_slices<tcp>("4K", "") == v{4096, 4096, 4, 3, 4096, 4096, 4096, 4, 3, 4096});
  CHECK(agreed_slices<tcp>("4K", "16K") == v{4096, 16384, 4, 3, 4096, 4096, 16384, 4, 3, 4096});
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

TEST_CASE("over tcp on one host with a core per rank all_gather goes in 512 KiB slices unless the slice is set",
          "[collectives][tcp]") {
  using v = std::vector<std::uint64_t>;  // per rank: slice, copy slice, depth, send window, all_gather slice
  constexpr std::uint64_t K = 1024;
  const std::uint64_t gather = plait::detail::more_ranks_than_cores(2) ? 256 * K : 512 * K;
  CHECK(agreed_slices<tcp>("", "") == v{256 * K, 256 * K, 4, 3, gather, 256 * K, 256 * K, 4, 3, gather});
  CHECK(agreed_slices<tcp>("256K", "") == v{256 * K, 256 * K, 4, 3, 256 * K, 256 * K, 256 * K, 4, 3, 256 * K});
  CHECK(agreed_slices<tcp>("", "64K") == v{256 * K, 64 * K, 4, 3, gather, 256 * K, 64 * K, 4, 3, gather});
}
