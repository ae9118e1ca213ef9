// plait-bench: nccl-tests style measurement of plait's collectives.
//
//   plaitrun -n 4 plait-bench -t shm -o all_reduce -b 8 -e 64M -f 2 [-J out.json]
//
// Options, columns, sizes and timing are bench/bench_report.hpp's (shared with the
// peer benchmarks in bench/peers): per size the count, type, redop, root, time (us),
// algbw and busbw (GB/s, nccl-tests' factors) and #wrong; minflt (page faults per
// call after warm-up: 0 means no allocation or first touch on the hot path); and
// the bound measured in the same run (bench/bounds.hpp): copy bandwidth per thread
// with as many threads as ranks for shm, loopback TCP throughput per connection for
// tcp, with busbw as a percentage of it. Buffers are allocated and touched up front.
#include <plait/plait.hpp>
#include <plait/transport/shm.hpp>
#include <plait/transport/tcp.hpp>

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "bench_report.hpp"
#include "bounds.hpp"

namespace {

// Where this rank may run, for the settings line (plaitrun binds ranks that fit).
std::string cpus_of_this_rank() {
  cpu_set_t s;
  if (::sched_getaffinity(0, sizeof s, &s) != 0) return "CPUs unknown";
  if (CPU_COUNT(&s) != 1) return "on " + std::to_string(CPU_COUNT(&s)) + " CPUs";
  int c = 0;
  while (!CPU_ISSET(c, &s)) ++c;
  return "bound to CPU " + std::to_string(c);
}

using bench::options;

[[noreturn]] void usage(const char* msg) {
  bench::usage("plait-bench", msg,
               "  plait-bench: -o all_reduce all_gather reduce_scatter broadcast reduce all_to_all\n"
               "  -d float double int32 bfloat16 half   -r sum prod min max avg\n"
               "  -a automatic ring tree direct recursive_doubling   -t shm tcp\n"
               "  launch with: plaitrun -n N plait-bench ...\n");
}

// Small integer values keep every reduction exact, so #wrong is a bitwise check.
template <class T>
T value(int rank, std::size_t i) {
  const float v = static_cast<float>((i * 7 + static_cast<std::size_t>(rank) * 3) % 11);
  if constexpr (std::is_same_v<T, plait::half> || std::is_same_v<T, plait::bfloat16>)
    return T(v);
  else
    return static_cast<T>(v);
}

template <class Comm, class T, class Op, class Algo>
struct bench_run {
  Comm& comm;
  const options& o;
  std::vector<T> in, out;
  bool failed = false;

  // One collective of `bytes` bytes (per nccl-tests: the size of the largest buffer).
  void once(std::size_t count) {
    const int n = comm.size();
    const std::size_t block = std::max<std::size_t>(count / static_cast<std::size_t>(n), 0);
    if (o.op == "all_reduce")
      plait::all_reduce<Algo>(comm, std::span<const T>(in.data(), count), std::span<T>(out.data(), count), Op{});
    else if (o.op == "all_gather")
      if constexpr (std::is_same_v<Algo, plait::automatic> || plait::has_all_gather<Algo>)
        plait::all_gather<Algo>(comm, std::span<const T>(in.data(), block), std::span<T>(out.data(), block * n));
      else
        usage("all_gather takes -a automatic, ring or direct");
    else if (o.op == "reduce_scatter")
      if constexpr (std::is_same_v<Algo, plait::automatic> || plait::has_reduce_scatter<Algo>)
        plait::reduce_scatter<Algo>(comm, std::span<const T>(in.data(), block * n), std::span<T>(out.data(), block),
                                    Op{});
      else
        usage("reduce_scatter takes -a automatic, ring or direct");
    else if (o.op == "broadcast")
      if constexpr (std::is_same_v<Algo, plait::recursive_doubling>)
        usage("broadcast takes -a automatic, ring, tree or direct");
      else
        plait::broadcast<Algo>(comm, std::span<T>(out.data(), count), o.root);
    else if (o.op == "reduce")
      plait::reduce<plait::tree>(comm, std::span<const T>(in.data(), count), std::span<T>(out.data(), count), Op{},
                                 o.root);
    else if (o.op == "all_to_all")
      plait::all_to_all(comm, std::span<const T>(in.data(), block * n), std::span<T>(out.data(), block * n));
    else
      usage("unknown collective");
  }

  // Compares out with what the collective must produce; counts wrong elements.
  std::int64_t wrong(std::size_t count) {
    const int n = comm.size();
    const auto un = static_cast<std::size_t>(n);
    std::int64_t bad = 0;
    auto reduced = [&](std::size_t i) {
      auto acc = plait::to_compute(value<T>(0, i));
      for (int r = 1; r < n; ++r) acc = Op{}(acc, plait::to_compute(value<T>(r, i)));
      if constexpr (plait::has_finalize<Op, T>) acc = Op{}.finalize(acc, n);
      return plait::from_compute<T>(acc);
    };
    auto differs = [](const T& a, const T& b) { return std::memcmp(&a, &b, sizeof(T)) != 0; };
    const std::size_t block = count / un;
    const int me = comm.rank();
    if (o.op == "all_reduce") {
      for (std::size_t i = 0; i < count; ++i) bad += differs(out[i], reduced(i));
    } else if (o.op == "all_gather") {
      for (std::size_t i = 0; i < block * un; ++i)
        bad += differs(out[i], value<T>(static_cast<int>(i / block), i % block));
    } else if (o.op == "reduce_scatter") {
      for (std::size_t i = 0; i < block; ++i) bad += differs(out[i], reduced(static_cast<std::size_t>(me) * block + i));
    } else if (o.op == "broadcast") {
      for (std::size_t i = 0; i < count; ++i) bad += differs(out[i], value<T>(o.root, i));
    } else if (o.op == "reduce") {
      if (me == o.root)
        for (std::size_t i = 0; i < count; ++i) bad += differs(out[i], reduced(i));
    } else if (o.op == "all_to_all") {
      for (std::size_t i = 0; i < block * un; ++i)
        bad += differs(out[i], value<T>(static_cast<int>(i / block), static_cast<std::size_t>(me) * block + i % block));
    }
    return bad;
  }

  void fill(std::size_t count) {
    for (std::size_t i = 0; i < count; ++i) in[i] = value<T>(comm.rank(), i);
    if (o.op == "broadcast")
      for (std::size_t i = 0; i < count; ++i) out[i] = comm.rank() == o.root ? value<T>(o.root, i) : T{};
  }

  // Which all_gather and broadcast outputs are written past the cache (PLAIT_STREAM_BYTES;
  // broadcast: from half the last-level cache, with a core per rank on one host).
  std::string streamed() const {
    constexpr std::size_t never = std::numeric_limits<std::size_t>::max();
    const std::size_t g = comm.core().config().stream_from_bytes;
    const std::size_t b = comm.core().config().broadcast_stream_from_bytes;
    if (g == never && b == never) return "no output streamed";
    std::string s;
    if (g != never) s = "all_gather outputs from " + std::to_string(g) + " B";
    if (b != never) s += (s.empty() ? "broadcast outputs from " : ", broadcast's from ") + std::to_string(b) + " B";
    return s + " streamed";
  }

  // The congestion control of tcp links on this host (and the bound's), and the system's.
  std::string congestion() const {
    const std::string mine = comm.core().config().host_congestion.value_or("");
    return (mine.empty() ? std::string("the system's") : mine) + " (system: " + bench::system_congestion() + ")";
  }

  // The broadcast chain (comm_config::chain) and the ring's cycle for its reductions
  // (comm_config::cpu_ring), where the ranks are grouped by CPU.
  std::string chain() const {
    using cc = plait::detail::comm_config;
    const auto& cfg = comm.core().config();
    std::string s;
    auto list = [&s](const std::vector<int>& order, const char* what) {
      if (order.empty()) return;
      s.append(", ").append(what);
      for (std::size_t i = 0; i < order.size(); ++i) s.append(i == 0 ? " " : "-").append(std::to_string(order[i]));
      s.append(" (ranks grouped by CPU)");
    };
    list(cfg.chain, "broadcast chain");
    const std::string ring = "ring all_reduce below " + std::to_string(cc::ring_cpus_all_reduce_below_bytes >> 10) +
                             " KiB and reduce_scatter below " +
                             std::to_string(cc::ring_cpus_reduce_scatter_below_bytes >> 10) + " KiB round";
    list(cfg.cpu_ring, ring.c_str());
    return s;
  }

  void run() {
    const int n = comm.size();
    const std::size_t max_count = std::max<std::size_t>(o.max_bytes / sizeof(T), 1);
    in.assign(max_count, T{});  // touched here, not in the timed loop
    out.assign(max_count, T{});
    const bool shm = o.transport == "shm";
    // all_gather's slice, and its slice for smaller outputs where that differs.
    const auto gather_slices = [&] {
      constexpr std::size_t below = plait::detail::comm_config::network_gather_small_below_bytes;
      const std::size_t large = comm.gather_slice_bytes(), small = comm.gather_slice_bytes(below - 1);
      return std::to_string(large) + " B" +
             (small != large
                  ? ", under " + std::to_string(below >> 20) + " MiB of output " + std::to_string(small) + " B"
                  : std::string());
    };
    bench::report rep(o, "plait", "0.1", n,
                      "algorithm " + o.algo + (comm.core().config().one_host ? " (all ranks on one host)" : "") +
                          chain() + ", slice " + std::to_string(comm.slice_bytes()) + " B (broadcast, send/recv " +
                          std::to_string(comm.copy_slice_bytes()) + " B" +
                          (shm ? "" : ", all_gather " + gather_slices()) + "), depth " +
                          std::to_string(comm.pipeline_depth()) +
                          (shm ? "" : ", send window " + std::to_string(comm.send_window()) + " slots") +
                          (shm ? "" : ", congestion control on this host " + congestion()) + ", " + streamed() +
                          "; rank 0 " + cpus_of_this_rank() + "; PLAIT_* environment as launched",
                      comm.rank() == 0, shm ? "copy" : "loopback");
    rep.header();
    bench::bounds bound;
    bound.congestion = comm.core().config().host_congestion.value_or("");
    const auto sweep = bench::sizes(o);
    for (std::size_t k = 0; k < sweep.size(); ++k) {
      const std::size_t count = bench::count_for(o, sweep[k], sizeof(T), n);
      const std::size_t size = count * sizeof(T);
      rep.progress(k, sweep.size(), size);
      bench::row r;
      r.bytes = size;
      r.count = count;
      r.root = (o.op == "broadcast" || o.op == "reduce") ? o.root : -1;
      // The bound, measured by rank 0 while the others wait.
      if (comm.rank() == 0) r.bound_gbps = shm ? bound.copy_gbps(size, n) : bound.loopback_gbps(size, n);
      plait::barrier(comm);
      fill(count);
      const bench::timed_calls t = bench::time_calls(
          o.warmup, o.iters, [&] { once(count); }, [&] { plait::barrier(comm); });
      double stats[2] = {bench::median(t.us()), static_cast<double>(t.faults) / o.iters};
      plait::all_reduce<plait::ring>(comm, std::span<double>(stats, 2), plait::max{});
      r.time_us = stats[0];
      r.minflt = stats[1];
      r.calls_us = t.calls;
      if (o.check) {
        fill(count);
        once(count);
        std::int64_t bad = wrong(count);
        plait::all_reduce<plait::ring>(comm, std::span<std::int64_t>(&bad, 1), plait::sum{});
        r.wrong = bad;
      }
      rep.add(r);
    }
    if (!rep.finish() || rep.total_wrong() > 0) failed = true;
  }
};

int exit_code = 0;

template <class Comm, class T, class Op, class Algo>
void run_bench(Comm& c, const options& o) {
  bench_run<Comm, T, Op, Algo> b{c, o, {}, {}};
  b.run();
  if (b.failed) exit_code = 1;
}

template <class Comm, class T, class Op>
void with_algo(Comm& c, const options& o) {
  if (o.algo == "ring")
    run_bench<Comm, T, Op, plait::ring>(c, o);
  else if (o.algo == "tree")
    run_bench<Comm, T, Op, plait::tree>(c, o);
  else if (o.algo == "direct")
    run_bench<Comm, T, Op, plait::direct>(c, o);
  else if (o.algo == "recursive_doubling")
    run_bench<Comm, T, Op, plait::recursive_doubling>(c, o);
  else if (o.algo == "automatic")
    run_bench<Comm, T, Op, plait::automatic>(c, o);
  else
    usage("unknown algorithm");
}

template <class Comm, class T>
void with_op(Comm& c, const options& o) {
  if (o.redop == "sum")
    with_algo<Comm, T, plait::sum>(c, o);
  else if (o.redop == "prod")
    with_algo<Comm, T, plait::prod>(c, o);
  else if (o.redop == "min")
    with_algo<Comm, T, plait::min>(c, o);
  else if (o.redop == "max")
    with_algo<Comm, T, plait::max>(c, o);
  else if (o.redop == "avg")
    with_algo<Comm, T, plait::avg>(c, o);
  else
    usage("unknown redop");
}

template <class Comm>
void with_type(Comm& c, const options& o) {
  if (o.type == "float")
    with_op<Comm, float>(c, o);
  else if (o.type == "double")
    with_op<Comm, double>(c, o);
  else if (o.type == "int32")
    with_op<Comm, std::int32_t>(c, o);
  else if (o.type == "bfloat16")
    with_op<Comm, plait::bfloat16>(c, o);
  else if (o.type == "half")
    with_op<Comm, plait::half>(c, o);
  else
    usage("unknown type");
}

}  // namespace

int main(int argc, char** argv) {
  options defaults;
  defaults.algo = "automatic";
  defaults.transport = "shm";
  const options o = bench::parse(argc, argv, defaults);
  try {
    if (o.transport == "shm") {
      auto c = plait::communicator<plait::transport::shm>::from_env();
      with_type(c, o);
    } else if (o.transport == "tcp") {
      auto c = plait::communicator<plait::transport::tcp>::from_env();
      with_type(c, o);
    } else {
      usage("unknown transport");
    }
  } catch (const plait::error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return exit_code;
}
