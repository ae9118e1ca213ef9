// plait::automatic's choices: over a network transport (tcp, or a hybrid with tcp
// between hosts) all_reduce takes the tree on 3 or more ranks up to 1 MiB (at every
// size when every rank is on one host) and reduce_scatter stays on the ring; over
// memory (shm) the choices are the ones tuned there. Every rank computes the same
// choice from the call, the transport type and what the ranks agreed at start-up.
// Also the other per-call choice: the pipeline slice (plain copies take their own).
#include <plait/plait.hpp>
#include <plait/transport/hybrid.hpp>
#include <plait/transport/shm.hpp>
#include <plait/transport/tcp.hpp>

#include <catch2/catch.hpp>

#include <array>
#include <cstdio>
#include <cstdlib>

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

TEST_CASE("automatic all_reduce over a network on one host takes the tree at every size", "[automatic]") {
  constexpr std::size_t K = 1024;
  for (int n : {3, 4, 8})
    for (std::size_t bytes : {4 * K, 1024 * K, 2048 * K, 128 * K * K}) {
      CAPTURE(n, bytes);
      CHECK(pick<automatic>(bytes, true, n, true, true) == plait::tree::id);
    }
  // Between hosts the ring above 1 MiB, as before; 2 ranks and shm are unchanged.
  CHECK(pick<automatic>(2048 * K, true, 4, true, false) == plait::ring::id);
  CHECK(pick<automatic>(1024 * K, true, 2, true, true) == plait::ring::id);
  CHECK(pick<automatic>(4 * K, true, 2, true, true) == plait::direct::id);
  CHECK(pick<automatic>(1024 * K, true, 4, false, true) == plait::ring::id);
}

TEST_CASE("automatic over a network: reduce_scatter stays on the ring, all_gather doubles on 2^k ranks",
          "[automatic]") {
  constexpr std::size_t K = 1024;
  CHECK(pick_exchange<automatic>(collective_kind::reduce_scatter, 4 * K, 4, true) == plait::ring::id);
  CHECK(pick_exchange<automatic>(collective_kind::all_gather, 4 * K, 4, true) == plait::recursive_doubling::id);
  CHECK(pick_exchange<automatic>(collective_kind::all_gather, 64 * K * K, 8, true) == plait::recursive_doubling::id);
  // With ranks sharing the CPUs they are bound to, direct from 64 MiB of output.
  CHECK(pick_exchange<automatic>(collective_kind::all_gather, 64 * K * K, 4, true, false, true) == plait::direct::id);
  CHECK(pick_exchange<automatic>(collective_kind::all_gather, 64 * K * K - 1, 4, true, false, true) ==
        plait::recursive_doubling::id);
  CHECK(pick_exchange<automatic>(collective_kind::all_gather, 64 * K * K, 4, false, false, true) == plait::ring::id);
  CHECK(pick_exchange<automatic>(collective_kind::all_gather, 4 * K, 2, true) == plait::ring::id);
  CHECK(pick_exchange<automatic>(collective_kind::all_gather, 4 * K, 6, true) == plait::ring::id);
}

TEST_CASE("automatic over memory: all_gather doubles on 2^k ranks below 256 KiB of output", "[automatic]") {
  constexpr std::size_t K = 1024;
  for (int n : {4, 8, 16}) {
    CAPTURE(n);
    CHECK(pick_exchange<automatic>(collective_kind::all_gather, 4 * K, n, false) == plait::recursive_doubling::id);
    CHECK(pick_exchange<automatic>(collective_kind::all_gather, 256 * K - 4 * static_cast<std::size_t>(n), n, false) ==
          plait::recursive_doubling::id);
    CHECK(pick_exchange<automatic>(collective_kind::all_gather, 256 * K, n, false) == plait::ring::id);
  }
  CHECK(pick_exchange<automatic>(collective_kind::all_gather, 4 * K, 2, false) == plait::ring::id);
  CHECK(pick_exchange<automatic>(collective_kind::all_gather, 4 * K, 6, false) == plait::ring::id);
  CHECK(pick_exchange<automatic>(collective_kind::all_gather, 16 * K * K, 4, false) == plait::ring::id);
}

static_assert(plait::transport::shm::traits.shares_copies);
static_assert(!plait::transport::tcp::traits.shares_copies);

TEST_CASE("automatic where every peer reads one staged copy: direct broadcast and large all_gather", "[automatic]") {
  using plait::detail::pick_broadcast;
  constexpr std::size_t K = 1024;
  for (int n : {3, 4, 8}) {
    CAPTURE(n);
    CHECK(pick_broadcast<automatic>(16 * K - 4, n, true) == plait::tree::id);
    CHECK(pick_broadcast<automatic>(16 * K, n, true) == plait::direct::id);
    CHECK(pick_broadcast<automatic>(128 * K * K, n, true) == plait::direct::id);
    // Without shared copies, or on 2 ranks (one peer: nothing to share), tree then ring.
    CHECK(pick_broadcast<automatic>(16 * K, n, false) == plait::tree::id);
    CHECK(pick_broadcast<automatic>(1024 * K, n, false) == plait::ring::id);
    const std::size_t from = n >= 8 ? 256 * K : 1024 * K;
    CHECK(pick_exchange<automatic>(collective_kind::all_gather, from, n, false, true) == plait::direct::id);
    CHECK(pick_exchange<automatic>(collective_kind::all_gather, 128 * K * K, n, false, true) == plait::direct::id);
    CHECK(pick_exchange<automatic>(collective_kind::all_gather, from - 4 * static_cast<std::size_t>(n), n, false,
                                   true) != plait::direct::id);
    CHECK(pick_exchange<automatic>(collective_kind::all_gather, from, n, false, false) == plait::ring::id);
    // reduce_scatter is unchanged: each block goes to one peer.
    CHECK(pick_exchange<automatic>(collective_kind::reduce_scatter, from, n, false, true) == plait::ring::id);
  }
  CHECK(pick_broadcast<automatic>(1024 * K, 2, true) == plait::ring::id);
  CHECK(pick_exchange<automatic>(collective_kind::all_gather, 1024 * K, 2, false, true) == plait::ring::id);
  CHECK(pick_broadcast<plait::tree>(1024 * K, 4, true) == plait::tree::id);
  // With a chain of ranks grouped by CPU (comm_config::chain), the ring at every size.
  CHECK(pick_broadcast<automatic>(4, 4, false, true) == plait::ring::id);
  CHECK(pick_broadcast<automatic>(16 * K - 4, 4, false, true) == plait::ring::id);
  CHECK(pick_broadcast<plait::tree>(4, 4, false, true) == plait::tree::id);
}

TEST_CASE("an explicit algorithm is never overridden by the transport", "[automatic]") {
  CHECK(pick<plait::ring>(4096, true, 4, true) == plait::ring::id);
  CHECK(pick<plait::recursive_doubling>(4096, true, 4, true) == plait::recursive_doubling::id);
  CHECK(pick_exchange<plait::direct>(collective_kind::reduce_scatter, 4096, 4, true) == plait::direct::id);
}

// The last-level cache as sysfs describes it (lscpu's source): where the kernel lists
// this CPU's caches, the largest level's size, a whole number of KiB and at least the
// first level's; 0 only where it lists none.
TEST_CASE("last_level_cache_bytes reads the largest cache level from sysfs", "[automatic]") {
  const std::size_t llc = plait::detail::last_level_cache_bytes();
  std::FILE* f = std::fopen("/sys/devices/system/cpu/cpu0/cache/index0/size", "r");
  if (f == nullptr) {
    CHECK(llc == 0);
    return;
  }
  char first[32] = {};
  REQUIRE(std::fgets(first, sizeof first, f) != nullptr);
  std::fclose(f);
  const std::size_t l1 = std::strtoull(first, nullptr, 10) << 10;  // "32K"
  CAPTURE(llc, first);
  CHECK(llc >= l1);
  CHECK(llc % 1024 == 0);
}

TEST_CASE("broadcast and send/recv take the copy slice, the other collectives the slice", "[automatic]") {
  plait::detail::comm_config cfg;
  cfg.slice_bytes = 4096;
  cfg.copy_slice_bytes = 1 << 20;
  CHECK(cfg.slot_bytes() == (1u << 20));
  plait::detail::comm_core core(0, 2, cfg);
  const auto slice_of = [&](collective_kind kind) {
    plait::detail::call_builder<float, plait::sum> b(core, kind, plait::ring::id, plait::sum{}, 0, 1000, 1, {});
    CHECK(b.slice_elems() == b.c->desc.slice_bytes / sizeof(float));
    CHECK(b.sp(1000).slice_elems == b.slice_elems());
    return b.c->desc.slice_bytes;
  };
  CHECK(slice_of(collective_kind::broadcast) == (1u << 20));
  CHECK(slice_of(collective_kind::point_to_point) == (1u << 20));
  for (auto kind : {collective_kind::all_reduce, collective_kind::all_gather, collective_kind::reduce_scatter,
                    collective_kind::reduce, collective_kind::all_to_all}) {
    CAPTURE(static_cast<int>(kind));
    CHECK(slice_of(kind) == 4096u);
  }
  // Unresolved (0): every call takes the slice, and so do the slots.
  cfg.copy_slice_bytes = 0;
  CHECK(cfg.slice_for(collective_kind::broadcast) == 4096u);
  CHECK(cfg.slot_bytes() == 4096u);
  // A copy slice below the slice: the slots still hold the slice.
  cfg.copy_slice_bytes = 1024;
  CHECK(cfg.slice_for(collective_kind::point_to_point) == 1024u);
  CHECK(cfg.slot_bytes() == 4096u);
}

TEST_CASE("all_gather of 8 MiB up to 64 MiB of output takes the copy slice, over memory only", "[automatic]") {
  plait::detail::comm_config cfg;
  cfg.slice_bytes = 4096;
  cfg.copy_slice_bytes = 1 << 20;
  constexpr std::size_t M = 1024 * 1024;
  for (int ranks : {2, 4}) {
    plait::detail::comm_core core(0, ranks, cfg);
    // A shard of `count` floats: the output holds `ranks` of them.
    const auto slice_of = [&](collective_kind kind, std::size_t output) {
      const std::size_t count = output / sizeof(float) / (kind == collective_kind::all_gather ? ranks : 1);
      plait::detail::call_builder<float, plait::sum> b(core, kind, plait::ring::id, plait::sum{}, 0, count, 1, {});
      return b.c->desc.slice_bytes;
    };
    CAPTURE(ranks);
    CHECK(slice_of(collective_kind::all_gather, 8 * M - 4 * ranks) == 4096u);
    CHECK(slice_of(collective_kind::all_gather, 8 * M) == (1u << 20));
    CHECK(slice_of(collective_kind::all_gather, 32 * M) == (1u << 20));
    CHECK(slice_of(collective_kind::all_gather, 64 * M - 4 * ranks) == (1u << 20));
    CHECK(slice_of(collective_kind::all_gather, 64 * M) == 4096u);
    CHECK(slice_of(collective_kind::all_gather, 128 * M) == 4096u);
    // The other reductions keep the slice at every size.
    CHECK(slice_of(collective_kind::all_reduce, 16 * M) == 4096u);
    CHECK(slice_of(collective_kind::reduce_scatter, 16 * M) == 4096u);
  }
  // Over a network transport an all_gather takes the slice at every size; a broadcast
  // still takes the copy slice.
  cfg.network = true;
  CHECK(cfg.slice_for(collective_kind::all_gather, 8 * M) == 4096u);
  CHECK(cfg.slice_for(collective_kind::all_gather, 32 * M) == 4096u);
  CHECK(cfg.slice_for(collective_kind::broadcast, 32 * M) == (1u << 20));
  // ... or its own slice where set; the others keep theirs, and the slots hold the largest.
  cfg.gather_slice_bytes = 2 << 20;
  CHECK(cfg.slice_for(collective_kind::all_gather, 4096) == (2u << 20));
  CHECK(cfg.slice_for(collective_kind::all_gather, 32 * M) == (2u << 20));
  CHECK(cfg.slice_for(collective_kind::all_reduce, 32 * M) == 4096u);
  CHECK(cfg.slice_for(collective_kind::broadcast, 32 * M) == (1u << 20));
  CHECK(cfg.slot_bytes() == (2u << 20));
  // A slice of its own under 2 MiB of output where set (ranks sharing bound CPUs).
  cfg.gather_small_slice_bytes = 128 << 10;
  CHECK(cfg.slice_for(collective_kind::all_gather, 4096) == (128u << 10));
  CHECK(cfg.slice_for(collective_kind::all_gather, 2 * M - 1) == (128u << 10));
  CHECK(cfg.slice_for(collective_kind::all_gather, 2 * M) == (2u << 20));
  CHECK(cfg.slice_for(collective_kind::all_reduce, 4096) == 4096u);
  CHECK(cfg.slot_bytes() == (2u << 20));
  // Over memory the small slice is not used, and its own slice only from 1 MiB of
  // output up to the copy slices (8 MiB); the slots hold the largest all the same.
  cfg.network = false;
  CHECK(cfg.slice_for(collective_kind::all_gather, 4096) == 4096u);
  CHECK(cfg.slice_for(collective_kind::all_gather, M - 1) == 4096u);
  CHECK(cfg.slice_for(collective_kind::all_gather, M) == (2u << 20));
  CHECK(cfg.slice_for(collective_kind::all_gather, 8 * M - 1) == (2u << 20));
  CHECK(cfg.slice_for(collective_kind::all_gather, 8 * M) == (1u << 20));
  CHECK(cfg.slice_for(collective_kind::all_gather, 64 * M) == 4096u);
  CHECK(cfg.slice_for(collective_kind::all_reduce, 2 * M) == 4096u);
  CHECK(cfg.slot_bytes() == (2u << 20));
  cfg.gather_slice_bytes = 0;
  cfg.gather_small_slice_bytes = 0;
  CHECK(cfg.slice_for(collective_kind::all_gather, 2 * M) == 4096u);
  CHECK(cfg.slot_bytes() == (1u << 20));
}

// lend_choice (comm_core: all_gather with a core per rank): per output size, 3 calls
// lend, the first not timed, then the slots' block: as many untimed calls as the
// FIFO has slots (here 4), then 6 timed; then the faster plan stays, slots only when
// the median of their timed calls took at most 0.85x lending's best call.
TEST_CASE("lend_choice times both plans per size, then keeps the faster", "[automatic]") {
  using plait::detail::lend_choice;
  using plait::detail::lend_plan;
  using ns = std::chrono::nanoseconds;
  const auto explore = [](lend_choice& lc, std::size_t bytes, ns lend_took, ns slots_took) {
    bool timed = false;
    REQUIRE(lc.first_block() == 3);
    REQUIRE(lc.second_block() == 10);
    REQUIRE(lc.explore_calls() == 13);
    for (int i = 0; i < lc.explore_calls(); ++i) {
      const lend_plan p = lc.next(bytes, timed);
      CHECK(p == (i < 3 ? lend_plan::lend : lend_plan::slots));
      CHECK(timed == (i == 1 || i == 2 || i >= 7));
      CHECK(lc.decided(bytes) == lend_plan::rule);
      // A block's first timed call is slower; lending counts at its best call, slots at
      // the median of theirs.
      const ns took = p == lend_plan::slots ? slots_took : lend_took;
      if (timed) lc.record(bytes, p, i == 1 || i == 7 ? took * 2 : took);
    }
    const lend_plan kept = lc.next(bytes, timed);
    CHECK_FALSE(timed);
    CHECK(lc.decided(bytes) == kept);
    for (int i = 0; i < 5; ++i) CHECK(lc.next(bytes, timed) == kept);
    return kept;
  };
  lend_choice lc(4);
  CHECK(explore(lc, 1 << 20, ns(57000), ns(40000)) == lend_plan::slots);
  CHECK(explore(lc, 1 << 18, ns(13700), ns(14500)) == lend_plan::lend);
  CHECK(explore(lc, 1 << 22, ns(100000), ns(86000)) == lend_plan::lend);  // 0.86x: a near tie stays on the rule
  CHECK(explore(lc, 3 << 20, ns(100000), ns(84000)) == lend_plan::slots);
  // Each size keeps its own plan.
  bool timed = true;
  CHECK(lc.next(1 << 20, timed) == lend_plan::slots);
  CHECK(lc.next(1 << 18, timed) == lend_plan::lend);
  CHECK_FALSE(timed);
  // A size that takes another's place in the table starts over, and so does the other.
  std::size_t other = (1 << 20) + 4;
  bool evicted = false;
  for (int k = 0; k < 10000 && !evicted; ++k, other += 4) {
    lc.next(other, timed);
    evicted = lc.decided(1 << 20) == lend_plan::rule;
  }
  REQUIRE(evicted);
  CHECK(lc.next(1 << 20, timed) == lend_plan::lend);
  CHECK_FALSE(timed);
}

// stream_choice (comm_core: broadcast with a core per rank): the same blocks, streamed
// slots first; only the ranks that receive record their times, and the call at which
// a size settles says so once (comm_core then passes it to the writers). A rank that
// timed one plan only (a root, or a reader whose calls were not all timed) settles
// on the rule.
TEST_CASE("stream_choice settles once per size, on the rule where one plan was never timed", "[automatic]") {
  using plait::detail::stream_choice;
  using plait::detail::stream_plan;
  using ns = std::chrono::nanoseconds;
  const auto run = [](stream_choice& sc, std::size_t bytes, bool record_stream, bool record_plain, ns stream_took,
                      ns plain_took) {
    bool timed = false, settled = true;
    REQUIRE(sc.explore_calls() == 6);  // both plans through slots: one untimed call per block
    for (int i = 0; i < sc.explore_calls(); ++i) {
      const stream_plan p = sc.next(bytes, timed, settled);
      CHECK(p == (i < 3 ? stream_plan::stream : stream_plan::plain));
      CHECK(timed == (i % 3 != 0));
      CHECK_FALSE(settled);
      const bool wanted = p == stream_plan::stream ? record_stream : record_plain;
      if (timed && wanted) sc.record(bytes, p, p == stream_plan::stream ? stream_took : plain_took);
    }
    const stream_plan kept = sc.next(bytes, timed, settled);
    CHECK(settled);
    CHECK_FALSE(timed);
    for (int i = 0; i < 3; ++i) {
      CHECK(sc.next(bytes, timed, settled) == kept);
      CHECK_FALSE(settled);
    }
    sc.record(bytes, stream_plan::plain, ns(1));  // after settling, times change nothing
    CHECK(sc.decided(bytes) == kept);
    return kept;
  };
  stream_choice sc;
  // The reader of a 64 KiB broadcast on the 480 MiB host type, and on the 32 MiB one.
  CHECK(run(sc, 1 << 16, true, true, ns(6300), ns(3500)) == stream_plan::plain);
  CHECK(run(sc, 3 << 16, true, true, ns(4400), ns(9200)) == stream_plan::stream);
  CHECK(run(sc, 1 << 17, true, true, ns(10000), ns(9000)) == stream_plan::stream);  // 0.9x: the rule
  // The root: nothing timed.
  CHECK(run(sc, 1 << 15, false, false, ns(0), ns(0)) == stream_plan::rule);
  // One plan timed only.
  CHECK(run(sc, 5 << 12, false, true, ns(0), ns(1000)) == stream_plan::rule);
}

// broadcast_lend_choice (comm_core: a broadcast of one slot with a core per rank, once
// stream_choice has settled): lending first, then slots, which are kept only at 0.95x
// lending's best or less; exploring() holds for exactly the calls before the one that
// settles.
namespace {
// One timing of a broadcast_lend_choice whose slots' block opens with 4 untimed calls
// (then 6 timed):
// every call's plan and whether it is timed, as the blocks say; the calls' times are
// recorded, and the plan kept at the call that settles is returned.
plait::detail::lend_plan time_broadcast_lending(plait::detail::broadcast_lend_choice& bc, std::size_t bytes,
                                                std::chrono::nanoseconds lend_took,
                                                std::chrono::nanoseconds slots_took) {
  using plait::detail::lend_plan;
  bool timed = false, settled = true;
  REQUIRE(bc.explore_calls() == 3 + 4 + 6);
  for (int i = 0; i < bc.explore_calls(); ++i) {
    CHECK(bc.exploring(bytes));
    const lend_plan p = bc.next(bytes, timed, settled);
    CHECK(p == (i < 3 ? lend_plan::lend : lend_plan::slots));
    // One untimed lending call; the slots' block opens with its 4 warm-up calls.
    CHECK(timed == (i == 1 || i == 2 || i >= 7));
    CHECK_FALSE(settled);
    if (timed) bc.record(bytes, p, p == lend_plan::lend ? lend_took : slots_took);
  }
  CHECK_FALSE(bc.exploring(bytes));
  const lend_plan kept = bc.next(bytes, timed, settled);
  CHECK(settled);
  CHECK_FALSE(timed);
  return kept;
}
}  // namespace

TEST_CASE("broadcast_lend_choice times lending first and keeps slots only where they win by 5 %", "[automatic]") {
  using plait::detail::broadcast_lend_choice;
  using plait::detail::lend_plan;
  using ns = std::chrono::nanoseconds;
  const auto run = [](broadcast_lend_choice& bc, std::size_t bytes, ns lend_took, ns slots_took) {
    bool timed = false, settled = true;
    const lend_plan kept = time_broadcast_lending(bc, bytes, lend_took, slots_took);
    CHECK_FALSE(bc.exploring(bytes));
    CHECK(bc.next(bytes, timed, settled) == kept);
    CHECK_FALSE(settled);
    return kept;
  };
  broadcast_lend_choice bc(4);
  // The reader of a 2-rank broadcast on the 480 MiB host type: 256K and 64K lend.
  CHECK(run(bc, 1 << 18, ns(9800), ns(35600)) == lend_plan::lend);
  CHECK(run(bc, 1 << 16, ns(3585), ns(3590)) == lend_plan::lend);
  CHECK(run(bc, 1 << 15, ns(3000), ns(2263)) == lend_plan::slots);
  CHECK(run(bc, 1 << 14, ns(1000), ns(960)) == lend_plan::lend);   // 0.96x: within the margin
  CHECK(run(bc, 1 << 20, ns(1000), ns(940)) == lend_plan::slots);  // 0.94x
  // The root times nothing: the rule, and then the readers' measurement decides.
  bool timed = false, settled = false;
  for (int i = 0; i < bc.explore_calls(); ++i) bc.next(3 << 14, timed, settled);
  CHECK(bc.next(3 << 14, timed, settled) == lend_plan::rule);
  CHECK(settled);
}

// A lending choice times a settled size again after retime_every calls (comm_core:
// retime_lending_every), on every rank at the same call: the blocks start over, the
// plan kept meanwhile is the last one decided, and the new timing's result replaces
// it (settled is set again, so comm_core passes it on). Without retime_every a size
// is timed once.
TEST_CASE("a lending choice times a settled size again after retime_every calls", "[automatic]") {
  using plait::detail::broadcast_lend_choice;
  using plait::detail::lend_plan;
  using ns = std::chrono::nanoseconds;
  constexpr std::size_t bytes = 1 << 20;
  const auto timing = [](broadcast_lend_choice& bc, ns lend_took, ns slots_took) {
    return time_broadcast_lending(bc, bytes, lend_took, slots_took);
  };
  broadcast_lend_choice bc(4, 10);
  // Slots in the cache's good state, then while the cores trade dirty lines slowly.
  CHECK(timing(bc, ns(80000), ns(25000)) == lend_plan::slots);
  bool timed = true, settled = true;
  for (int i = 0; i < 10; ++i) {
    CHECK_FALSE(bc.exploring(bytes));
    CHECK(bc.next(bytes, timed, settled) == lend_plan::slots);
    CHECK_FALSE(timed);
    CHECK_FALSE(settled);
    bc.record(bytes, lend_plan::lend, ns(1));  // settled: ignored
  }
  CHECK(bc.decided(bytes) == lend_plan::slots);
  CHECK(timing(bc, ns(90000), ns(400000)) == lend_plan::lend);
  CHECK(bc.decided(bytes) == lend_plan::lend);
  for (int i = 0; i < 10; ++i) CHECK(bc.next(bytes, timed, settled) == lend_plan::lend);
  CHECK(timing(bc, ns(85000), ns(24000)) == lend_plan::slots);
  // A timing that measures one plan only (the root) keeps the plan it had.
  for (int i = 0; i < 10; ++i) bc.next(bytes, timed, settled);
  for (int i = 0; i < bc.explore_calls(); ++i) bc.next(bytes, timed, settled);
  CHECK(bc.next(bytes, timed, settled) == lend_plan::slots);
  CHECK(settled);

  broadcast_lend_choice once(4);
  CHECK(timing(once, ns(80000), ns(25000)) == lend_plan::slots);
  for (int i = 0; i < 5000; ++i) {
    CHECK_FALSE(once.exploring(bytes));
    CHECK(once.next(bytes, timed, settled) == lend_plan::slots);
    CHECK_FALSE(timed);
  }
}

// The lending choices count the slots' block at the median of its 6 timed calls, not
// at its best: where the first calls after a pause find their slots out of the other
// core's cache and the loop's calls do not (2 ranks, 1 MiB broadcast, 32 MiB L3 host
// type, while the cores trade dirty lines slowly: 88-95 us, then 381-477 per call,
// against lending's best 99), lending is kept; where the calls after a pause are the
// slow ones (up to 3 times the loop's), up to 2 of them do not turn the plan.
TEST_CASE("the lending choices count their slots' block at its median", "[automatic]") {
  using plait::detail::broadcast_lend_choice;
  using plait::detail::lend_choice;
  using plait::detail::lend_plan;
  using ns = std::chrono::nanoseconds;
  // Times the blocks: lending's best `lend_took`, the slots' timed calls `slots` in order.
  const auto timing = [](auto& choice, std::size_t bytes, ns lend_took, const std::array<ns, 6>& slots) {
    bool timed = false, settled = true;
    std::size_t k = 0;
    for (int i = 0; i < choice.explore_calls(); ++i) {
      const lend_plan p = choice.next(bytes, timed, settled);
      if (!timed) continue;
      if (p == lend_plan::lend)
        choice.record(bytes, p, lend_took);
      else
        choice.record(bytes, p, slots.at(k++));
    }
    CHECK(k == slots.size());
    const lend_plan kept = choice.next(bytes, timed, settled);
    CHECK(settled);
    return kept;
  };
  const auto us = [](std::initializer_list<int> v) {
    std::array<ns, 6> a{};
    std::size_t i = 0;
    for (int x : v) a.at(i++) = std::chrono::microseconds(x);
    return a;
  };
  for (int trial = 0; trial < 2; ++trial) {
    broadcast_lend_choice bc(4);
    lend_choice lc(4);
    const std::size_t bytes = trial == 0 ? 1 << 20 : 3 << 19;
    // The window: two fast calls, then the loop's; the best call (88) would keep slots.
    const auto window = us({90, 88, 446, 458, 420, 431});
    CHECK(timing(bc, bytes, std::chrono::microseconds(99), window) == lend_plan::lend);
    CHECK(timing(lc, bytes, std::chrono::microseconds(99), window) == lend_plan::lend);
    // Outside it: two calls after a pause at up to 3 times the loop's 47.
    broadcast_lend_choice bc2(4);
    lend_choice lc2(4);
    const auto pause = us({140, 136, 47, 50, 48, 51});
    CHECK(timing(bc2, bytes, std::chrono::microseconds(99), pause) == lend_plan::slots);
    CHECK(timing(lc2, bytes, std::chrono::microseconds(99), pause) == lend_plan::slots);
    // Near ties: the median (50.5 us) at 0.95x (broadcast) and 0.85x (all_gather) of lending.
    broadcast_lend_choice bc3(4);
    lend_choice lc3(4);
    const auto level = us({20, 50, 51, 50, 51, 300});
    CHECK(timing(bc3, bytes, std::chrono::microseconds(54), level) == lend_plan::slots);
    CHECK(timing(lc3, bytes, std::chrono::microseconds(54), level) == lend_plan::lend);
  }
}

// reduction_stream_choice (comm_core: all_reduce and reduce_scatter with a core per
// rank): plain slots first, then streamed ones, one untimed call opening each block;
// streamed slots are kept only at 0.85x the plain ones' best or less, and a settled size
// is timed again after retime_every calls, so a window in which the cores trade dirty
// lines slowly turns the plan around, and its end turns it back.
TEST_CASE("reduction_stream_choice times plain slots first and times a settled size again", "[automatic]") {
  using plait::detail::reduction_stream_choice;
  using plait::detail::stream_plan;
  using ns = std::chrono::nanoseconds;
  constexpr std::size_t bytes = 1 << 20;
  const auto timing = [](reduction_stream_choice& rc, ns plain_took, ns stream_took) {
    bool timed = false, settled = true;
    REQUIRE(rc.explore_calls() == 6);
    for (int i = 0; i < rc.explore_calls(); ++i) {
      CHECK(rc.exploring(bytes));
      const stream_plan p = rc.next(bytes, timed, settled);
      CHECK(p == (i < 3 ? stream_plan::plain : stream_plan::stream));
      CHECK(timed == (i % 3 != 0));
      CHECK_FALSE(settled);
      if (timed) rc.record(bytes, p, p == stream_plan::plain ? plain_took : stream_took);
    }
    CHECK_FALSE(rc.exploring(bytes));
    const stream_plan kept = rc.next(bytes, timed, settled);
    CHECK(settled);
    CHECK_FALSE(timed);
    return kept;
  };
  reduction_stream_choice rc("all_reduce", 10);
  // 2 ranks, 1 MiB, the 32 MiB L3 host type: outside a slow window, then inside one.
  CHECK(timing(rc, ns(57000), ns(139000)) == stream_plan::plain);
  bool timed = true, settled = true;
  for (int i = 0; i < 10; ++i) {
    CHECK(rc.next(bytes, timed, settled) == stream_plan::plain);
    CHECK_FALSE(timed);
    rc.record(bytes, stream_plan::stream, ns(1));  // settled: ignored
  }
  CHECK(timing(rc, ns(810000), ns(104000)) == stream_plan::stream);
  for (int i = 0; i < 10; ++i) CHECK(rc.next(bytes, timed, settled) == stream_plan::stream);
  CHECK(timing(rc, ns(60000), ns(130000)) == stream_plan::plain);
  for (int i = 0; i < 10; ++i) rc.next(bytes, timed, settled);
  // A near tie (0.9x) stays on plain slots.
  CHECK(timing(rc, ns(100000), ns(90000)) == stream_plan::plain);
  // Sizes are apart: another size starts its own timing.
  CHECK(rc.exploring(bytes << 1));
  CHECK(rc.decided(bytes << 1) == stream_plan::rule);
}
