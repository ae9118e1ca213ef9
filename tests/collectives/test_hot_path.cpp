// No allocation and no page fault on the hot path (issue 4, DESIGN.md section 8):
// after a few warm-up calls, a collective of a size seen before allocates nothing
// and touches no fresh page, in any thread of the rank (the transport's progress
// thread included). Every rank counts heap allocations (this executable replaces
// the global operator new) and minor page faults (getrusage) over the timed calls
// of each collective and size, through plait-bench's own timing loop
// (bench::time_calls), and the parent asserts zero for each.
//
// Allocations are counted only while a rank times its calls, so the harness and the
// warm-up may allocate freely. Faults are counted for the whole process, which is
// what plait-bench prints.
#include <atomic>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <plait/transport/shm.hpp>
#include <plait/transport/tcp.hpp>

#include "../../bench/common/bench_report.hpp"
#include "support/ranks.hpp"

namespace {

std::atomic<bool> counting{false};
std::atomic<long> allocations{0};

void* allocate(std::size_t n, std::size_t align) {
  if (counting.load(std::memory_order_relaxed)) allocations.fetch_add(1, std::memory_order_relaxed);
  if (n == 0) n = 1;
  void* p =
      align <= alignof(std::max_align_t) ? std::malloc(n) : std::aligned_alloc(align, (n + align - 1) / align * align);
  return p;
}

// Out of line: inlined into the replaced operator delete, a plain free() draws a
// false -Wmismatched-new-delete from GCC 12.
[[gnu::noinline]] void release(void* p) noexcept { std::free(p); }

}  // namespace

void* operator new(std::size_t n) {
  if (void* p = allocate(n, 0)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  if (void* p = allocate(n, 0)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, std::align_val_t a) {
  if (void* p = allocate(n, static_cast<std::size_t>(a))) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n, std::align_val_t a) {
  if (void* p = allocate(n, static_cast<std::size_t>(a))) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return allocate(n, 0); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return allocate(n, 0); }
void operator delete(void* p) noexcept { release(p); }
void operator delete[](void* p) noexcept { release(p); }
void operator delete(void* p, std::size_t) noexcept { release(p); }
void operator delete[](void* p, std::size_t) noexcept { release(p); }
void operator delete(void* p, std::align_val_t) noexcept { release(p); }
void operator delete[](void* p, std::align_val_t) noexcept { release(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { release(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { release(p); }

namespace {

using namespace plait::testing;

const std::vector<std::string> collectives = {"all_reduce", "all_gather", "reduce_scatter", "broadcast"};
const std::vector<std::size_t> sizes = {4096, 1 << 20, 4 << 20};  // bytes, as plait-bench's -b
constexpr int warmup = 3;                                         // plait-bench's and bench/compare's -w
constexpr int timed = 20;

// One collective of `bytes` (the largest buffer, as plait-bench counts it).
template <class Tr>
void once(plait::communicator<Tr>& comm, const std::string& what, std::vector<float>& in, std::vector<float>& out,
          std::size_t bytes) {
  const std::size_t count = bytes / sizeof(float);
  const std::size_t block = count / static_cast<std::size_t>(comm.size());
  if (what == "all_reduce")
    plait::all_reduce(comm, std::span<const float>(in.data(), count), std::span<float>(out.data(), count),
                      plait::sum{});
  else if (what == "all_gather")
    plait::all_gather(comm, std::span<const float>(in.data(), block),
                      std::span<float>(out.data(), block * static_cast<std::size_t>(comm.size())));
  else if (what == "reduce_scatter")
    plait::reduce_scatter(comm, std::span<const float>(in.data(), block * static_cast<std::size_t>(comm.size())),
                          std::span<float>(out.data(), block), plait::sum{});
  else
    plait::broadcast(comm, std::span<float>(out.data(), count), 0);
}

// Per collective and size, in that order: {allocations, minor faults} over the timed calls.
template <class Tr>
std::vector<blob> measure(plait::communicator<Tr>& comm) {
  const std::size_t largest = sizes.back() / sizeof(float);
  std::vector<float> in(largest, 1.0f), out(largest, 0.0f);  // touched here, kept for every call
  std::vector<blob> results;
  for (const auto& what : collectives)
    for (std::size_t bytes : sizes) {
      // plait-bench's own loop: the faults are what it prints; allocations are
      // counted from the barrier that starts the timed calls.
      const bench::timed_calls t = bench::time_calls(
          warmup, timed, [&] { once(comm, what, in, out, bytes); },
          [&] {
            plait::barrier(comm);
            allocations.store(0);
            counting.store(true);
          });
      counting.store(false);
      const std::vector<long> counts = {allocations.load(), t.faults};
      results.push_back(to_blob(counts));
      // No rank goes on (or, after the last size, closes its links: a peer's closing
      // frame is parsed, and described, inside whatever call is running) while another
      // still counts.
      plait::barrier(comm);
    }
  return results;
}

template <class Tr>
void check(int ranks) {
  rank_options opt;
  opt.slice_bytes = "256K";   // the defaults, as plait-bench runs
  opt.copy_slice_bytes = "";  // the transport's default
  auto results = run_ranks<Tr>(
      ranks, [](plait::communicator<Tr>& comm) { return measure(comm); }, opt);
  for (int r = 0; r < ranks; ++r) {
    const rank_result& res = results[static_cast<std::size_t>(r)];
    INFO("rank " << r << ": " << res.error);
    REQUIRE(res.exit_status == 0);
    REQUIRE(res.blobs.size() == collectives.size() * sizes.size());
    std::size_t k = 0;
    for (const auto& what : collectives)
      for (std::size_t bytes : sizes) {
        const std::vector<long> counts = from_blob<long>(res.blobs[k++]);
        INFO(what << " of " << bytes << " bytes on " << ranks << " ranks, rank " << r << ", over " << timed
                  << " calls after " << warmup << " warm-up calls");
        CHECK(counts.at(0) == 0);  // allocations
        CHECK(counts.at(1) == 0);  // minor page faults
      }
  }
}

}  // namespace

TEST_CASE("no allocation and no page fault after warm-up, shm", "[hot_path][shm]") {
  const int ranks = GENERATE(2, 4);
  CAPTURE(ranks);
  check<plait::transport::shm>(ranks);
}

TEST_CASE("no allocation and no page fault after warm-up, tcp", "[hot_path][tcp]") {
  const int ranks = GENERATE(2, 4);
  CAPTURE(ranks);
  check<plait::transport::tcp>(ranks);
}
