// plait-soak: a long random sequence of collectives, each checked bit for bit, and a
// check that the process's memory and file descriptors stay flat.
//
//   plaitrun -n 4 plait-soak -t shm|tcp|hybrid -n 10000 [-s seed] [-m max_bytes]
//
// Every rank draws the same sequence from the seed: all_reduce (ring, tree, automatic;
// in place and out of place), batches of up to 4 _async collectives in flight,
// all_gather, reduce_scatter, broadcast and reduce (random root), all_to_all, send/recv
// (one random pair, or every rank sending to the rank `shift` ahead), and barrier; on
// float, int32, bfloat16, double or uint8 with an op valid for the type; counts
// log-uniform in [0, max_bytes / sizeof(T)]; spans start 0..3 elements into their
// buffer, so starts off 16-byte alignment are covered. Outputs are poisoned first and the poison
// must survive around the output span (and on reduce's non-roots); inputs of
// out-of-place calls must come back unchanged. The first wrong element ends the run
// (exit 1) with the call's index and description, the rank, element, expected and got.
//
// After a warm-up (the first 100 calls) and at the end, each rank reads its resident
// set (/proc/self/statm) and open descriptors (/proc/self/fd). The run fails if the
// descriptors grew at all or the resident set grew by more than 10% + 8 MiB.
// Progress goes to stderr (rank 0, every 1000 calls); the verdict to stdout.
// -x INDEX corrupts one output bit on purpose, to show the checks catch it. With -t
// hybrid and no PLAIT_HOST_ID, ranks are put on two pretend hosts (local rank % 2), so
// both shm and tcp links carry traffic.
#include <plait/plait.hpp>
#include <plait/transport/hybrid.hpp>
#include <plait/transport/shm.hpp>
#include <plait/transport/tcp.hpp>

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "soak_reference.hpp"
#include "soak_sequence.hpp"

namespace {

using namespace plait::soak;

// ---- process measurements ----------------------------------------------------------

std::size_t resident_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  unsigned long long size = 0, resident = 0;
  if (f) {
    if (std::fscanf(f, "%llu %llu", &size, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return static_cast<std::size_t>(resident) * static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
}

// The directory iterator's own descriptor is counted too, the same at both readings.
long open_fds() {
  long n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

double mib(std::size_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

// ---- running and checking ------------------------------------------------------------

// Byte buffers for one call in flight; the spans start `offset` elements in and are
// followed by guard elements that must keep the poison.
constexpr std::size_t guard_elems = 8;
struct slot {
  std::vector<std::byte> in, out;
};

template <class F>
void with_type(elem e, F&& f) {
  switch (e) {
    case elem::f32:
      return f.template operator()<float>();
    case elem::i32:
      return f.template operator()<std::int32_t>();
    case elem::bf16:
      return f.template operator()<plait::bfloat16>();
    case elem::f64:
      return f.template operator()<double>();
    case elem::u8:
      return f.template operator()<std::uint8_t>();
  }
}

template <class T, class F>
void with_op(redop o, F&& f) {
  switch (o) {
    case redop::sum:
      return f.template operator()<plait::sum>();
    case redop::prod:
      return f.template operator()<plait::prod>();
    case redop::min:
      return f.template operator()<plait::min>();
    case redop::max:
      return f.template operator()<plait::max>();
    case redop::avg:
      return f.template operator()<plait::avg>();
    default:
      break;
  }
  if constexpr (std::is_integral_v<T>) {
    switch (o) {
      case redop::band:
        return f.template operator()<plait::band>();
      case redop::bor:
        return f.template operator()<plait::bor>();
      case redop::bxor:
        return f.template operator()<plait::bxor>();
      default:
        break;
    }
  }
  std::fprintf(stderr, "plait-soak: internal error: op %s drawn for a non-integer type\n", name(o));
  std::_Exit(2);
}

template <class F>
void with_algo(algo a, F&& f) {
  switch (a) {
    case algo::automatic:
      return f.template operator()<plait::automatic>();
    case algo::ring:
      return f.template operator()<plait::ring>();
    case algo::tree:
      return f.template operator()<plait::tree>();
  }
}

template <class Comm>
class soak_run {
 public:
  // corrupt_at: flip a bit of an output on the last rank at the first call from this
  // index on that writes one there, to show that the checks catch it (-1: never).
  soak_run(Comm& comm, std::uint64_t seed, std::size_t max_bytes, long long corrupt_at)
      : comm_(comm), rank_(comm.rank()), n_(comm.size()), seed_(seed), corrupt_at_(corrupt_at) {
    const std::size_t size = max_bytes + (3 + guard_elems) * sizeof(double);
    for (auto& s : slots_) {
      s.in.assign(size, std::byte{0});  // touched now, before the first measurement
      s.out.assign(size, std::byte{0});
    }
  }

  // Runs a batch: issues every call (each on its own slot), then waits for and checks
  // each, in reverse order for batches of even size (requests may be waited on in any order).
  void run(const std::vector<step>& batch) {
    std::vector<plait::request> reqs;
    std::vector<std::size_t> owner;  // reqs[k] belongs to batch[owner[k]]
    reqs.reserve(2 * batch.size());
    for (std::size_t j = 0; j < batch.size(); ++j) {
      current_ = batch[j];
      with_type(batch[j].type, [&]<class T>() { issue<T>(batch[j], slots_[j], reqs); });
      owner.resize(reqs.size(), j);
    }
    for (std::size_t k = 0; k < reqs.size(); ++k) {
      const std::size_t q = batch.size() % 2 == 0 ? reqs.size() - 1 - k : k;
      current_ = batch[owner[q]];
      reqs[q].wait();
    }
    for (std::size_t j = 0; j < batch.size(); ++j) {
      current_ = batch[j];
      with_type(batch[j].type, [&]<class T>() {
        corrupt_if_asked<T>(batch[j], slots_[j]);
        check<T>(batch[j], slots_[j]);
      });
      calls_per_kind[static_cast<std::size_t>(batch[j].what)] += 1;
      bytes_per_kind[static_cast<std::size_t>(batch[j].what)] += batch[j].count * size_of(batch[j].type);
    }
  }

  // The call being issued, waited for or checked (for error reports).
  const std::optional<step>& current() const { return current_; }

  // Calls and bytes of the largest buffer per collective, for the summary.
  std::array<std::size_t, 8> calls_per_kind{}, bytes_per_kind{};

 private:
  template <class T>
  static T* at(std::vector<std::byte>& b, const step& s) {
    return reinterpret_cast<T*>(b.data()) + s.offset;
  }

  template <class T>
  static T poison(const step& s) {
    T v;
    std::memset(&v, s.poison, sizeof v);
    return v;
  }

  // Elements written by this call on this rank (the output span), 0 for none.
  std::size_t out_count(const step& s) const {
    const auto n = static_cast<std::size_t>(n_);
    switch (s.what) {
      case kind::all_gather:
      case kind::all_to_all:
        return s.count / n * n;
      case kind::reduce_scatter:
        return s.count / n;
      case kind::send_recv:
        return receives_from(s) >= 0 ? s.count : 0;
      case kind::barrier:
        return 0;
      default:
        return s.count;
    }
  }

  int receives_from(const step& s) const {
    if (s.peer >= 0) return rank_ == s.peer ? s.root : -1;
    return (rank_ - s.shift + n_) % n_;
  }
  int sends_to(const step& s) const {
    if (s.peer >= 0) return rank_ == s.root ? s.peer : -1;
    return (rank_ + s.shift) % n_;
  }

  template <class T>
  void corrupt_if_asked(const step& s, slot& sl) {
    const std::size_t written = out_count(s);
    if (corrupt_at_ < 0 || static_cast<long long>(s.index) < corrupt_at_ || rank_ != n_ - 1 || written == 0) return;
    std::byte* b = reinterpret_cast<std::byte*>(at<T>(sl.out, s) + written / 2);
    *b ^= std::byte{0x10};
    std::fprintf(stderr, "plait-soak: -x: flipped a bit of element %zu of the output of %s on rank %d\n", written / 2,
                 describe(s).c_str(), rank_);
    corrupt_at_ = -1;
  }

  template <class T>
  void issue(const step& s, slot& sl, std::vector<plait::request>& reqs) {
    if (s.what == kind::barrier) {
      if (s.async)
        reqs.push_back(plait::barrier_async(comm_));
      else
        plait::barrier(comm_);
      return;
    }
    const auto n = static_cast<std::size_t>(n_);
    const std::size_t block = s.count / n;
    T* in = at<T>(sl.in, s);
    T* out = at<T>(sl.out, s);
    // Poison the whole output region, guards included.
    std::memset(sl.out.data(), s.poison, (s.offset + s.count + guard_elems) * sizeof(T));
    auto launch = [&](auto&& sync_call, auto&& async_call) {
      if (s.async)
        reqs.push_back(async_call());
      else
        sync_call();
    };
    switch (s.what) {
      case kind::all_reduce:
        with_op<T>(s.op, [&]<class Op>() {
          const auto& t = table_for<T, Op>(n_);
          T* src = s.in_place ? out : in;
          for (std::size_t i = 0; i < s.count; ++i) src[i] = t.in(rank_, s.seed % 1024 + i);
          with_algo(s.alg, [&]<class A>() {
            std::span<T> o(out, s.count);
            if (s.in_place)
              launch([&] { plait::all_reduce<A>(comm_, o, Op{}); },
                     [&] { return plait::all_reduce_async<A>(comm_, o, Op{}); });
            else
              launch([&] { plait::all_reduce<A>(comm_, std::span<const T>(in, s.count), o, Op{}); },
                     [&] { return plait::all_reduce_async<A>(comm_, std::span<const T>(in, s.count), o, Op{}); });
          });
        });
        break;
      case kind::reduce_scatter:
        with_op<T>(s.op, [&]<class Op>() {
          const auto& t = table_for<T, Op>(n_);
          for (std::size_t i = 0; i < block * n; ++i) in[i] = t.in(rank_, s.seed % 1024 + i);
          std::span<const T> full(in, block * n);
          std::span<T> shard(out, block);
          launch([&] { plait::reduce_scatter<plait::ring>(comm_, full, shard, Op{}); },
                 [&] { return plait::reduce_scatter_async<plait::ring>(comm_, full, shard, Op{}); });
        });
        break;
      case kind::reduce:
        with_op<T>(s.op, [&]<class Op>() {
          const auto& t = table_for<T, Op>(n_);
          for (std::size_t i = 0; i < s.count; ++i) in[i] = t.in(rank_, s.seed % 1024 + i);
          std::span<const T> src(in, s.count);
          std::span<T> dst(out, s.count);
          launch([&] { plait::reduce<plait::tree>(comm_, src, dst, Op{}, s.root); },
                 [&] { return plait::reduce_async<plait::tree>(comm_, src, dst, Op{}, s.root); });
        });
        break;
      case kind::all_gather: {
        for (std::size_t i = 0; i < block; ++i) in[i] = move_value<T>(s.seed, rank_, i);
        std::span<const T> shard(in, block);
        std::span<T> full(out, block * n);
        launch([&] { plait::all_gather<plait::ring>(comm_, shard, full); },
               [&] { return plait::all_gather_async<plait::ring>(comm_, shard, full); });
        break;
      }
      case kind::broadcast: {
        if (rank_ == s.root)
          for (std::size_t i = 0; i < s.count; ++i) out[i] = move_value<T>(s.seed, s.root, i);
        with_algo(s.alg, [&]<class A>() {
          std::span<T> buf(out, s.count);
          launch([&] { plait::broadcast<A>(comm_, buf, s.root); },
                 [&] { return plait::broadcast_async<A>(comm_, buf, s.root); });
        });
        break;
      }
      case kind::all_to_all: {
        for (std::size_t i = 0; i < block * n; ++i) in[i] = move_value<T>(s.seed, rank_, i);
        std::span<const T> src(in, block * n);
        std::span<T> dst(out, block * n);
        launch([&] { plait::all_to_all(comm_, src, dst); }, [&] { return plait::all_to_all_async(comm_, src, dst); });
        break;
      }
      case kind::send_recv: {
        const int to = sends_to(s), from = receives_from(s);
        for (std::size_t i = 0; to >= 0 && i < s.count; ++i) in[i] = move_value<T>(s.seed, rank_, i);
        std::span<const T> src(in, s.count);
        std::span<T> dst(out, s.count);
        if (to >= 0 && from >= 0) {  // exchange: the send must not block the receive
          reqs.push_back(plait::send_async(comm_, src, to));
          if (s.async)
            reqs.push_back(plait::recv_async(comm_, dst, from));
          else
            plait::recv(comm_, dst, from);
        } else if (to >= 0) {
          launch([&] { plait::send(comm_, src, to); }, [&] { return plait::send_async(comm_, src, to); });
        } else if (from >= 0) {
          launch([&] { plait::recv(comm_, dst, from); }, [&] { return plait::recv_async(comm_, dst, from); });
        }
        break;
      }
      case kind::barrier:
        break;
    }
  }

  template <class T, class Want>
  void expect(const step& s, const char* what, const T* got, std::size_t count, Want want) const {
    for (std::size_t i = 0; i < count; ++i) {
      const T w = want(i);
      if (!same_bits(got[i], w)) {
        std::fflush(stdout);
        std::fprintf(stderr, "plait-soak: FAILED at %s (seed %llu): %s: rank %d, element %zu: expected %s, got %s\n",
                     describe(s).c_str(), static_cast<unsigned long long>(seed_), what, rank_, i, show(w).c_str(),
                     show(got[i]).c_str());
        std::fflush(stderr);
        std::_Exit(1);
      }
    }
  }

  template <class T>
  void check(const step& s, slot& sl) {
    if (s.what == kind::barrier) return;
    const auto n = static_cast<std::size_t>(n_);
    const std::size_t block = s.count / n;
    const T* in = at<T>(sl.in, s);
    const T* out = at<T>(sl.out, s);
    const T p = poison<T>(s);
    auto is_poison = [&](std::size_t) { return p; };
    const std::size_t written = out_count(s);
    // Nothing written before or after the output span.
    expect(s, "output buffer before the span", reinterpret_cast<const T*>(sl.out.data()), s.offset, is_poison);
    expect(s, "guard after the output span", out + written, guard_elems, is_poison);
    switch (s.what) {
      case kind::all_reduce:
        with_op<T>(s.op, [&]<class Op>() {
          const auto& t = table_for<T, Op>(n_);
          const std::size_t base = s.seed % 1024;
          expect(s, "result", out, s.count, [&](std::size_t i) { return t.out(base + i); });
          if (!s.in_place)
            expect(s, "input (must be unchanged)", in, s.count, [&](std::size_t i) { return t.in(rank_, base + i); });
        });
        break;
      case kind::reduce_scatter:
        with_op<T>(s.op, [&]<class Op>() {
          const auto& t = table_for<T, Op>(n_);
          const std::size_t base = s.seed % 1024 + static_cast<std::size_t>(rank_) * block;
          expect(s, "shard", out, block, [&](std::size_t i) { return t.out(base + i); });
          expect(s, "input (must be unchanged)", in, block * n,
                 [&](std::size_t i) { return t.in(rank_, s.seed % 1024 + i); });
        });
        break;
      case kind::reduce:
        with_op<T>(s.op, [&]<class Op>() {
          const auto& t = table_for<T, Op>(n_);
          const std::size_t base = s.seed % 1024;
          if (rank_ == s.root)
            expect(s, "result at the root", out, s.count, [&](std::size_t i) { return t.out(base + i); });
          else
            expect(s, "output of a non-root (must be untouched)", out, s.count, is_poison);
          expect(s, "input (must be unchanged)", in, s.count, [&](std::size_t i) { return t.in(rank_, base + i); });
        });
        break;
      case kind::all_gather:
        expect(s, "gathered", out, block * n,
               [&](std::size_t i) { return move_value<T>(s.seed, static_cast<int>(i / block), i % block); });
        expect(s, "input (must be unchanged)", in, block,
               [&](std::size_t i) { return move_value<T>(s.seed, rank_, i); });
        break;
      case kind::broadcast:
        expect(s, "broadcast buffer", out, s.count, [&](std::size_t i) { return move_value<T>(s.seed, s.root, i); });
        break;
      case kind::all_to_all:
        expect(s, "received blocks", out, block * n, [&](std::size_t i) {
          return move_value<T>(s.seed, static_cast<int>(i / block),
                               static_cast<std::size_t>(rank_) * block + i % block);
        });
        expect(s, "input (must be unchanged)", in, block * n,
               [&](std::size_t i) { return move_value<T>(s.seed, rank_, i); });
        break;
      case kind::send_recv: {
        const int to = sends_to(s), from = receives_from(s);
        if (from >= 0)
          expect(s, "received", out, s.count, [&](std::size_t i) { return move_value<T>(s.seed, from, i); });
        if (to >= 0)
          expect(s, "sent buffer (must be unchanged)", in, s.count,
                 [&](std::size_t i) { return move_value<T>(s.seed, rank_, i); });
        break;
      }
      case kind::barrier:
        break;
    }
  }

  Comm& comm_;
  int rank_, n_;
  std::uint64_t seed_;  // of the sequence, for reports
  long long corrupt_at_;
  std::array<slot, max_in_flight> slots_;
  std::optional<step> current_;
};

// ---- the program ---------------------------------------------------------------------

struct options {
  std::string transport = "shm";
  std::size_t count = 10000;
  std::uint64_t seed = 1;
  std::size_t max_bytes = 1u << 20;
  long long corrupt_at = -1;
};

[[noreturn]] void usage(const std::string& msg) {
  std::fprintf(stderr,
               "plait-soak: %s\n"
               "usage: plait-soak [-t shm|tcp|hybrid] [-n collectives] [-s seed] [-m max_bytes] [-x index]\n"
               "  defaults: -t shm -n 10000 -s 1 -m 1M (K, M suffixes accepted)\n"
               "  -x index: flip a bit of one output on the last rank at call `index` or the next one\n"
               "            that writes there, to check that the soak catches it (it must exit 1)\n"
               "  launch with: plaitrun -n 4 plait-soak ...\n",
               msg.c_str());
  std::exit(2);
}

std::uint64_t parse_number(const std::string& flag, const char* v, bool suffixes) {
  char* end = nullptr;
  errno = 0;
  unsigned long long x = std::strtoull(v, &end, 10);
  if (end == v || errno != 0 || *v == '-') usage("bad value '" + std::string(v) + "' for " + flag);
  if (suffixes && (*end == 'K' || *end == 'k')) x <<= 10, ++end;
  if (suffixes && (*end == 'M' || *end == 'm')) x <<= 20, ++end;
  if (*end != '\0') usage("bad value '" + std::string(v) + "' for " + flag);
  return x;
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") usage("help");
    if (i + 1 >= argc) usage("missing value for " + a);
    const char* v = argv[++i];
    if (a == "-t")
      o.transport = v;
    else if (a == "-n")
      o.count = parse_number(a, v, false);
    else if (a == "-s")
      o.seed = parse_number(a, v, false);
    else if (a == "-m")
      o.max_bytes = parse_number(a, v, true);
    else if (a == "-x")
      o.corrupt_at = static_cast<long long>(parse_number(a, v, false));
    else
      usage("unknown option " + a);
  }
  if (o.transport != "shm" && o.transport != "tcp" && o.transport != "hybrid")
    usage("unknown transport '" + o.transport + "'");
  if (o.count < 1) usage("-n must be at least 1");
  if (o.max_bytes > (std::size_t{1} << 30)) usage("-m is limited to 1G");
  return o;
}

template <class Comm>
int soak(Comm& comm, const options& o) {
  const int rank = comm.rank(), n = comm.size();
  if (rank == 0 && n > 8)
    std::fprintf(stderr, "plait-soak: note: the exact-reduction patterns are exact for up to 8 ranks only\n");
  soak_run<Comm> runner(comm, o.seed, o.max_bytes, o.corrupt_at);
  rng r{o.seed};
  const std::size_t warmup = std::min<std::size_t>(100, o.count / 2);
  std::size_t done = 0, rss_start = 0;
  long fds_start = 0;
  bool measured = false;
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(clock::now() - t0).count(); };
  try {
    while (done < o.count) {
      auto batch = draw(r, n, o.max_bytes, o.count - done);
      for (std::size_t j = 0; j < batch.size(); ++j) batch[j].index = done + j;
      runner.run(batch);
      const std::size_t before = done;
      done += batch.size();
      if (!measured && done >= warmup) {
        rss_start = resident_bytes();
        fds_start = open_fds();
        measured = true;
      }
      if (rank == 0 && done / 1000 != before / 1000) {
        std::fprintf(stderr, "soak: %zu/%zu (%.1f s)\n", done, o.count, seconds());
        std::fflush(stderr);
      }
    }
  } catch (const plait::error& e) {
    const auto& s = runner.current();
    std::fprintf(stderr, "plait-soak: FAILED at %s (seed %llu): %s\n", s ? describe(*s).c_str() : "set-up",
                 static_cast<unsigned long long>(o.seed), e.what());
    return 1;
  }
  const double elapsed = seconds();
  const std::size_t rss_end = resident_bytes();
  const long fds_end = open_fds();
  const double limit = static_cast<double>(rss_start) * 1.10 + 8.0 * 1024 * 1024;
  const bool rss_bad = static_cast<double>(rss_end) > limit;
  const bool fds_bad = fds_end > fds_start;
  std::printf("soak: rank %d: rss %.1f -> %.1f MiB, fds %ld -> %ld%s%s\n", rank, mib(rss_start), mib(rss_end),
              fds_start, fds_end, rss_bad ? " (RSS GREW TOO MUCH)" : "", fds_bad ? " (FDS GREW)" : "");
  std::fflush(stdout);

  // Everyone's verdict and the largest readings, for rank 0's summary.
  std::int64_t v[5] = {rss_bad || fds_bad, static_cast<std::int64_t>(rss_start), static_cast<std::int64_t>(rss_end),
                       fds_start, fds_end};
  try {
    plait::all_reduce<plait::ring>(comm, std::span<std::int64_t>(v, 5), plait::max{});
  } catch (const plait::error& e) {
    std::fprintf(stderr, "plait-soak: FAILED gathering the verdict: %s\n", e.what());
    return 1;
  }
  if (rank == 0) {
    if (v[0]) {
      std::printf("soak FAILED: resources grew over %s (see the rank lines above)\n", o.transport.c_str());
    } else {
      std::string tally;
      for (std::size_t k = 0; k < runner.calls_per_kind.size(); ++k)
        tally += std::string(k ? ", " : "") + name(static_cast<kind>(k)) + " " +
                 std::to_string(runner.calls_per_kind[k]) + " (" + std::to_string(runner.bytes_per_kind[k] >> 20) +
                 " MiB)";
      std::printf("soak: calls (and bytes) per collective: %s\n", tally.c_str());
      std::printf("soak ok: %zu collectives over %s, %.1f s, rss %.1f/%.1f MiB, fds %lld/%lld (max over %d ranks)\n",
                  o.count, o.transport.c_str(), elapsed, mib(static_cast<std::size_t>(v[1])),
                  mib(static_cast<std::size_t>(v[2])), static_cast<long long>(v[3]), static_cast<long long>(v[4]), n);
    }
    std::fflush(stdout);
  }
  return (rss_bad || fds_bad || (rank == 0 && v[0])) ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  const options o = parse(argc, argv);
  try {
    if (o.transport == "shm") {
      auto c = plait::communicator<plait::transport::shm>::from_env();
      return soak(c, o);
    }
    if (o.transport == "tcp") {
      auto c = plait::communicator<plait::transport::tcp>::from_env();
      return soak(c, o);
    }
    // hybrid: two pretend hosts (even and odd local ranks) unless the environment says.
    if (const char* id = std::getenv("PLAIT_HOST_ID"); !id || !*id) {
      const char* local = std::getenv("PLAIT_LOCAL_RANK");
      if (!local) local = std::getenv("PLAIT_RANK");
      const int lr = local ? std::atoi(local) : 0;
      const std::string host = "soak-host-" + std::to_string(lr % 2);
      setenv("PLAIT_HOST_ID", host.c_str(), 1);
      if (lr == 0)
        std::fprintf(stderr,
                     "plait-soak: PLAIT_HOST_ID not set: ranks split into two pretend hosts by local rank %% 2\n");
    }
    using mixed = plait::transport::hybrid<plait::transport::shm, plait::transport::tcp>;
    auto c = plait::communicator<mixed>::from_env();
    return soak(c, o);
  } catch (const plait::error& e) {
    std::fprintf(stderr, "plait-soak: %s\n", e.what());
    return 1;
  }
}
