// plait::automatic's choices: over a network transport (tcp, or a hybrid with tcp
// between hosts) all_reduce takes the tree on 3 or more ranks up to 1 MiB and
// reduce_scatter stays on the ring; over memory (shm) the choices are the ones tuned
// there. Every rank computes the same choice from the call and the transport type.
#include <plait/plait.hpp>
#include <plait/transport/hybrid.hpp>
#include <plait/transport/shm.hpp>
#include <plait/transport/tcp.hpp>

#include <catch2/catch.hpp>

using plait::automatic;
using plait::detail::collective_kind;
using plait::detail::pick;
using plait::detail::pick_exchange;

static_assert(plait::transport::tcp::traits.network);
static_assert(!plait::transport::shm::traits.network);
static_assert(plait::transport::hybrid<plait::transport::shm, plait::transport::tcp>::traits.network);

TEST_CASE("automatic all_reduce over a network takes the tree on 3+ ranks up to 1 MiB", "[automatic]") {
  constexpr std::size_t K = 1024;
  for (int n : {3, 4, 8}) {
    for (std::size_t bytes : {4 * K, 64 * K, 1024 * K}) {
      INFO(n << " ranks, " << bytes << " bytes");
      CHECK(pick<automatic>(bytes, true, n, true) == plait::tree::id);
    }
    CHECK(pick<automatic>(2048 * K, true, n, true) == plait::ring::id);
  }
  // Two ranks: one exchange, then the ring, as over memory.
  CHECK(pick<automatic>(4 * K, true, 2, true) == plait::direct::id);
  CHECK(pick<automatic>(1024 * K, true, 2, true) == plait::ring::id);
}

TEST_CASE("automatic over memory keeps the choices tuned on shm", "[automatic]") {
  constexpr std::size_t K = 1024;
  CHECK(pick<automatic>(4 * K, true, 2, false) == plait::direct::id);
  CHECK(pick<automatic>(4 * K, true, 3, false) == plait::direct::id);
  CHECK(pick<automatic>(4 * K, true, 4, false) == plait::recursive_doubling::id);
  CHECK(pick<automatic>(64 * K, true, 4, false) == plait::ring::id);
  CHECK(pick<automatic>(32 * K, true, 6, false) == plait::tree::id);
  CHECK(pick<automatic>(1024 * K, true, 4, false) == plait::ring::id);
  CHECK(pick_exchange<automatic>(collective_kind::reduce_scatter, 4 * K, 4, false) == plait::direct::id);
}

TEST_CASE("automatic over a network: reduce_scatter stays on the ring, all_gather doubles on 2^k ranks",
          "[automatic]") {
  constexpr std::size_t K = 1024;
  CHECK(pick_exchange<automatic>(collective_kind::reduce_scatter, 4 * K, 4, true) == plait::ring::id);
  CHECK(pick_exchange<automatic>(collective_kind::all_gather, 4 * K, 4, true) == plait::recursive_doubling::id);
  CHECK(pick_exchange<automatic>(collective_kind::all_gather, 64 * K * K, 8, true) == plait::recursive_doubling::id);
  CHECK(pick_exchange<automatic>(collective_kind::all_gather, 4 * K, 2, true) == plait::ring::id);
  CHECK(pick_exchange<automatic>(collective_kind::all_gather, 4 * K, 6, true) == plait::ring::id);
  CHECK(pick_exchange<automatic>(collective_kind::all_gather, 4 * K, 4, false) == plait::ring::id);
}

TEST_CASE("an explicit algorithm is never overridden by the transport", "[automatic]") {
  CHECK(pick<plait::ring>(4096, true, 4, true) == plait::ring::id);
  CHECK(pick<plait::recursive_doubling>(4096, true, 4, true) == plait::recursive_doubling::id);
  CHECK(pick_exchange<plait::direct>(collective_kind::reduce_scatter, 4096, 4, true) == plait::direct::id);
}
