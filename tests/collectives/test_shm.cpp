// Every collective x algorithm over shared memory (DESIGN.md section 8).
#include <plait/transport/shm.hpp>

#include "collectives/matrix.hpp"

using plait::transport::shm;
using namespace plait::testing;

TEST_CASE("every collective x algorithm over shm equals the reference", "[collectives][shm]") {
  const int ranks = GENERATE(1, 2, 3, 4, 5, 8);
  std::vector<std::size_t> counts = {0, 1, 13, 4099};
  if (ranks != 8) counts.push_back((1 << 20) + 3);
  CAPTURE(ranks);
  check_cases<shm>(ranks, [=] { return representative_cases<shm>(ranks, counts); });
}

TEST_CASE("every collective over shm equals the reference with every all_gather output copy streamed",
          "[collectives][shm]") {
  const int ranks = GENERATE(2, 3, 4);
  CAPTURE(ranks);
  check_streamed<shm>(ranks);
}

// all_gather's output here is 32, 48 and 64 MiB: 2 ranks lend it in copy slices, 3
// ranks (on 2 cores: more ranks than cores) send it through slots in copy slices, and 4 take
// the slice (executor::gather_in_copy_slices).
TEST_CASE("16 MiB per rank of float sum over shm equals the reference", "[collectives][shm][large]") {
  const int ranks = GENERATE(2, 3, 4);
  CAPTURE(ranks);
  const std::size_t count = (16u << 20) / sizeof(float);
  rank_options large;
  large.slice_bytes = "128K";
  large.copy_slice_bytes = "";  // the default: 1 MiB slices for broadcast
  check_cases<shm>(
      ranks,
      [=] {
        case_list<shm> cs;
        add_all_reduce<shm, float, plait::sum>(cs, ranks, count);
        add_others<shm, float, plait::sum>(cs, ranks, count);
        return cs;
      },
      large);
}

TEST_CASE("over shm broadcast and send/recv go in slices of at least 1 MiB unless set", "[collectives][shm]") {
  using v = std::vector<std::uint64_t>;  // per rank: slice, copy slice, depth, window, all_gather at 2M, at 1M
  CHECK(agreed_slices<shm>("4K", "") == v{4096, 1 << 20, 4, 4, 4096, 4096, 4096, 1 << 20, 4, 4, 4096, 4096});
  CHECK(agreed_slices<shm>("2M", "") ==
        v{2 << 20, 2 << 20, 4, 4, 2 << 20, 2 << 20, 2 << 20, 2 << 20, 4, 4, 2 << 20, 2 << 20});
  CHECK(agreed_slices<shm>("4K", "64K") == v{4096, 65536, 4, 4, 4096, 4096, 4096, 65536, 4, 4, 4096, 4096});
  // Unset: memory keeps the default slice, and an all_gather of 1 to 8 MiB of output
  // takes 512 KiB slices with 2 ranks on a core each.
  const std::uint64_t at_1m = plait::detail::more_ranks_than_cores(2) ? 256 << 10 : 512 << 10;
  CHECK(agreed_slices<shm>("", "") ==
        v{256 << 10, 1 << 20, 4, 4, 256 << 10, at_1m, 256 << 10, 1 << 20, 4, 4, 256 << 10, at_1m});
}

// What a 2-rank float all_gather of `count` per rank gives, made when first asked for.
auto gathered(std::size_t count) {
  return lazily([count] {
    std::vector<float> f;
    for (int q = 0; q < 2; ++q) {
      auto s = exact_pattern<float, plait::sum>(q, count);
      f.insert(f.end(), s.begin(), s.end());
    }
    return to_blob(f);
  });
}

// With the slices unset, 2 ranks on a core each gather 1 to 8 MiB of output in 512 KiB
// slices (comm_config::memory_gather_slice_two_ranks): outputs at and either side of
// both edges, with odd tails, every call exact through the lending timing (15 calls
// of a size) and after it.
TEST_CASE("2-rank all_gather over shm of 1 to 8 MiB of output is exact in its own slices", "[collectives][shm]") {
  rank_options defaults;
  defaults.slice_bytes = "";
  defaults.copy_slice_bytes = "";
  check_cases<shm>(
      2,
      [] {
        case_list<shm> cs;
        constexpr std::size_t per_mib = (std::size_t{1} << 20) / sizeof(float) / 2;  // per rank, 1 MiB of output
        for (std::size_t count : {per_mib - 1, per_mib, per_mib + 1, 3 * per_mib + 1, 8 * per_mib - 1, 8 * per_mib}) {
          auto full = gathered(count);
          for (int call = 0; call < 16; ++call)
            cs.push_back({"all_gather count=" + std::to_string(count) + " call " + std::to_string(call),
                          [count, call](plait::communicator<shm>& c) {
                            const auto shard = exact_pattern<float, plait::sum>(c.rank(), count);
                            std::vector<float> out(2 * count, static_cast<float>(-call));
                            plait::all_gather(c, std::span<const float>(shard), std::span<float>(out));
                            return to_blob(out);
                          },
                          [full](int) { return full(); }, &diff_as<float>});
        }
        return cs;
      },
      defaults);
}

// all_gather with a core per rank times lending against slots for each output size
// (lend_choice: 3 calls lending, then 10 through slots, the first 4 of them warming
// the FIFO's slots, then the faster plan): every one of those calls, and the ones
// after, must be exact, each into a fresh output.
TEST_CASE("2-rank all_gather over shm is exact while it times lending against slots", "[collectives][shm]") {
  check_cases<shm>(2, [] {
    case_list<shm> cs;
    // 16K blocks (the smallest that lend) and 32K + 4 bytes, then 128K and 512K + 4.
    for (std::size_t count : {std::size_t{4096}, std::size_t{8193}, std::size_t{32768}, std::size_t{131072} + 1}) {
      auto full = gathered(count);
      for (int call = 0; call < 15; ++call)
        cs.push_back({"all_gather count=" + std::to_string(count) + " call " + std::to_string(call),
                      [count](plait::communicator<shm>& c) {
                        const auto shard = exact_pattern<float, plait::sum>(c.rank(), count);
                        std::vector<float> out(2 * count, -1.0f);
                        plait::all_gather(c, std::span<const float>(shard), std::span<float>(out));
                        return to_blob(out);
                      },
                      [full](int) { return full(); }, &diff_as<float>});
    }
    // Past the second timing of a size (comm_core::retime_lending_every calls after
    // the first settled): every call exact, with data that changes from call to call.
    constexpr int calls = 1030;
    constexpr std::size_t count = 8193;
    cs.push_back(
        {"all_gather count=8193, " + std::to_string(calls) + " calls through a second timing",
         [](plait::communicator<shm>& c) {
           std::vector<float> wrong;  // the calls whose output was not exact
           std::vector<float> out(2 * count);
           for (int call = 0; call < calls; ++call) {
             const int k = call % 5;
             const auto shard = exact_pattern<float, plait::sum>(c.rank() + 2 * k, count);
             std::fill(out.begin(), out.end(), -1.0f);
             plait::all_gather(c, std::span<const float>(shard), std::span<float>(out));
             for (int q = 0; q < 2; ++q) {
               const auto want = exact_pattern<float, plait::sum>(q + 2 * k, count);
               if (!std::equal(want.begin(), want.end(), out.begin() + q * static_cast<std::ptrdiff_t>(count))) {
                 wrong.push_back(static_cast<float>(call));
                 break;
               }
             }
           }
           return to_blob(wrong);
         },
         [](int) { return to_blob(std::vector<float>{}); }, &diff_as<float>});
    return cs;
  });
}

// With a core per rank, broadcast (16 KiB to 256 KiB per slot; streamed or plain, as
// the reader timed both) and all_gather (64 KiB to 256 KiB) fill their slots with
// non-temporal stores (executor::streams_slots): every size in and at the edges of
// that range, with odd tails and with buffers 4 bytes off their allocation's
// alignment, and every call while a broadcast size times both, must be exact.
TEST_CASE("2-rank broadcast and all_gather over shm are exact where slots are written past the cache",
          "[collectives][shm]") {
  rank_options defaults;  // the default slices (256 KiB; broadcast 1 MiB): slots in that range
  defaults.slice_bytes = "256K";
  defaults.copy_slice_bytes = "";
  check_cases<shm>(
      2,
      [] {
        case_list<shm> cs;
        for (std::size_t count :
             {std::size_t{4095}, std::size_t{4099}, std::size_t{16387}, std::size_t{65535}, std::size_t{65536}})
          add_others<shm, float, plait::sum>(cs, 2, count);
        // 22 calls of a size: where slots may stream, the first 3 stream and the next 3
        // are plain (stream_choice); then 3 lend and 10 go through slots
        // (broadcast_lend_choice), then what the reader found faster. 1 MiB (one slot
        // of the broadcast's 1 MiB slice) only times lending. The root changes its
        // buffer every call.
        for (std::size_t count : {std::size_t{4099}, std::size_t{16384}, std::size_t{40001}, std::size_t{262144}})
          for (int call = 0; call < 22; ++call)
            cs.push_back({"broadcast count=" + std::to_string(count) + " call " + std::to_string(call),
                          [count, call](plait::communicator<shm>& c) {
                            std::vector<float> buf(count, -1.0f);
                            if (c.rank() == 0) buf = exact_pattern<float, plait::sum>(call, count);
                            plait::broadcast(c, std::span<float>(buf), 0);
                            return to_blob(buf);
                          },
                          [count, call](int) { return to_blob(exact_pattern<float, plait::sum>(call, count)); },
                          &diff_as<float>});
        for (std::size_t count : {std::size_t{16387}, std::size_t{40001}}) {
          cs.push_back({"broadcast off alignment count=" + std::to_string(count),
                        [count](plait::communicator<shm>& c) {
                          std::vector<float> buf(count + 1, -1.0f);
                          if (c.rank() == 0) {
                            const auto p = exact_pattern<float, plait::sum>(0, count);
                            std::copy(p.begin(), p.end(), buf.begin() + 1);
                          }
                          plait::broadcast(c, std::span<float>(buf.data() + 1, count), 0);
                          return to_blob(std::vector<float>(buf.begin() + 1, buf.end()));
                        },
                        [count](int) { return to_blob(exact_pattern<float, plait::sum>(0, count)); }, &diff_as<float>});
          auto full = gathered(count);
          // 15 calls: the first 3 lend, the next 10 go through slots (lend_choice), then the faster.
          for (int call = 0; call < 15; ++call)
            cs.push_back({"all_gather off alignment count=" + std::to_string(count) + " call " + std::to_string(call),
                          [count](plait::communicator<shm>& c) {
                            const auto s = exact_pattern<float, plait::sum>(c.rank(), count);
                            std::vector<float> shard(count + 1), out(2 * count + 1, -1.0f);
                            std::copy(s.begin(), s.end(), shard.begin() + 1);
                            plait::all_gather(c, std::span<const float>(shard.data() + 1, count),
                                              std::span<float>(out.data() + 1, 2 * count));
                            return to_blob(std::vector<float>(out.begin() + 1, out.end()));
                          },
                          [full](int) { return full(); }, &diff_as<float>});
        }
        return cs;
      },
      defaults);
}

// A broadcast of several slices (the broadcast slice is 1 MiB), with a core per rank:
// the reader times lending (3 calls, each slice copied from the root's buffer) against
// slots (10 calls), then keeps the faster (broadcast_lend_choice), and through slots
// its output is written past the cache (PLAIT_STREAM_BYTES=1M here; by default from
// half the last-level cache). Every call exact, with odd tails and an output 4 bytes
// off its allocation's alignment, while the root changes its buffer every call.
TEST_CASE("2-rank broadcast of several slices over shm is exact through lending, slots and its output past the cache",
          "[collectives][shm]") {
  rank_options opt;
  opt.slice_bytes = "256K";
  opt.copy_slice_bytes = "";
  opt.stream_bytes = "1M";
  check_cases<shm>(
      2,
      [] {
        case_list<shm> cs;
        for (std::size_t count : {(std::size_t{1} << 18) + 3, (std::size_t{3} << 18) + 1})
          for (int call = 0; call < 15; ++call)
            cs.push_back({"broadcast count=" + std::to_string(count) + " call " + std::to_string(call),
                          [count, call](plait::communicator<shm>& c) {
                            std::vector<float> buf(count + 1, -1.0f);
                            if (c.rank() == 0) {
                              const auto p = exact_pattern<float, plait::sum>(call, count);
                              std::copy(p.begin(), p.end(), buf.begin() + 1);
                            }
                            plait::broadcast(c, std::span<float>(buf.data() + 1, count), 0);
                            return to_blob(std::vector<float>(buf.begin() + 1, buf.end()));
                          },
                          [count, call](int) { return to_blob(exact_pattern<float, plait::sum>(call, count)); },
                          &diff_as<float>});
        return cs;
      },
      opt);
}

// all_reduce and reduce_scatter with a core per rank, from 16 KiB: each size's first 3
// calls write plain slots, the next 3 write them past the cache (reduction_stream_choice),
// then the faster of the two. 12 calls of each size, each with inputs of its own (so a
// slot left from the call before is caught), rotating through the algorithms, in place
// and out of place, with odd tails; avg divides the last reduction before it is copied
// into the slot. Every call exact.
TEST_CASE("2-rank all_reduce and reduce_scatter over shm are exact with their slots written past the cache or not",
          "[collectives][shm]") {
  rank_options opt;
  opt.slice_bytes = "256K";
  opt.copy_slice_bytes = "";
  check_cases<shm>(
      2,
      [] {
        case_list<shm> cs;
        for (std::size_t count : {std::size_t{4099}, std::size_t{65537}, (std::size_t{1} << 18) + 3})
          for (int call = 0; call < 12; ++call) {
            const std::size_t first = static_cast<std::size_t>(call) * 7;
            const std::string at = " count=" + std::to_string(count) + " call " + std::to_string(call);
            cs.push_back(
                {"all_reduce<sum>" + at,
                 [count, call, first](plait::communicator<shm>& c) {
                   auto buf = exact_pattern<float, plait::sum>(c.rank(), count, first);
                   std::vector<float> out(count, -1.0f);
                   switch (call % 4) {
                     case 0:
                       plait::all_reduce<plait::ring>(c, std::span<const float>(buf), std::span<float>(out),
                                                      plait::sum{});
                       break;
                     case 1:
                       plait::all_reduce<plait::direct>(c, std::span<const float>(buf), std::span<float>(out),
                                                        plait::sum{});
                       break;
                     case 2:
                       plait::all_reduce<plait::tree>(c, std::span<float>(buf), plait::sum{}), out = buf;
                       break;
                     default:
                       plait::all_reduce(c, std::span<float>(buf), plait::sum{}), out = buf;
                       break;
                   }
                   return to_blob(out);
                 },
                 [count, first](int) { return to_blob(reference_all_reduce<float, plait::sum>(2, count, {}, first)); },
                 &diff_as<float>});
            cs.push_back(
                {"all_reduce<avg> ring" + at,
                 [count, first](plait::communicator<shm>& c) {
                   auto buf = exact_pattern<float, plait::avg>(c.rank(), count, first);
                   plait::all_reduce<plait::ring>(c, std::span<float>(buf), plait::avg{});
                   return to_blob(buf);
                 },
                 [count, first](int) { return to_blob(reference_all_reduce<float, plait::avg>(2, count, {}, first)); },
                 &diff_as<float>});
            cs.push_back({"reduce_scatter<sum>" + at,
                          [count, call, first](plait::communicator<shm>& c) {
                            const auto full = exact_pattern<float, plait::sum>(c.rank(), 2 * count, first);
                            std::vector<float> shard(count, -1.0f);
                            if (call % 2 == 0)
                              plait::reduce_scatter<plait::ring>(c, std::span<const float>(full),
                                                                 std::span<float>(shard), plait::sum{});
                            else
                              plait::reduce_scatter(c, std::span<const float>(full), std::span<float>(shard),
                                                    plait::sum{});
                            return to_blob(shard);
                          },
                          [count, first](int r) {
                            return to_blob(reference_all_reduce<float, plait::sum>(
                                2, count, {}, first + static_cast<std::size_t>(r) * count));
                          },
                          &diff_as<float>});
          }
        return cs;
      },
      opt);
}

namespace {

// 4 ranks over shm, bound (where `bound`) round robin to the first one or two CPUs
// this test may use, as plaitrun binds them: per rank, the cycle its ring's
// reductions agreed on (comm_config::cpu_ring), the broadcast chain (empty over
// shm), then the number of all_reduce and reduce_scatter calls, by the ring and by
// `automatic`, below and above the sizes that take the cycle, that went wrong.
std::vector<std::vector<int>> cycles_over_shm(bool bound, const std::string& chain_env) {
  rank_options opt;
  opt.slice_bytes = "";  // the defaults, as a user gets them
  opt.copy_slice_bytes = "";
  opt.chain = chain_env;
  if (bound) opt.cpu = round_robin_on_two_cpus();
  constexpr int n = 4;
  auto results = run_ranks<shm>(
      n,
      [](plait::communicator<shm>& c) {
        const auto& cfg = c.core().config();
        std::vector<int> v = cfg.cpu_ring;
        v.push_back(static_cast<int>(cfg.chain.size()));
        int wrong = 0;
        // 64 KiB (the ring; recursive doubling is below it), 1 MiB + 12 B (the cycle)
        // and 2 MiB + 12 B (rank order) of all_reduce.
        for (const std::size_t count : {std::size_t{16384}, std::size_t{262147}, std::size_t{524291}}) {
          const auto want = reference_all_reduce<float, plait::sum>(c.size(), count);
          const auto in = exact_pattern<float>(c.rank(), count);
          std::vector<float> ring(count), any(count);
          plait::all_reduce<plait::ring>(c, std::span<const float>(in), std::span<float>(ring), plait::sum{});
          plait::all_reduce(c, std::span<const float>(in), std::span<float>(any), plait::sum{});
          wrong += (ring != want) + (any != want);
        }
        // reduce_scatter of 256 KiB + 48 B (the cycle) and 512 KiB + 48 B (rank order).
        for (const std::size_t shard : {std::size_t{16387}, std::size_t{32771}}) {
          const auto in = exact_pattern<float>(c.rank(), shard * static_cast<std::size_t>(c.size()));
          std::vector<float> want(shard, 0.0f), ring(shard), any(shard);
          for (int q = 0; q < c.size(); ++q) {
            const auto theirs = exact_pattern<float>(q, shard * static_cast<std::size_t>(c.size()));
            for (std::size_t i = 0; i < shard; ++i) want[i] += theirs[static_cast<std::size_t>(c.rank()) * shard + i];
          }
          plait::reduce_scatter<plait::ring>(c, std::span<const float>(in), std::span<float>(ring), plait::sum{});
          plait::reduce_scatter(c, std::span<const float>(in), std::span<float>(any), plait::sum{});
          wrong += (ring != want) + (any != want);
        }
        v.push_back(wrong);
        return std::vector<blob>{to_blob(v)};
      },
      opt);
  return first_blobs_as_ints(results);
}

}  // namespace

TEST_CASE("over shm the ring's reductions go round the ranks grouped by CPU where they share CPUs",
          "[collectives][shm][chain]") {
  using v = std::vector<int>;
  const bool two_cpus = cpus_this_test_may_use() >= 2;
  // Bound round robin to two CPUs: the cycle 0-2-1-3, then an empty broadcast chain
  // and no wrong result. On one CPU all four share it and the cycle is rank order.
  const v grouped = two_cpus ? v{0, 2, 1, 3, 0, 0} : v{0, 1, 2, 3, 0, 0};
  CHECK(cycles_over_shm(true, "") == std::vector<v>(4, grouped));
  // None where asked for rank order, or where the ranks are not bound (unless this
  // test itself is, to one CPU).
  CHECK(cycles_over_shm(true, "ranks") == std::vector<v>(4, v{0, 0}));
  CHECK(cycles_over_shm(false, "") == std::vector<v>(4, two_cpus ? v{0, 0} : grouped));
}
