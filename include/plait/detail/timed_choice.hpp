// timed_choice: a choice between two plans for a call, made per size by timing both
// on this host, where which one is faster depends on the host, not on the call.
//
// The first calls of a size take the first plan (the rule's own, except for
// broadcast_lend_choice, which times lending first) in a block, the next calls the
// second in a block, and the size then keeps the plan whose fastest call was faster
// (the lending choices count their block through slots at its median call).
// A block is its warm-up calls, not timed, then its timed calls, each timed from
// entering the engine to completion. A block warms up with one call and times 2, and a
// block through slots after lending warms up with as many calls as the FIFO has slots
// (comm_core::slots_warmup_calls: the first call to write each slot finds it out of
// the cache) and times 6, which it counts at their median, not their best: a pause
// between calls (a benchmark's barrier after its warm-up calls) can fall inside the
// block, and the calls after it are not the loop's. Outside the windows in which the
// two cores trade dirty lines slowly they catch the ranks in lock-step and take up to
// 3 times a call of the loop; inside one they are the fast ones, writing slots last
// touched before the pause (2 ranks, 1 MiB broadcast, 32 MiB L3 host type: 88-95 us,
// then 381-477 for every call of the loop, against lending's 99-163)
// (docs/performance.md, "A plan through slots is timed once every slot is warm",
// "Slots timed at the median of their block"). The second must win by the choice's
// margin (near ties stay on the rule). A
// size none of whose calls was timed under both plans (record() was never called for
// one of them) settles on the rule. The two lending choices time a settled size again
// every comm_core::retime_lending_every calls.
// Exploring calls are matched across ranks (the n-th call of a size is the same call
// everywhere), so every rank runs the same plan at the same call.
//
// Four choices use it (comm_core):
// - lend_choice: whether an all_gather lends its block (the peer copies it from this
//   rank's memory, CMA on shm) or sends it through slots (comm_core::times_lending: a
//   core per rank, 32 KiB up to the 8 MiB where the copy slices' rule takes over).
//   With a core per rank, 2 ranks, shm, 1 MiB of output, lending took 71 us against
//   the slots' 109 on one host type (480 MiB L3) and 57 against 40 on another (32 MiB
//   L3), where the kernel's copy runs at about 10 GB/s and a slot crosses between the
//   cores' caches quickly (docs/performance.md, "all_gather lends or not, by timing
//   both"). Every rank times its own calls and decides for its own sends only: a
//   receiver takes a lent slot and a plain one alike, so ranks that decide
//   differently still agree on the schedule, but such a mix is slower than either
//   plan (one rank's copy through the slot, then the other's read of the lent
//   block), and the margin keeps near ties, where two ranks' timings could fall on
//   either side, on the rule.
// - stream_choice: whether a broadcast's slots are written with non-temporal stores
//   (the reader copies them from memory) or plain ones (from the writer's cache)
//   (comm_core::times_streaming: a core per rank, where the transport streams such
//   slots). 2 ranks, shm, 64 KiB: streamed 4.4 against plain 9.2 us per slot on one
//   host type (32 MiB L3), 6.3 against 3.5 on another (480 MiB L3)
//   (docs/performance.md, "Slots written past the cache or not, by timing both").
//   What counts is the reader's time, so only ranks that receive record theirs, and
//   a rank passes its decision to the ranks that write to it (link_set::
//   measured_streamed_slots); the root has nothing to time.
// - broadcast_lend_choice: whether a broadcast lends the root's buffer (the reader
//   copies it from there, CMA on shm; a call of several slices slice by slice) or
//   goes through slots, filled as stream_choice settled (comm_core::
//   times_broadcast_lending: a core per rank, from 16 KiB). It starts once
//   stream_choice has settled for the size, where that times it (one slot). 2 ranks,
//   shm, 480 MiB L3 host type: 256K lending 9.5 against slots 13.9 us, 1M 50 against
//   61 (docs/performance.md, "broadcast lends or not, by timing both"); 32 MiB L3 host
//   type, 64M: slots 3.9 ms and lending 5.6-7.0 while the cores trade dirty lines
//   quickly, slots 15-28 ms while they do not ("A broadcast of several slices lends
//   or not, by timing both"). Timed and passed on as stream_choice is
//   (link_set::measured_lending), with a smaller margin: only the reader decides, so
//   no two ranks can mix plans.
//
// - reduction_stream_choice: whether an all_reduce's or a reduce_scatter's slots are
//   written with non-temporal stores or plain ones (comm_core::
//   times_reduction_streaming: a core per rank, where the transport lets a peer read
//   such slots; one choice per collective). Plain slots first. Both ranks write slots
//   and wait for each other's, so every rank times its own calls and decides for its
//   own writes, as lend_choice does. While the two cores trade dirty lines slowly
//   (2 ranks, shm, the 32 MiB L3 host type, in windows of seconds to minutes) a 1 MiB
//   all_reduce took 810 us with plain slots and 104-110 streamed; outside such a
//   window 57 and 139 (docs/performance.md, "Reductions' slots past the cache, by
//   timing both"). Timed again every comm_core::retime_streaming_every calls.
//
// PLAIT_DEBUG=info logs each size's choice with the best times, and a later timing's
// where it changes the plan (trace: every timing).
//
// The table is fixed in size (no allocation on the hot path): a size that maps to
// a slot held by another starts over there. Thread-safety: used under the engine lock.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <utility>

#include <plait/detail/env.hpp>

namespace plait::detail {

enum class lend_plan : std::uint8_t { rule, lend, slots };
enum class stream_plan : std::uint8_t { rule, stream, plain };

// What a choice is about, for its log lines: "<what> of N B: <plan>".
struct choice_names {
  const char* what;
  const char* first;
  const char* second;
};

template <class Plan, Plan First, Plan Second>
class timed_choice {
 public:
  // The calls of a size that choose: each plan in a block of its warm-up calls, not
  // timed (the first call of a size touches fresh pages, a plan's first call after the
  // other's finds the caches set for the other, and a slot's first write finds it out
  // of the cache), then its timed ones.
  static constexpr int default_warmup = 1;
  static constexpr int default_timed = 2;
  // The lending choices' block through slots, timed at its median (second_median).
  static constexpr int slots_timed = 6;
  // The second plan is kept when its best <= margin x the first's best.
  static constexpr double default_margin = 0.85;
  static constexpr std::size_t table_size = 16;

  // `second_warmup`, `second_timed`: the untimed calls that open the second plan's
  // block (at least 1), and the timed ones after them (at least 1). `retime_every`: a
  // settled size times both plans again after that many more calls (0: never).
  // `second_median`: the second plan counts at the median of its timed calls (the
  // first slots_timed of them), not at its best.
  explicit timed_choice(choice_names names, double margin = default_margin, int second_warmup = default_warmup,
                        int second_timed = default_timed, int retime_every = 0, bool second_median = false) noexcept
      : names_(names),
        margin_(margin),
        second_warmup_(second_warmup < 1 ? 1 : second_warmup),
        second_timed_(second_timed < 1 ? 1 : second_timed),
        retime_every_(retime_every < 0 ? 0 : retime_every),
        second_median_(second_median) {}

  // The calls of each plan's block, and of both.
  static constexpr int first_block() noexcept { return default_warmup + default_timed; }
  int second_block() const noexcept { return second_warmup_ + second_timed_; }
  int explore_calls() const noexcept { return first_block() + second_block(); }

  // Whether the next call of this size explores (it is one of the first
  // explore_calls() of a timing, and not the one that settles).
  bool exploring(std::size_t bytes) noexcept {
    const entry& e = at(bytes);
    return e.issued < explore_calls() || retime_due(e);
  }

  // The plan for the next call of this size, counted as issued; `timed` is set where
  // its time is wanted (record()). Calls are counted when they are issued, not when
  // they end, so that every rank gives the n-th call the same plan even when calls
  // overlap. `settled` is set on the one call at which the size settles.
  //
  // With retime_every, the size is timed again every retime_every calls after it
  // settled, counted alike on every rank, so the ranks start again at the same call: a
  // host's state can change under a long run (docs/performance.md, "A settled size is
  // timed again"). A settled plan is kept until the next settling, which is logged only
  // where it changes the plan.
  Plan next(std::size_t bytes, bool& timed, bool& settled) noexcept {
    entry& e = at(bytes);
    if (retime_due(e)) {
      e.issued = 0;
      e.since_settled = 0;
      e.best = {never, never};
      e.seconds_timed = 0;
      e.settled = false;
      ++e.timings;
    }
    const int explore = explore_calls();
    const int n = e.issued < explore ? e.issued++ : e.issued;
    settled = false;
    if (n < explore) {
      const bool first = n < first_block();
      timed = first ? n >= default_warmup : n - first_block() >= second_warmup_;
      return first ? First : Second;
    }
    timed = false;
    if (!e.settled) {
      e.settled = settled = true;
      const Plan before = e.decided;
      const std::chrono::nanoseconds second = second_median_ ? median_second(e) : e.best[1];
      const bool measured = e.best[0] != never && second != never;
      if (measured)
        e.decided =
            static_cast<double>(second.count()) <= margin_ * static_cast<double>(e.best[0].count()) ? Second : First;
      // A later timing that keeps the plan logs at trace only.
      log(e.timings == 0 || e.decided != before ? log_level::info : log_level::trace, names_.what, " of ", bytes,
          " B: ",
          !measured             ? "the rule (not timed both ways)"
          : e.decided == Second ? names_.second
                                : names_.first,
          " (best call ", names_.first, " ", ms(e.best[0]), " us, ", names_.second, " ", ms(second), " us",
          second_median_ ? " at the median of its calls" : "", e.timings == 0 ? ")" : "; timed again)");
    } else if (retime_every_ > 0) {
      ++e.since_settled;
    }
    return e.decided;
  }
  Plan next(std::size_t bytes, bool& timed) noexcept {
    bool settled = false;
    return next(bytes, timed, settled);
  }

  // The time of a call that next() said was timed, under the plan it gave.
  void record(std::size_t bytes, Plan plan, std::chrono::nanoseconds took) noexcept {
    entry& e = at(bytes);
    if (e.settled || (plan != First && plan != Second)) return;
    log(log_level::trace, names_.what, " of ", bytes, " B: a call ", plan == Second ? names_.second : names_.first,
        " took ", ms(took), " us");
    auto& best = e.best[plan == Second ? 1 : 0];
    if (took < best) best = took;
    if (plan == Second && e.seconds_timed < slots_timed) e.seconds[static_cast<std::size_t>(e.seconds_timed++)] = took;
  }

  // The plan this size settled on (the rule until it has, or where it settled there).
  Plan decided(std::size_t bytes) noexcept { return at(bytes).decided; }

 private:
  static constexpr std::chrono::nanoseconds never = std::chrono::nanoseconds::max();
  static double ms(std::chrono::nanoseconds t) noexcept { return t == never ? -1.0 : t.count() / 1000.0; }

  struct entry {
    std::size_t bytes = 0;
    int issued = 0;
    std::array<std::chrono::nanoseconds, 2> best{never, never};   // First, Second
    std::array<std::chrono::nanoseconds, slots_timed> seconds{};  // the second plan's timed calls
    int seconds_timed = 0;
    Plan decided{};  // value-initialised: the rule
    bool settled = false;
    int since_settled = 0;  // calls that took the settled plan
    int timings = 0;        // timings after the first
  };

  // The median of the second plan's timed calls (of an even count, the mean of the
  // middle two); never where none was timed.
  static std::chrono::nanoseconds median_second(const entry& e) noexcept {
    if (e.seconds_timed == 0) return never;
    // At most slots_timed values: an insertion sort (std::sort's unrolled paths draw
    // GCC 12's -Warray-bounds on an array this small).
    auto t = e.seconds;
    const auto n = static_cast<std::size_t>(e.seconds_timed);
    for (std::size_t i = 1; i < n; ++i)
      for (std::size_t j = i; j > 0 && t[j] < t[j - 1]; --j) std::swap(t[j], t[j - 1]);
    return n % 2 != 0 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
  }

  bool retime_due(const entry& e) const noexcept {
    return e.settled && retime_every_ > 0 && e.since_settled >= retime_every_;
  }

  entry& at(std::size_t bytes) noexcept {
    // Sizes a program uses are mostly powers of two apart, or close to one another:
    // mix the bits so neither crowds one slot.
    const std::uint64_t h = static_cast<std::uint64_t>(bytes) * 0x9E3779B97F4A7C15ull;
    entry& e = table_[static_cast<std::size_t>(h >> 60) % table_size];
    if (e.bytes != bytes) e = entry{bytes};
    return e;
  }

  choice_names names_;
  double margin_;
  int second_warmup_;
  int second_timed_;
  int retime_every_;
  bool second_median_;
  std::array<entry, table_size> table_{};
};

// all_gather: lend the block or send it through slots (rule: lending); the slots'
// block opens with `slots_warmup` untimed calls, then times slots_timed, counted at
// their median.
class lend_choice : public timed_choice<lend_plan, lend_plan::lend, lend_plan::slots> {
 public:
  explicit lend_choice(int slots_warmup = default_warmup, int retime_every = 0) noexcept
      : timed_choice({"all_gather", "lending", "through slots"}, default_margin, slots_warmup, slots_timed,
                     retime_every, true) {}
};

// broadcast: slots written past the cache or not (rule: streamed, where the transport says so).
class stream_choice : public timed_choice<stream_plan, stream_plan::stream, stream_plan::plain> {
 public:
  stream_choice() noexcept : timed_choice({"broadcast", "slots streamed", "plain slots"}) {}
};

// all_reduce, reduce_scatter: plain slots or slots written past the cache (rule:
// plain). `what` names the collective in the log.
class reduction_stream_choice : public timed_choice<stream_plan, stream_plan::plain, stream_plan::stream> {
 public:
  reduction_stream_choice(const char* what, int retime_every) noexcept
      : timed_choice({what, "plain slots", "slots streamed"}, default_margin, default_warmup, default_timed,
                     retime_every) {}
};

// broadcast: the root's buffer lent or slots (rule: slots, where the readers have not
// measured lending faster). Lending is timed first: its calls end only once the reader
// has copied, so the slots' block starts with no slot queued ahead of the reader
// (after stream_choice's calls the root may be up to the FIFO's depth ahead, and a
// reader that finds its slots posted times only its copy); slots are kept only where
// they were faster by the margin.
class broadcast_lend_choice : public timed_choice<lend_plan, lend_plan::lend, lend_plan::slots> {
 public:
  explicit broadcast_lend_choice(int slots_warmup = default_warmup, int retime_every = 0) noexcept
      : timed_choice({"broadcast", "lending", "through slots"}, 0.95, slots_warmup, slots_timed, retime_every, true) {}
};

}  // namespace plait::detail
