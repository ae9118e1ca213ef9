// The collective test matrix (DESIGN.md section 8): the same list of cases is built
// in every rank (which runs them) and in the parent (which checks them), so case k
// of a rank's results is compared with case k's reference for that rank.
#pragma once

#include <sched.h>

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "support/ranks.hpp"
#include "support/reference.hpp"

namespace plait::testing {

template <class Transport>
struct test_case {
  std::string name;
  std::function<blob(communicator<Transport>&)> run;
  std::function<blob(int rank)> expect;
  std::string (*diff)(const blob& want, const blob& got, int rank, const std::string& what) = nullptr;
};

template <class T>
std::string diff_as(const blob& want, const blob& got, int rank, const std::string& what) {
  return compare(from_blob<T>(want), from_blob<T>(got), rank, what);
}

template <class Transport>
using case_list = std::vector<test_case<Transport>>;

// Computes a value once, on first use (references are only needed in the parent).
template <class F>
auto lazily(F f) {
  using R = decltype(f());
  auto cell = std::make_shared<std::shared_ptr<R>>();
  return [cell, f]() -> const R& {
    if (!*cell) *cell = std::make_shared<R>(f());
    return **cell;
  };
}

template <class T, class Op>
std::string label(const char* what, int n, std::size_t count) {
  return std::string(what) + "<" + dtype_name(dtype_of<T>) + ", " + op_name_v<Op> + "> ranks=" + std::to_string(n) +
         " count=" + std::to_string(count);
}

// all_reduce in every algorithm, in place and out of place.
template <class Tr, class T, class Op>
void add_all_reduce(case_list<Tr>& cs, int n, std::size_t count) {
  const std::size_t first = cs.size();
  auto ref = lazily([=] { return to_blob(reference_all_reduce<T, Op>(n, count)); });
  auto expect = [ref](int) { return ref(); };
  auto out_of_place = [count](auto algo) {
    return [count](communicator<Tr>& c) {
      using A = decltype(algo);
      const auto in = exact_pattern<T, Op>(c.rank(), count);
      std::vector<T> out(count);
      all_reduce<A>(c, std::span<const T>(in), std::span<T>(out), Op{});
      return to_blob(out);
    };
  };
  auto in_place = [count](auto algo) {
    return [count](communicator<Tr>& c) {
      using A = decltype(algo);
      auto buf = exact_pattern<T, Op>(c.rank(), count);
      all_reduce<A>(c, std::span<T>(buf), Op{});
      return to_blob(buf);
    };
  };
  cs.push_back({label<T, Op>("all_reduce<ring> out of place", n, count), out_of_place(ring{}), expect});
  cs.push_back({label<T, Op>("all_reduce<ring> in place", n, count), in_place(ring{}), expect});
  cs.push_back({label<T, Op>("all_reduce<tree> out of place", n, count), out_of_place(tree{}), expect});
  cs.push_back({label<T, Op>("all_reduce<tree> in place", n, count), in_place(tree{}), expect});
  if (n <= direct::max_all_reduce_ranks) {  // one exchange: 2 or 3 ranks (more is invalid_argument)
    cs.push_back({label<T, Op>("all_reduce<direct> out of place", n, count), out_of_place(direct{}), expect});
    cs.push_back({label<T, Op>("all_reduce<direct> in place", n, count), in_place(direct{}), expect});
  }
  if (recursive_doubling::supports(n)) {  // power-of-two ranks (others are invalid_argument)
    cs.push_back({label<T, Op>("all_reduce<recursive_doubling> out of place", n, count),
                  out_of_place(recursive_doubling{}), expect});
    cs.push_back(
        {label<T, Op>("all_reduce<recursive_doubling> in place", n, count), in_place(recursive_doubling{}), expect});
  }
  cs.push_back({label<T, Op>("all_reduce<automatic> in place", n, count), in_place(automatic{}), expect});
  cs.push_back({label<T, Op>("all_reduce_async<ring>", n, count),
                [count](communicator<Tr>& c) {
                  const auto in = exact_pattern<T, Op>(c.rank(), count);
                  std::vector<T> out(count);
                  request r = all_reduce_async<ring>(c, std::span<const T>(in), std::span<T>(out), Op{});
                  r.wait();
                  return to_blob(out);
                },
                expect});
  for (std::size_t k = first; k < cs.size(); ++k) cs[k].diff = &diff_as<T>;
}

// Every other collective, with every algorithm that has it.
template <class Tr, class T, class Op>
void add_others(case_list<Tr>& cs, int n, std::size_t count) {
  const std::size_t first = cs.size();
  const auto un = static_cast<std::size_t>(n);
  auto gather_ref = lazily([=] {
    std::vector<T> full;
    for (int q = 0; q < n; ++q) {
      auto s = exact_pattern<T, Op>(q, count);
      full.insert(full.end(), s.begin(), s.end());
    }
    return to_blob(full);
  });
  auto gather = [count, un](auto algo) {
    return [count, un](communicator<Tr>& c) {
      using A = decltype(algo);
      const auto shard = exact_pattern<T, Op>(c.rank(), count);
      std::vector<T> full(count * un);
      all_gather<A>(c, std::span<const T>(shard), std::span<T>(full));
      return to_blob(full);
    };
  };
  auto scatter = [count, un](auto algo) {
    return [count, un](communicator<Tr>& c) {
      using A = decltype(algo);
      const auto full = exact_pattern<T, Op>(c.rank(), count * un);
      std::vector<T> shard(count);
      reduce_scatter<A>(c, std::span<const T>(full), std::span<T>(shard), Op{});
      return to_blob(shard);
    };
  };
  auto scatter_ref = [=](int r) {
    return to_blob(reference_all_reduce<T, Op>(n, count, Op{}, static_cast<std::size_t>(r) * count));
  };
  cs.push_back(
      {label<T, Op>("all_gather<ring>", n, count), gather(ring{}), [gather_ref](int) { return gather_ref(); }});
  cs.push_back(
      {label<T, Op>("all_gather<direct>", n, count), gather(direct{}), [gather_ref](int) { return gather_ref(); }});
  if (recursive_doubling::supports(n))  // power-of-two ranks (others are invalid_argument)
    cs.push_back({label<T, Op>("all_gather<recursive_doubling>", n, count), gather(recursive_doubling{}),
                  [gather_ref](int) { return gather_ref(); }});
  cs.push_back({label<T, Op>("all_gather<automatic>", n, count), gather(automatic{}),
                [gather_ref](int) { return gather_ref(); }});
  cs.push_back({label<T, Op>("reduce_scatter<ring>", n, count), scatter(ring{}), scatter_ref});
  cs.push_back({label<T, Op>("reduce_scatter<direct>", n, count), scatter(direct{}), scatter_ref});
  cs.push_back({label<T, Op>("reduce_scatter<automatic>", n, count), scatter(automatic{}), scatter_ref});
  auto bcast = [count](auto algo, int root) {
    return [count, root](communicator<Tr>& c) {
      using A = decltype(algo);
      std::vector<T> buf = c.rank() == root ? exact_pattern<T, Op>(root, count) : std::vector<T>(count);
      broadcast<A>(c, std::span<T>(buf), root);
      return to_blob(buf);
    };
  };
  const int last = n - 1, middle = n / 2;
  cs.push_back({label<T, Op>("broadcast<ring> root=last", n, count), bcast(ring{}, last),
                [=](int) { return to_blob(exact_pattern<T, Op>(last, count)); }});
  cs.push_back({label<T, Op>("broadcast<tree> root=middle", n, count), bcast(tree{}, middle),
                [=](int) { return to_blob(exact_pattern<T, Op>(middle, count)); }});
  cs.push_back({label<T, Op>("broadcast<direct> root=last", n, count), bcast(direct{}, last),
                [=](int) { return to_blob(exact_pattern<T, Op>(last, count)); }});
  const int rroot = n > 1 ? 1 : 0;
  cs.push_back({label<T, Op>("reduce<tree> root=1", n, count),
                [count, rroot](communicator<Tr>& c) {
                  const auto in = exact_pattern<T, Op>(c.rank(), count);
                  std::vector<T> out(count);
                  reduce<tree>(c, std::span<const T>(in), std::span<T>(out), Op{}, rroot);
                  return to_blob(out);
                },
                [=, ref = lazily([=] { return to_blob(reference_all_reduce<T, Op>(n, count)); })](int r) {
                  return r == rroot ? ref() : to_blob(std::vector<T>(count));
                }});
  cs.push_back({label<T, Op>("all_to_all", n, count),
                [count, un](communicator<Tr>& c) {
                  const auto in = exact_pattern<T, Op>(c.rank(), count * un);
                  std::vector<T> out(count * un);
                  all_to_all(c, std::span<const T>(in), std::span<T>(out));
                  return to_blob(out);
                },
                [=](int r) {
                  std::vector<T> out;
                  for (int q = 0; q < n; ++q) {
                    auto b = exact_pattern<T, Op>(q, count, static_cast<std::size_t>(r) * count);
                    out.insert(out.end(), b.begin(), b.end());
                  }
                  return to_blob(out);
                }});
  if (n >= 2)
    cs.push_back({label<T, Op>("send/recv ring shift", n, count),
                  [count, n](communicator<Tr>& c) {
                    const auto mine = exact_pattern<T, Op>(c.rank(), count);
                    std::vector<T> got(count);
                    request s = send_async(c, std::span<const T>(mine), (c.rank() + 1) % n);
                    recv(c, std::span<T>(got), (c.rank() + n - 1) % n);
                    s.wait();
                    return to_blob(got);
                  },
                  [=](int r) { return to_blob(exact_pattern<T, Op>((r + n - 1) % n, count)); }});
  for (std::size_t k = first; k < cs.size(); ++k) cs[k].diff = &diff_as<T>;
}

// DESIGN.md section 8, second bullet: every collective x algorithm with float sum,
// int32 max and bfloat16 sum.
template <class Tr>
case_list<Tr> representative_cases(int n, std::span<const std::size_t> counts) {
  case_list<Tr> cs;
  for (std::size_t count : counts) {
    add_all_reduce<Tr, float, sum>(cs, n, count);
    add_others<Tr, float, sum>(cs, n, count);
    add_all_reduce<Tr, std::int32_t, max>(cs, n, count);
    add_others<Tr, std::int32_t, max>(cs, n, count);
    add_all_reduce<Tr, bfloat16, sum>(cs, n, count);
    add_others<Tr, bfloat16, sum>(cs, n, count);
  }
  return cs;
}

// Runs the cases in n forked ranks and checks every result against its reference.
template <class Tr>
void check_cases(int n, std::function<case_list<Tr>()> make, rank_options opt = {}) {
  auto results = run_ranks<Tr>(
      n,
      [make](communicator<Tr>& c) {
        std::vector<blob> out;
        for (auto& tc : make()) out.push_back(tc.run(c));
        return out;
      },
      opt);
  const auto cases = make();
  std::string errors;  // every rank's error, so a cascade shows its first cause
  for (int r = 0; r < n; ++r) {
    const auto& res = results[static_cast<std::size_t>(r)];
    if (!res.error.empty()) errors += "rank " + std::to_string(r) + ": " + res.error + "\n";
  }
  INFO(errors);
  for (int r = 0; r < n; ++r) {
    const auto& res = results[static_cast<std::size_t>(r)];
    INFO("rank " << r);
    REQUIRE(res.exit_status == 0);
    REQUIRE(res.blobs.size() == cases.size());
  }
  for (std::size_t k = 0; k < cases.size(); ++k) {
    for (int r = 0; r < n; ++r) {
      const blob want = cases[k].expect(r);
      const blob& got = results[static_cast<std::size_t>(r)].blobs[k];
      if (want != got) FAIL(cases[k].diff(want, got, r, cases[k].name));
    }
  }
  SUCCEED(cases.size() << " cases x " << n << " ranks bit-exact");
}

// Every collective with PLAIT_STREAM_BYTES=1: every all_gather and broadcast copy into
// the output goes through the non-temporal store path (at the default only all_gather
// calls of 8 MiB and more do, and broadcasts beyond half the last-level cache with a
// core per rank), at odd counts and so at every alignment of the output's pieces; the
// other collectives must be unchanged by it.
template <class Tr>
void check_streamed(int ranks) {
  rank_options streamed;
  streamed.stream_bytes = "1";
  const std::vector<std::size_t> counts = {1, 13, 4099, (1 << 18) + 3};
  check_cases<Tr>(
      ranks, [=] { return representative_cases<Tr>(ranks, counts); }, streamed);
}

// The slices and depth every rank of a 2-rank job agreed on, given PLAIT_SLICE_BYTES
// and PLAIT_COPY_SLICE_BYTES (empty: unset), with rank r bound to CPU cpu(r) where
// given: {slice, copy slice, depth, send window, all_gather slice from 2 MiB of output,
// all_gather slice at 1 MiB} of rank 0, then rank 1.
template <class Tr>
std::vector<std::uint64_t> agreed_slices(const std::string& slice, const std::string& copy_slice,
                                         std::function<int(int)> cpu = {}) {
  rank_options opt;
  opt.slice_bytes = slice;
  opt.copy_slice_bytes = copy_slice;
  opt.cpu = std::move(cpu);
  auto results = run_ranks<Tr>(
      2,
      [](communicator<Tr>& c) {
        std::vector<std::uint64_t> v = {c.slice_bytes(), c.copy_slice_bytes(),   c.pipeline_depth(),
                                        c.send_window(), c.gather_slice_bytes(), c.gather_slice_bytes(1 << 20)};
        return std::vector<blob>{to_blob(v)};
      },
      opt);
  std::vector<std::uint64_t> got;
  for (const auto& r : results) {
    INFO(r.error);
    REQUIRE(r.exit_status == 0);
    auto v = from_blob<std::uint64_t>(r.blobs.at(0));
    got.insert(got.end(), v.begin(), v.end());
  }
  return got;
}

// What 3 ranks with these host identities agreed at start-up: per rank, whether
// they all share one host, whether automatic counts messages, the depth, the send
// window, and the slice, copy slice and all_gather slice in KiB (communicator).
template <class Tr>
std::vector<int> agreed_hosts(std::function<std::string(int)> host_id) {
  rank_options opt;
  opt.host_id = std::move(host_id);
  opt.slice_bytes = opt.copy_slice_bytes = "";  // the defaults
  auto results = run_ranks<Tr>(
      3,
      [](communicator<Tr>& c) {
        const auto& cfg = c.core().config();
        return std::vector<blob>{to_blob(std::vector<int>{
            cfg.one_host ? 1 : 0, cfg.network ? 1 : 0, static_cast<int>(cfg.depth), static_cast<int>(cfg.send_window),
            static_cast<int>(c.slice_bytes() >> 10), static_cast<int>(c.copy_slice_bytes() >> 10),
            static_cast<int>(c.gather_slice_bytes() >> 10)})};
      },
      opt);
  std::vector<int> got;
  for (const auto& r : results) {
    INFO(r.error);
    REQUIRE(r.exit_status == 0);
    auto v = from_blob<int>(r.blobs.at(0));
    got.insert(got.end(), v.begin(), v.end());
  }
  return got;
}

// The CPUs this test may use (its affinity).
inline cpu_set_t cpus_allowed() {
  cpu_set_t allowed;
  REQUIRE(::sched_getaffinity(0, sizeof allowed, &allowed) == 0);
  return allowed;
}
inline int cpus_this_test_may_use() {
  const cpu_set_t allowed = cpus_allowed();
  return CPU_COUNT(&allowed);
}

// Binds rank r to the (r mod 2)-th of the first two CPUs this test may use (its one
// CPU, where it may use only one), as plaitrun binds more ranks than CPUs: for
// rank_options::cpu.
inline std::function<int(int)> round_robin_on_two_cpus() {
  const cpu_set_t allowed = cpus_allowed();
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE && cpus.size() < 2; ++c)
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  return [cpus](int r) { return cpus[static_cast<std::size_t>(r) % cpus.size()]; };
}

// Each rank's first blob, as integers, once every rank has exited cleanly.
inline std::vector<std::vector<int>> first_blobs_as_ints(const std::vector<rank_result>& results) {
  std::vector<std::vector<int>> got;
  for (const auto& r : results) {
    INFO(r.error);
    REQUIRE(r.exit_status == 0);
    got.push_back(from_blob<int>(r.blobs.at(0)));
  }
  return got;
}

}  // namespace plait::testing
