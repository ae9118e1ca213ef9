// peer-openmpi-bench / peer-mpich-bench: the plait-bench measurement through an MPI
// library's own collectives, so their busbw stands next to plait's in one table.
//
//   bash bench/peers/mpi/run.sh openmpi shm 4 build -- -o all_reduce -b 4K -e 16M -f 4
//
// One source, C MPI API only, built once per library (bench/peers/mpi/meson.build).
// Collectives: all_reduce (MPI_Allreduce), all_gather (MPI_Allgather), reduce_scatter
// (MPI_Reduce_scatter_block), broadcast (MPI_Bcast from -R); float and sum only.
// Measurement as bench/bench_report.hpp states: buffers touched once up front, each
// call timed alone with steady_clock after one barrier, the rank's median, the maximum
// over ranks (MPI_Allreduce MAX). -t and -a are labels; run.sh passes the transport it
// set up and states its settings in PLAIT_PEER_SETTINGS. Every wait inside MPI is
// unbounded, so run.sh bounds the whole run with `timeout`, and MPI_Finalize with a
// grace period once rank 0 has reported that every rank is done (report_done).
#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_report.hpp"

namespace {

#if defined(OMPI_MAJOR_VERSION)
constexpr const char* library_name = "openmpi";
#elif defined(MPICH_VERSION)
constexpr const char* library_name = "mpich";
#else
constexpr const char* library_name = "mpi";
#endif

// Written into outputs before the check run: no correct result is negative, so a
// collective that leaves an element untouched counts as wrong.
constexpr float sentinel = -1.0f;

const char* extra_usage =
    "  peer options: -o all_reduce|all_gather|reduce_scatter|broadcast, -d float, -r sum only;\n"
    "  -t and -a are labels (run.sh sets -t to the path it configured)\n";

// The first line of MPI_Get_library_version, whitespace runs folded to one space.
std::string library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  MPI_Get_library_version(text, &length);
  std::string out;
  for (int i = 0; i < length && text[i] != '\n' && text[i] != '\0'; ++i) {
    const bool space = text[i] == ' ' || text[i] == '\t' || text[i] == '\r';
    if (!space)
      out += text[i];
    else if (!out.empty() && out.back() != ' ')
      out += ' ';
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

// Small integers keep every sum exact, so #wrong is a bitwise check (as plait-bench).
float value(int rank, std::size_t i) { return static_cast<float>((i * 7 + static_cast<std::size_t>(rank) * 3) % 11); }

bool differs(float a, float b) { return std::memcmp(&a, &b, sizeof a) != 0; }

class mpi_bench {
 public:
  mpi_bench(const bench::options& o, int rank, int ranks) : o_(o), rank_(rank), ranks_(ranks) {}

  // Returns the process exit status (0, or 1 on wrong results or an unwritable JSON file).
  int run() {
    const std::size_t max_count = bench::count_for(o_, o_.max_bytes, sizeof(float), ranks_);
    in_.assign(max_count, 0.0f);  // allocated and touched here, never in the timed loop
    out_.assign(max_count, 0.0f);
    bench::report rep(o_, library_name, library_version(), ranks_, settings(), rank_ == 0);
    rep.header();
    const std::vector<std::size_t> sweep = bench::sizes(o_);
    for (std::size_t s = 0; s < sweep.size(); ++s) {
      rep.progress(s, sweep.size(), sweep[s]);
      rep.add(measure(bench::count_for(o_, sweep[s], sizeof(float), ranks_)));
    }
    const bool written = rep.finish();
    return written && rep.total_wrong() == 0 ? 0 : 1;
  }

 private:
  static std::string settings() {
    const char* s = std::getenv("PLAIT_PEER_SETTINGS");
    return s != nullptr && *s != '\0' ? s : "not stated (launched without bench/peers/mpi/run.sh)";
  }

  // Element count of one rank's block; `count` is a multiple of the ranks when blocked.
  int block(std::size_t count) const { return static_cast<int>(count / static_cast<std::size_t>(ranks_)); }

  void once(std::size_t count) {
    const int n = static_cast<int>(count);
    if (o_.op == "all_reduce")
      MPI_Allreduce(in_.data(), out_.data(), n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    else if (o_.op == "all_gather")
      MPI_Allgather(in_.data(), block(count), MPI_FLOAT, out_.data(), block(count), MPI_FLOAT, MPI_COMM_WORLD);
    else if (o_.op == "reduce_scatter")
      MPI_Reduce_scatter_block(in_.data(), out_.data(), block(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    else  // broadcast, in place on the output buffer as plait-bench does
      MPI_Bcast(out_.data(), n, MPI_FLOAT, o_.root, MPI_COMM_WORLD);
  }

  void fill(std::size_t count) {
    for (std::size_t i = 0; i < count; ++i) in_[i] = value(rank_, i);
    const bool source = o_.op == "broadcast" && rank_ == o_.root;
    for (std::size_t i = 0; i < count; ++i) out_[i] = source ? value(o_.root, i) : sentinel;
  }

  float reduced(std::size_t i) const {
    float sum = 0;
    for (int r = 0; r < ranks_; ++r) sum += value(r, i);
    return sum;
  }

  long long wrong(std::size_t count) const {
    long long bad = 0;
    const auto b = static_cast<std::size_t>(block(count));
    if (o_.op == "all_reduce") {
      for (std::size_t i = 0; i < count; ++i) bad += differs(out_[i], reduced(i));
    } else if (o_.op == "all_gather") {
      for (std::size_t i = 0; i < count; ++i) bad += differs(out_[i], value(static_cast<int>(i / b), i % b));
    } else if (o_.op == "reduce_scatter") {
      const std::size_t first = static_cast<std::size_t>(rank_) * b;
      for (std::size_t i = 0; i < b; ++i) bad += differs(out_[i], reduced(first + i));
    } else {
      for (std::size_t i = 0; i < count; ++i) bad += differs(out_[i], value(o_.root, i));
    }
    return bad;
  }

  bench::row measure(std::size_t count) {
    bench::row r;
    r.count = count;
    r.bytes = count * sizeof(float);
    r.root = o_.op == "broadcast" ? o_.root : -1;
    fill(count);
    const bench::timed_calls t = bench::time_calls(
        o_.warmup, o_.iters, [&] { once(count); }, [] { MPI_Barrier(MPI_COMM_WORLD); });
    double faults = static_cast<double>(t.faults) / o_.iters;
    double med = bench::median(t.us());
    MPI_Allreduce(MPI_IN_PLACE, &med, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &faults, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    r.time_us = med;
    r.minflt = faults;
    r.calls_us = t.calls;
    if (o_.check) {
      fill(count);
      once(count);
      long long bad = wrong(count);
      MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
      r.wrong = bad;
    }
    return r;
  }

  const bench::options& o_;
  int rank_, ranks_;
  std::vector<float> in_, out_;
};

// What this bench cannot measure, or "" when the options are fine. Checked on every
// rank before MPI_Init, so all ranks refuse alike.
std::string refusal(const bench::options& o) {
  if (o.op != "all_reduce" && o.op != "all_gather" && o.op != "reduce_scatter" && o.op != "broadcast")
    return "collective " + o.op + " not measured here (all_reduce all_gather reduce_scatter broadcast)";
  if (o.type != "float") return "type " + o.type + " not measured here (float only)";
  if (o.redop != "sum") return "redop " + o.redop + " not measured here (sum only)";
  if (bench::count_for(o, o.max_bytes, sizeof(float), 1) > static_cast<std::size_t>(INT_MAX))
    return "-e too large: MPI counts are int";
  return "";
}

// Tells run.sh (PLAIT_PEER_DONE_FILE) that every rank has finished and what the exit
// status is, before MPI_Finalize: MPICH 4.0.2 (ch4:ucx) over UCX's TCP transport can
// deadlock in MPI_Finalize, one rank flushing its endpoints while its peers already
// wait in the PMI barrier (fixed upstream by pmodels/mpich#6596). run.sh then ends
// the stuck job and exits with this status instead of waiting for its timeout.
void report_done(int status) {
  const char* path = std::getenv("PLAIT_PEER_DONE_FILE");
  if (path == nullptr || *path == '\0') return;
  if (std::FILE* f = std::fopen(path, "w")) {
    std::fprintf(f, "%d\n", status);
    std::fclose(f);
  }
}

}  // namespace

int main(int argc, char** argv) {
  bench::options defaults;
  defaults.algo = "default";
  defaults.transport = "default";
  const bench::options o = bench::parse(argc, argv, defaults, extra_usage);
  if (const std::string why = refusal(o); !why.empty()) bench::usage(argv[0], why.c_str(), extra_usage);

  MPI_Init(&argc, &argv);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  int status = 2;
  if (o.root < 0 || o.root >= ranks) {
    if (rank == 0) std::fprintf(stderr, "%s: -R %d is not a rank (0..%d)\n", argv[0], o.root, ranks - 1);
  } else {
    status = mpi_bench(o, rank, ranks).run();
  }
  MPI_Barrier(MPI_COMM_WORLD);  // every rank is done: the results are final
  if (rank == 0) report_done(status);
  MPI_Finalize();
  return status;
}
