// plait-bench: nccl-tests style measurement of plait's collectives.
//
//   plaitrun -n 4 plait-bench -t shm -o all_reduce -b 8 -e 64M -f 2
//
// For each size: count, type, redop, root, time (us), algbw and busbw (GB/s) and
// #wrong, with busbw = algbw x factor (all_reduce 2(n-1)/n; all_gather,
// reduce_scatter, all_to_all (n-1)/n; broadcast, reduce 1), as nccl-tests defines it.
// Time per size is the maximum over ranks of each rank's median over -n iterations,
// after -w warm-up iterations. Buffers are allocated and touched once, up front.
#include <plait/plait.hpp>
#include <plait/transport/shm.hpp>
#include <plait/transport/tcp.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

struct options {
  std::size_t min_bytes = 8, max_bytes = 64u << 20;
  double factor = 2;
  std::string op = "all_reduce", type = "float", redop = "sum", algo = "automatic", transport = "shm";
  int warmup = 5, iters = 20, check = 1, root = 0;
};

[[noreturn]] void usage(const char* msg) {
  std::fprintf(stderr,
               "plait-bench: %s\n"
               "usage: plait-bench [-b min_bytes] [-e max_bytes] [-f factor] [-o collective] [-d type]\n"
               "                   [-r redop] [-a algorithm] [-t transport] [-w warmup] [-n iters] [-c 0|1]\n"
               "                   [-R root]\n"
               "  collective: all_reduce all_gather reduce_scatter broadcast reduce all_to_all\n"
               "  type: float double int32 bfloat16 half   redop: sum prod min max avg\n"
               "  algorithm: automatic ring tree   transport: shm tcp\n"
               "  sizes accept K, M, G suffixes. Launch with: plaitrun -n N plait-bench ...\n",
               msg);
  std::exit(2);
}

std::size_t parse_size(const char* s) {
  char* end = nullptr;
  double v = std::strtod(s, &end);
  if (end == s || v < 0) usage("bad size");
  switch (*end) {
    case 'K':
    case 'k':
      v *= 1024;
      break;
    case 'M':
    case 'm':
      v *= 1024 * 1024;
      break;
    case 'G':
    case 'g':
      v *= 1024.0 * 1024 * 1024;
      break;
    case '\0':
      break;
    default:
      usage("bad size suffix");
  }
  return static_cast<std::size_t>(v);
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") usage("help");
    if (i + 1 >= argc) usage(("missing value for " + a).c_str());
    const char* v = argv[++i];
    if (a == "-b")
      o.min_bytes = parse_size(v);
    else if (a == "-e")
      o.max_bytes = parse_size(v);
    else if (a == "-f")
      o.factor = std::atof(v);
    else if (a == "-o")
      o.op = v;
    else if (a == "-d")
      o.type = v;
    else if (a == "-r")
      o.redop = v;
    else if (a == "-a")
      o.algo = v;
    else if (a == "-t")
      o.transport = v;
    else if (a == "-w")
      o.warmup = std::atoi(v);
    else if (a == "-n")
      o.iters = std::atoi(v);
    else if (a == "-c")
      o.check = std::atoi(v);
    else if (a == "-R")
      o.root = std::atoi(v);
    else
      usage(("unknown option " + a).c_str());
  }
  if (o.factor <= 1.0 || o.iters < 1 || o.warmup < 0 || o.min_bytes > o.max_bytes) usage("bad sweep parameters");
  return o;
}

double bus_factor(const std::string& op, int n) {
  if (op == "all_reduce") return n > 1 ? 2.0 * (n - 1) / n : 1.0;
  if (op == "all_gather" || op == "reduce_scatter" || op == "all_to_all") return n > 1 ? double(n - 1) / n : 1.0;
  return 1.0;
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
struct bench {
  Comm& comm;
  const options& o;
  std::vector<T> in, out;

  // One collective of `bytes` bytes (per nccl-tests: the size of the largest buffer).
  void once(std::size_t count) {
    const int n = comm.size();
    const std::size_t block = std::max<std::size_t>(count / static_cast<std::size_t>(n), 0);
    if (o.op == "all_reduce")
      plait::all_reduce<Algo>(comm, std::span<const T>(in.data(), count), std::span<T>(out.data(), count), Op{});
    else if (o.op == "all_gather")
      plait::all_gather<plait::ring>(comm, std::span<const T>(in.data(), block), std::span<T>(out.data(), block * n));
    else if (o.op == "reduce_scatter")
      plait::reduce_scatter<plait::ring>(comm, std::span<const T>(in.data(), block * n),
                                         std::span<T>(out.data(), block), Op{});
    else if (o.op == "broadcast")
      plait::broadcast<Algo>(comm, std::span<T>(out.data(), count), o.root);
    else if (o.op == "reduce")
      plait::reduce<plait::tree>(comm, std::span<const T>(in.data(), count), std::span<T>(out.data(), count), Op{},
                                 o.root);
    else if (o.op == "all_to_all")
      plait::all_to_all(comm, std::span<const T>(in.data(), block * n), std::span<T>(out.data(), block * n));
    else
      usage("unknown collective");
  }

  std::size_t effective_count(std::size_t count) const {
    const auto n = static_cast<std::size_t>(comm.size());
    if (o.op == "all_gather" || o.op == "reduce_scatter" || o.op == "all_to_all") return count / n * n;
    return count;
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

  void run() {
    const int n = comm.size();
    const std::size_t max_count = std::max<std::size_t>(o.max_bytes / sizeof(T), 1);
    in.assign(max_count, T{});  // touched here, not in the timed loop
    out.assign(max_count, T{});
    if (comm.rank() == 0) {
      std::printf("# plait-bench: %s over %s, %d ranks, algorithm %s, %d warm-up + %d timed iterations\n", o.op.c_str(),
                  o.transport.c_str(), n, o.algo.c_str(), o.warmup, o.iters);
      std::printf("# busbw = algbw x %.4f; time = max over ranks of each rank's median\n#\n", bus_factor(o.op, n));
      std::printf("%12s %12s %8s %6s %6s %10s %9s %9s %7s\n", "size(B)", "count", "type", "redop", "root", "time(us)",
                  "algbw", "busbw", "#wrong");
      std::fflush(stdout);
    }
    double bus_sum = 0;
    int rows = 0;
    for (std::size_t bytes = o.min_bytes; bytes <= o.max_bytes;) {
      const std::size_t count = effective_count(std::max<std::size_t>(bytes / sizeof(T), 1));
      const std::size_t size = count * sizeof(T);
      if (comm.rank() == 0) std::fprintf(stderr, "plait-bench: %zu bytes ...\r", size);
      fill(count);
      for (int i = 0; i < o.warmup; ++i) once(count);
      std::vector<double> t(static_cast<std::size_t>(o.iters));
      for (int i = 0; i < o.iters; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        once(count);
        t[static_cast<std::size_t>(i)] =
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      }
      std::nth_element(t.begin(), t.begin() + o.iters / 2, t.end());
      double med = t[static_cast<std::size_t>(o.iters / 2)];
      plait::all_reduce<plait::ring>(comm, std::span<double>(&med, 1), plait::max{});
      std::int64_t bad = 0;
      if (o.check) {
        fill(count);
        once(count);
        bad = wrong(count);
        plait::all_reduce<plait::ring>(comm, std::span<std::int64_t>(&bad, 1), plait::sum{});
      }
      const double algbw = static_cast<double>(size) / (med * 1e-6) / 1e9;
      const double busbw = algbw * bus_factor(o.op, n);
      bus_sum += busbw;
      ++rows;
      if (comm.rank() == 0) {
        std::printf("%12zu %12zu %8s %6s %6d %10.1f %9.3f %9.3f %7lld\n", size, count, o.type.c_str(), o.redop.c_str(),
                    (o.op == "broadcast" || o.op == "reduce") ? o.root : -1, med, algbw, busbw,
                    static_cast<long long>(o.check ? bad : -1));
        std::fflush(stdout);
      }
      const auto next = static_cast<std::size_t>(static_cast<double>(bytes) * o.factor);
      bytes = next > bytes ? next : bytes + 1;
    }
    if (comm.rank() == 0) {
      std::fprintf(stderr, "%40s\r", "");
      std::printf("# Avg bus bandwidth    : %.3f GB/s\n", rows ? bus_sum / rows : 0.0);
    }
  }
};

template <class Comm, class T, class Op>
void with_algo(Comm& c, const options& o) {
  if (o.algo == "ring")
    bench<Comm, T, Op, plait::ring>{c, o, {}, {}}.run();
  else if (o.algo == "tree")
    bench<Comm, T, Op, plait::tree>{c, o, {}, {}}.run();
  else if (o.algo == "automatic")
    bench<Comm, T, Op, plait::automatic>{c, o, {}, {}}.run();
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
  const options o = parse(argc, argv);
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
  return 0;
}
