// hybrid<shm, tcp>: ranks given different PLAIT_HOST_ID values talk TCP, the others shm.
#include <plait/transport/hybrid.hpp>
#include <plait/transport/shm.hpp>
#include <plait/transport/tcp.hpp>

#include "collectives/matrix.hpp"

using mixed = plait::transport::hybrid<plait::transport::shm, plait::transport::tcp>;
static_assert(plait::transport_for<mixed>);
using namespace plait::testing;

TEST_CASE("every collective x algorithm over hybrid<shm, tcp> on two pretend hosts equals the reference",
          "[collectives][hybrid]") {
  const int ranks = GENERATE(1, 2, 3, 4, 5, 8);
  std::vector<std::size_t> counts = {0, 1, 13, 4099};
  if (ranks != 8) counts.push_back((1 << 20) + 3);
  CAPTURE(ranks);
  rank_options opt;
  opt.host_id = [](int r) { return r % 2 == 0 ? std::string("host-even") : std::string("host-odd"); };
  check_cases<mixed>(
      ranks, [=] { return representative_cases<mixed>(ranks, counts); }, opt);
}

TEST_CASE("16 MiB per rank of float sum over hybrid<shm, tcp> equals the reference", "[collectives][hybrid][large]") {
  const int ranks = GENERATE(2, 4);
  CAPTURE(ranks);
  const std::size_t count = (16u << 20) / sizeof(float);
  rank_options opt;
  opt.slice_bytes = "128K";
  opt.host_id = [](int r) { return r < 1 ? std::string("host-a") : std::string("host-b"); };
  check_cases<mixed>(
      ranks,
      [=] {
        case_list<mixed> cs;
        add_all_reduce<mixed, float, plait::sum>(cs, ranks, count);
        add_others<mixed, float, plait::sum>(cs, ranks, count);
        return cs;
      },
      opt);
}

TEST_CASE("hybrid<shm, tcp> on one host is all shm: automatic chooses as over memory", "[collectives][hybrid]") {
  // Per rank: one host, network, depth, send window, slice, copy slice and all_gather slice (KiB).
  using v = std::vector<int>;
  CHECK(agreed_hosts<mixed>([](int) { return "node-a"; }) ==
        v{1, 0, 4, 4, 256, 1024, 256, 1, 0, 4, 4, 256, 1024, 256, 1, 0, 4, 4, 256, 1024, 256});
  CHECK(agreed_hosts<mixed>([](int r) { return r == 1 ? "node-b" : "node-a"; }) ==
        v{0, 1, 4, 4, 256, 256, 256, 0, 1, 4, 4, 256, 256, 256, 0, 1, 4, 4, 256, 256, 256});
}
