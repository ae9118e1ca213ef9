// lend_choice: whether an all_gather lends its block (the peer copies it from this
// rank's memory, CMA on shm) or sends it through slots, chosen per output size by
// timing both on this host (comm_core::times_lending: a core per rank, 64 KiB up to
// the 8 MiB where the copy slices' rule takes over).
//
// Which one is faster depends on the host, not on the call: with a core per rank,
// 2 ranks, shm, 1 MiB of output, lending took 71 us against the slots' 109 on one
// host type (480 MiB L3) and 57 against 40 on another (32 MiB L3), where the kernel's
// copy runs at about 10 GB/s and a slot crosses between the cores' caches quickly
// (docs/performance.md, "all_gather lends or not, by timing both"). So the first
// `block` calls of an output size lend and the next `block` go through slots, each
// but the first of a block timed from entering the engine to completion, and the
// size then keeps the plan whose fastest call was faster. Slots must win by
// `margin` (lending is the rule without timing).
// Every rank times its own calls and decides for its own sends only: a receiver
// takes a lent slot and a plain one alike, so ranks that decide differently still
// agree on the schedule, but such a mix is slower than either plan (one rank's
// copy through the slot, then the other's read of the lent block), and the margin
// keeps near ties, where two ranks' timings could fall on either side, on the rule.
// Exploring calls are matched across ranks (the n-th call of a size is the same
// call everywhere), so every rank times the same plan at the same call.
//
// PLAIT_DEBUG=info logs each size's choice with the best times.
//
// The table is fixed in size (no allocation on the hot path): a size that maps to
// a slot held by another starts over there. Thread-safety: used under the engine lock.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>

#include <plait/detail/env.hpp>

namespace plait::detail {

enum class lend_plan : std::uint8_t { rule, lend, slots };

class lend_choice {
 public:
  // The calls of a size that choose: each plan in a block of `block` calls, the
  // first of which is not timed (the first call of a size touches fresh pages, and a
  // plan's first call after the other's finds the caches set for the other).
  static constexpr int block = 3;
  static constexpr int explore_calls = 2 * block;
  static constexpr double margin = 0.85;  // slots kept when their best <= margin x lending's best
  static constexpr std::size_t table_size = 16;

  // The plan for the next call of this output size, counted as issued; `timed` is set
  // where its time is wanted (record()). Calls are counted when they are issued, not
  // when they end, so that every rank gives the n-th call the same plan even when
  // calls overlap.
  lend_plan next(std::size_t output_bytes, bool& timed) noexcept {
    entry& e = at(output_bytes);
    const int n = e.issued < explore_calls ? e.issued++ : e.issued;
    timed = n < explore_calls && n % block != 0;
    if (n < explore_calls) return n < block ? lend_plan::lend : lend_plan::slots;
    if (e.decided == lend_plan::rule) {
      e.decided = static_cast<double>(e.best_slots.count()) <= margin * static_cast<double>(e.best_lend.count())
                      ? lend_plan::slots
                      : lend_plan::lend;
      log(log_level::info, "all_gather of ", output_bytes, " B: ", e.decided == lend_plan::slots ? "slots" : "lends",
          " (best call lending ", e.best_lend.count() / 1000.0, " us, through slots ", e.best_slots.count() / 1000.0,
          " us)");
    }
    return e.decided;
  }

  // The time of a call that next() said was timed, under the plan it gave.
  void record(std::size_t output_bytes, lend_plan plan, std::chrono::nanoseconds took) noexcept {
    entry& e = at(output_bytes);
    if (e.decided != lend_plan::rule) return;
    auto& best = plan == lend_plan::slots ? e.best_slots : e.best_lend;
    if (took < best) best = took;
  }

  // The plan this size settled on (lend_plan::rule until it has).
  lend_plan decided(std::size_t output_bytes) noexcept { return at(output_bytes).decided; }

 private:
  struct entry {
    std::size_t bytes = 0;
    int issued = 0;
    std::chrono::nanoseconds best_lend = std::chrono::nanoseconds::max();
    std::chrono::nanoseconds best_slots = std::chrono::nanoseconds::max();
    lend_plan decided = lend_plan::rule;
  };

  entry& at(std::size_t output_bytes) noexcept {
    // Sizes a program uses are mostly powers of two apart, or close to one another:
    // mix the bits so neither crowds one slot.
    const std::uint64_t h = static_cast<std::uint64_t>(output_bytes) * 0x9E3779B97F4A7C15ull;
    entry& e = table_[static_cast<std::size_t>(h >> 60) % table_size];
    if (e.bytes != output_bytes) e = entry{output_bytes};
    return e;
  }

  std::array<entry, table_size> table_{};
};

}  // namespace plait::detail
