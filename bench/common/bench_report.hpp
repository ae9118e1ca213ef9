// What every benchmark in bench/ shares, so that plait-bench and the peer benchmarks
// (bench/peers: Open MPI, MPICH, Gloo) take the same options and print the same
// table and JSON, and bench/compare can read any of them.
//
// Options (nccl-tests style): -b min bytes, -e max bytes, -f factor, -o collective,
// -d type, -r redop, -a algorithm, -t transport, -w warm-up iterations, -n timed
// iterations, -c check 0|1, -R root, -J json file. Sizes take K, M, G suffixes.
// Sizes are nccl-tests': the bytes of the largest buffer (all_gather's output,
// reduce_scatter's input); their counts are rounded down to a multiple of the ranks.
// Per size: each rank times every iteration alone and takes the median; the
// reported time is the maximum over ranks of those medians. busbw = algbw x factor
// (all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; broadcast,
// reduce 1). minflt is the minor page faults per timed call (getrusage, maximum
// over ranks): after warm-up it should be 0 for a library that keeps its buffers.
// The JSON also lists rank 0's own time of every call of a size, warm-up first
// (calls_us): a fresh process's first calls against the median.
// Only rank 0 prints; progress (which size, how far) goes to stderr.
// Not thread-safe; no plait dependency.
#pragma once

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace bench {

struct options {
  std::size_t min_bytes = 8, max_bytes = std::size_t{64} << 20;
  double factor = 2;
  std::string op = "all_reduce", type = "float", redop = "sum", algo, transport;
  int warmup = 5, iters = 20, check = 1, root = 0;
  std::string json;  // -J: write the results here as JSON (rank 0)
};

inline const char* common_usage =
    "  -b min_bytes -e max_bytes -f factor   sweep (sizes take K, M, G suffixes)\n"
    "  -o collective (all_reduce all_gather reduce_scatter broadcast reduce all_to_all)\n"
    "  -d type -r redop -a algorithm -t transport -R root\n"
    "  -w warm-up iterations -n timed iterations -c check 0|1 -J json_file\n";

[[noreturn]] inline void usage(const char* prog, const char* msg, const char* extra = "") {
  std::fprintf(stderr, "%s: %s\nusage: %s [options]\n%s%s", prog, msg, prog, common_usage, extra);
  std::exit(2);
}

inline std::size_t parse_size(const char* prog, const char* s) {
  char* end = nullptr;
  double v = std::strtod(s, &end);
  if (end == s || !(v >= 0)) usage(prog, "bad size");
  switch (*end) {
    case 'K':
    case 'k':
      v *= 1024;
      break;
    case 'M':
    case 'm':
      v *= 1024.0 * 1024;
      break;
    case 'G':
    case 'g':
      v *= 1024.0 * 1024 * 1024;
      break;
    case '\0':
      break;
    default:
      usage(prog, "bad size suffix");
  }
  return static_cast<std::size_t>(v);
}

// Parses the common options; `defaults` carries a program's own defaults (its
// algorithm and transport names).
inline options parse(int argc, char** argv, options o, const char* extra_usage = "") {
  const char* prog = argc > 0 ? argv[0] : "bench";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") usage(prog, "help", extra_usage);
    if (i + 1 >= argc) usage(prog, ("missing value for " + a).c_str(), extra_usage);
    const char* v = argv[++i];
    if (a == "-b")
      o.min_bytes = parse_size(prog, v);
    else if (a == "-e")
      o.max_bytes = parse_size(prog, v);
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
    else if (a == "-J")
      o.json = v;
    else
      usage(prog, ("unknown option " + a).c_str(), extra_usage);
  }
  if (!(o.factor > 1.0) || o.iters < 1 || o.warmup < 0 || o.min_bytes > o.max_bytes)
    usage(prog, "bad sweep parameters (need -f > 1, -n >= 1, -w >= 0, -b <= -e)", extra_usage);
  return o;
}

inline double bus_factor(const std::string& op, int n) {
  if (op == "all_reduce") return n > 1 ? 2.0 * (n - 1) / n : 1.0;
  if (op == "all_gather" || op == "reduce_scatter" || op == "all_to_all") return n > 1 ? double(n - 1) / n : 1.0;
  return 1.0;
}

// Collectives whose size is split into one block per rank.
inline bool blocked(const std::string& op) {
  return op == "all_gather" || op == "reduce_scatter" || op == "all_to_all";
}

// The sweep: min, min x f, ... up to max.
inline std::vector<std::size_t> sizes(const options& o) {
  std::vector<std::size_t> out;
  for (std::size_t b = o.min_bytes; b <= o.max_bytes;) {
    out.push_back(b);
    const auto next = static_cast<std::size_t>(static_cast<double>(b) * o.factor);
    b = next > b ? next : b + 1;
  }
  return out;
}

// Elements in the largest buffer for `bytes` (at least one; a multiple of n when blocked).
inline std::size_t count_for(const options& o, std::size_t bytes, std::size_t elem, int n) {
  std::size_t count = std::max<std::size_t>(bytes / elem, 1);
  const auto un = static_cast<std::size_t>(n);
  if (blocked(o.op)) count = std::max<std::size_t>(count / un, 1) * un;
  return count;
}

inline long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

// Ticks of CPU time on this machine since boot, summed over its CPUs: all of them,
// and those "stolen" (a virtual CPU that wanted to run while the hypervisor ran
// something else: /proc/stat's 8th cpu field). {0, 0} where /proc/stat is unreadable.
struct cpu_ticks {
  unsigned long long steal = 0, total = 0;
};

inline cpu_ticks read_cpu_ticks() {
  cpu_ticks t;
  std::FILE* f = std::fopen("/proc/stat", "r");
  if (f == nullptr) return t;
  unsigned long long v[8] = {};
  if (std::fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6],
                  &v[7]) == 8) {
    t.steal = v[7];
    for (unsigned long long x : v) t.total += x;
  }
  std::fclose(f);
  return t;
}

// Maps every code page of the process in (the executable's and every shared
// library's executable mappings: madvise MADV_POPULATE_READ, Linux 5.14+), once per
// process, before the first timed call. A branch first taken inside the timed calls
// (plait's copy out of a slot, when a frame that usually lands in the output arrived
// before the call asked for it) otherwise faults its code page in there, and counts
// as a fault of the call: 0.1 per call at 4-rank tcp broadcast 1M in about 1 run of
// 3 (`perf record -e minor-faults -d`: instruction fetches in kernel_entry and in
// broadcast_impl). That is the loader's one-time cost, not memory the hot path
// touches, so it is kept out of the count for every library alike; faults on data
// still count. Where the call is refused (an older kernel) nothing changes.
inline void map_code_in() {
  static const bool done = [] {
    std::FILE* f = std::fopen("/proc/self/maps", "r");
    if (f == nullptr) return true;
    char line[8192];
    while (std::fgets(line, sizeof line, f) != nullptr) {
      unsigned long begin = 0, end = 0;
      char perms[8] = {};
      if (std::sscanf(line, "%lx-%lx %7s", &begin, &end, perms) != 3 || perms[2] != 'x') continue;
      ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_READ);
    }
    std::fclose(f);
    return true;
  }();
  (void)done;
}

// What time_calls measured: every call's time in µs, the warm-up calls first, and the
// minor page faults the timed calls took (the whole process, every thread).
struct timed_calls {
  std::vector<double> calls;
  std::size_t warmup = 0;
  long faults = 0;

  // The timed calls alone.
  std::vector<double> us() const { return {calls.begin() + static_cast<std::ptrdiff_t>(warmup), calls.end()}; }
};

// Runs `warmup` calls, then `sync()` (a barrier), then `iters` timed calls, all
// through the same instructions: the code that times a call runs first during the
// warm-up. With separate loops the timed loop's own code pages were first executed,
// and sometimes first faulted in, inside the timed region, which counted as a page
// fault of the call (0.01 per call in about 1 run of 30, 4-rank tcp reduce_scatter,
// `perf record -e minor-faults -d`: an instruction fetch in the timing code).
template <class Call, class Sync>
timed_calls time_calls(int warmup, int iters, Call&& call, Sync&& sync) {
  map_code_in();
  timed_calls r;
  r.calls.resize(static_cast<std::size_t>(warmup + iters));
  r.warmup = static_cast<std::size_t>(warmup);
  long before = 0;
  for (int i = 0; i < warmup + iters; ++i) {
    if (i == warmup) {
      sync();
      before = minor_faults();
    }
    const auto t0 = std::chrono::steady_clock::now();
    call();
    r.calls[static_cast<std::size_t>(i)] =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  }
  r.faults = minor_faults() - before;
  return r;
}

inline double median(std::vector<double> t) {
  if (t.empty()) return 0;
  std::nth_element(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(t.size() / 2), t.end());
  return t[t.size() / 2];
}

struct row {
  std::size_t bytes = 0, count = 0;
  int root = -1;
  double time_us = 0, algbw = 0, busbw = 0;
  long long wrong = -1;   // -1: not checked
  double minflt = 0;      // minor page faults per timed call
  double bound_gbps = 0;  // the bound this size is compared with (0: none)
  // The printing rank's own time of every call of this size, warm-up first (JSON only):
  // how a fresh process's first calls compare with the median.
  std::vector<double> calls_us;
};

// Prints the table (and writes the JSON) on rank 0.
class report {
 public:
  // library: "plait", "openmpi", ...; settings: how the library was set up (env,
  // MCA parameters), stated in the output; bound_kind: "copy", "loopback" or "".
  report(options o, std::string library, std::string version, int ranks, std::string settings, bool printer,
         std::string bound_kind = "")
      : o_(std::move(o)),
        library_(std::move(library)),
        version_(std::move(version)),
        settings_(std::move(settings)),
        bound_kind_(std::move(bound_kind)),
        ranks_(ranks),
        printer_(printer),
        start_ticks_(printer ? read_cpu_ticks() : cpu_ticks{}) {}

  void header() const {
    if (!printer_) return;
    std::printf("# %s %s: %s over %s, %d ranks, algorithm %s, %d warm-up + %d timed iterations\n", library_.c_str(),
                version_.c_str(), o_.op.c_str(), o_.transport.c_str(), ranks_, o_.algo.c_str(), o_.warmup, o_.iters);
    if (!settings_.empty()) std::printf("# settings: %s\n", settings_.c_str());
    std::printf("# busbw = algbw x %.4f; time = max over ranks of each rank's median; minflt = page faults per call\n",
                bus_factor(o_.op, ranks_));
    if (!bound_kind_.empty())
      std::printf("# bound = %s bandwidth for the same size, measured in this run; %%bound = busbw / bound\n",
                  bound_kind_.c_str());
    std::printf("#\n%12s %12s %8s %6s %6s %10s %9s %9s %7s %8s", "size(B)", "count", "type", "redop", "root",
                "time(us)", "algbw", "busbw", "#wrong", "minflt");
    if (!bound_kind_.empty()) std::printf(" %9s %7s", "bound", "%bound");
    std::printf("\n");
    std::fflush(stdout);
  }

  // On a terminal, a line rewritten per size; otherwise (a launcher's pipe, a log) a
  // line only once a size took over a second, so the last line names the one running.
  void progress(std::size_t index, std::size_t total, std::size_t bytes) {
    if (!printer_) return;
    const auto now = std::chrono::steady_clock::now();
    const bool tty = isatty(2) != 0;
    if (tty || (index > 0 && now - last_progress_ > std::chrono::seconds(1)))
      std::fprintf(stderr, "%s: size %zu of %zu, %zu bytes ...%s", library_.c_str(), index + 1, total, bytes,
                   tty ? "\r" : "\n");
    std::fflush(stderr);
    last_progress_ = now;
  }

  void add(row r) {
    r.algbw = r.time_us > 0 ? static_cast<double>(r.bytes) / (r.time_us * 1e-6) / 1e9 : 0;
    r.busbw = r.algbw * bus_factor(o_.op, ranks_);
    rows_.push_back(r);
    if (!printer_) return;
    if (isatty(2)) std::fprintf(stderr, "%60s\r", "");
    std::printf("%12zu %12zu %8s %6s %6d %10.1f %9.3f %9.3f %7lld %8.1f", r.bytes, r.count, o_.type.c_str(),
                o_.redop.c_str(), r.root, r.time_us, r.algbw, r.busbw, r.wrong, r.minflt);
    if (!bound_kind_.empty()) std::printf(" %9.3f %6.1f%%", r.bound_gbps, percent(r));
    std::printf("\n");
    std::fflush(stdout);
  }

  bool printer() const noexcept { return printer_; }

  double average_busbw() const {
    double sum = 0;
    for (const row& r : rows_) sum += r.busbw;
    return rows_.empty() ? 0 : sum / static_cast<double>(rows_.size());
  }

  long long total_wrong() const {
    long long w = 0;
    for (const row& r : rows_) w += r.wrong > 0 ? r.wrong : 0;
    return w;
  }

  // Prints the average line and writes the JSON file; false if it could not be written.
  bool finish() const {
    if (!printer_) return true;
    std::printf("# Out of bounds values : %lld %s\n", total_wrong(), total_wrong() ? "ERROR" : "OK");
    std::printf("# Avg bus bandwidth    : %.3f GB/s\n", average_busbw());
    const double steal = steal_percent();
    if (steal >= 0)
      std::printf("# Hypervisor steal     : %.1f %% of this machine's CPU time during the run%s\n", steal,
                  steal >= 5 ? " (other guests took it: the timings above are low)" : "");
    std::fflush(stdout);
    if (o_.json.empty()) return true;
    std::FILE* f = std::fopen(o_.json.c_str(), "w");
    if (f == nullptr) {
      std::fprintf(stderr, "%s: cannot write %s\n", library_.c_str(), o_.json.c_str());
      return false;
    }
    std::fprintf(f,
                 "{\"library\": %s, \"version\": %s, \"collective\": %s, \"algorithm\": %s, \"transport\": %s, "
                 "\"ranks\": %d, \"type\": %s, \"redop\": %s, \"settings\": %s, \"warmup\": %d, \"iters\": %d, "
                 "\"bound\": %s, \"avg_busbw\": %.6g, \"steal_pct\": %.6g, \"rows\": [",
                 quote(library_).c_str(), quote(version_).c_str(), quote(o_.op).c_str(), quote(o_.algo).c_str(),
                 quote(o_.transport).c_str(), ranks_, quote(o_.type).c_str(), quote(o_.redop).c_str(),
                 quote(settings_).c_str(), o_.warmup, o_.iters, quote(bound_kind_).c_str(), average_busbw(), steal);
    for (std::size_t i = 0; i < rows_.size(); ++i) {
      const row& r = rows_[i];
      std::fprintf(f,
                   "%s\n  {\"bytes\": %zu, \"count\": %zu, \"root\": %d, \"time_us\": %.6g, \"algbw\": %.6g, "
                   "\"busbw\": %.6g, \"wrong\": %lld, \"minflt\": %.6g, \"bound_gbps\": %.6g, \"calls_us\": [",
                   i ? "," : "", r.bytes, r.count, r.root, r.time_us, r.algbw, r.busbw, r.wrong, r.minflt,
                   r.bound_gbps);
      for (std::size_t k = 0; k < r.calls_us.size(); ++k) std::fprintf(f, "%s%.1f", k ? ", " : "", r.calls_us[k]);
      std::fprintf(f, "]}");
    }
    std::fprintf(f, "\n]}\n");
    return std::fclose(f) == 0;
  }

 private:
  // The share of CPU time the hypervisor stole since this report was made; -1 where
  // /proc/stat gives nothing.
  double steal_percent() const {
    const cpu_ticks now = read_cpu_ticks();
    if (now.total <= start_ticks_.total) return -1;
    return 100.0 * static_cast<double>(now.steal - start_ticks_.steal) /
           static_cast<double>(now.total - start_ticks_.total);
  }

  static double percent(const row& r) { return r.bound_gbps > 0 ? 100.0 * r.busbw / r.bound_gbps : 0; }

  static std::string quote(const std::string& s) {
    std::string out = "\"";
    for (char c : s) {
      if (c == '"' || c == '\\')
        out += '\\', out += c;
      else if (static_cast<unsigned char>(c) < 0x20)
        out += ' ';
      else
        out += c;
    }
    return out + "\"";
  }

  options o_;
  std::string library_, version_, settings_, bound_kind_;
  int ranks_;
  bool printer_;
  cpu_ticks start_ticks_;  // when the report was made (the printing rank only): steal is counted from here
  std::vector<row> rows_;
  std::chrono::steady_clock::time_point last_progress_{};
};

}  // namespace bench
