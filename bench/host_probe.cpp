// host-probe: how steady this machine is, for reading benchmark spreads.
//
// Usage: host-probe [seconds, default 10]
// Two measurements, one after the other, each taking about the given time:
//  1. gaps: one thread pinned to each CPU reads the clock in a loop; a gap between
//     two reads longer than 20 us is time the thread did not run. Gaps the guest's
//     scheduler made show as involuntary context switches; the others were taken by
//     interrupts or by the host (the vCPU did not run).
//  2. fixed work: every 50 ms, time the same integer loop (compute alone) and the
//     same 40 copies of 256 KiB (the cache and memory path): on a quiet host both
//     repeat within a few percent; a spread in the copies alone points at memory
//     shared with other tenants rather than at lost CPU time.
//  3. handoff (with 2 CPUs or more): a thread on CPU 0 fills a buffer, one on CPU 1
//     copies it out and answers, in lock-step, through a ring of 4 buffers (how a
//     slot crosses between ranks); and CPU 1 copying a buffer nobody writes (what a
//     benchmark's single copy of an unchanged buffer costs). Microseconds per call;
//     the ratio is what the crossing costs over a copy from the reader's own cache.
//  4. streamed (with 2 CPUs or more): the writer on CPU 0 runs ahead of the reader
//     on CPU 1 through a ring of 4 slots of 1 MiB (as a broadcast's root does with a
//     slot per call), filling each with plait's kernel::copy_bytes (plain stores) or
//     kernel::copy_bytes_streaming (non-temporal stores); the reader's median time
//     per slot. Where the streamed column is lower, a slot that size crosses to the
//     other core faster from memory than from the writer's cache
//     (shm_link_set::streams_slots).
// Run it on an otherwise idle machine; benchmark ratios are only comparable within
// one run on a machine whose copy times spread.
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include <plait/kernel/copy.hpp>

namespace {

std::uint64_t now_ns() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<std::uint64_t>(t.tv_sec) * 1000000000u + static_cast<std::uint64_t>(t.tv_nsec);
}

struct gap_stats {
  std::uint64_t over_20us = 0, over_100us = 0, over_1ms = 0, max_ns = 0, lost_ns = 0, total_ns = 0;
  long involuntary = 0;
  bool pinned = false;
};

// Runs the calling thread on `cpu` only; false if the system refused.
bool pin_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
}

gap_stats spin_for(int cpu, double seconds) {
  gap_stats s;
  s.pinned = pin_to(cpu);
  rusage before{};
  getrusage(RUSAGE_THREAD, &before);
  const std::uint64_t start = now_ns(), end = start + static_cast<std::uint64_t>(seconds * 1e9);
  std::uint64_t last = start;
  for (;;) {
    const std::uint64_t t = now_ns(), g = t - last;
    last = t;
    if (g > 20000) {
      ++s.over_20us;
      s.lost_ns += g;
      s.over_100us += g > 100000;
      s.over_1ms += g > 1000000;
      s.max_ns = std::max(s.max_ns, g);
    }
    if (t >= end) break;
  }
  rusage after{};
  getrusage(RUSAGE_THREAD, &after);
  s.total_ns = last - start;
  s.involuntary = after.ru_nivcsw - before.ru_nivcsw;
  return s;
}

struct spread {
  double min, median, p90, max;
};

spread summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const auto at = [&](double q) { return v[std::min(v.size() - 1, static_cast<std::size_t>(q * v.size()))]; };
  return {v.front(), at(0.5), at(0.9), v.back()};
}

// Microseconds per call of: the writer (on `from`) fills one of 4 buffers of `bytes`
// unless `stable`, then the reader (on `to`) copies it into its own; in lock-step.
double handoff_us(std::size_t bytes, bool stable, int from, int to) {
  constexpr int ring = 4, calls = 4000;
  std::vector<std::vector<char>> slots(ring, std::vector<char>(bytes, 1));
  std::vector<char> src(bytes, 2), dst(bytes);
  alignas(64) std::atomic<int> posted{0};
  alignas(64) std::atomic<int> taken{0};
  std::thread reader([&] {
    pin_to(to);
    for (int i = 1; i <= calls; ++i) {
      while (posted.load(std::memory_order_acquire) != i) __builtin_ia32_pause();
      std::memcpy(dst.data(), slots[static_cast<std::size_t>(i % ring)].data(), bytes);
      taken.store(i, std::memory_order_release);
    }
  });
  pin_to(from);
  std::uint64_t t0 = 0;
  for (int i = 1; i <= calls; ++i) {
    if (i == calls / 4 + 1) t0 = now_ns();  // the first quarter warms up
    if (!stable) std::memcpy(slots[static_cast<std::size_t>(i % ring)].data(), src.data(), bytes);
    posted.store(i, std::memory_order_release);
    while (taken.load(std::memory_order_acquire) != i) __builtin_ia32_pause();
  }
  const double us = static_cast<double>(now_ns() - t0) / 1e3 / (calls - calls / 4);
  reader.join();
  return us;
}

// The reader's median microseconds per slot: the writer (on `from`) fills slots of
// `bytes` in a ring of 4, up to 4 ahead of the reader (on `to`), which copies each out.
double streamed_us(std::size_t bytes, bool non_temporal, int from, int to) {
  constexpr int ring = 4, calls = 3000;
  constexpr std::size_t stride = std::size_t{1} << 20;
  std::vector<char> slots(ring * stride, 1), src(bytes, 2), dst(bytes);
  alignas(64) std::atomic<int> posted{0};
  alignas(64) std::atomic<int> taken{0};
  std::vector<double> us;
  us.reserve(calls);
  std::thread reader([&] {
    pin_to(to);
    for (int i = 1; i <= calls; ++i) {
      const std::uint64_t t0 = now_ns();
      while (posted.load(std::memory_order_acquire) < i) __builtin_ia32_pause();
      plait::kernel::copy_bytes(dst.data(), &slots[static_cast<std::size_t>(i % ring) * stride], bytes);
      taken.store(i, std::memory_order_release);
      if (i > calls / 4) us.push_back(static_cast<double>(now_ns() - t0) / 1e3);  // the first quarter warms up
    }
  });
  pin_to(from);
  for (int i = 1; i <= calls; ++i) {
    while (i - taken.load(std::memory_order_acquire) > ring) __builtin_ia32_pause();
    char* slot = &slots[static_cast<std::size_t>(i % ring) * stride];
    if (non_temporal)
      plait::kernel::copy_bytes_streaming(slot, src.data(), bytes);
    else
      plait::kernel::copy_bytes(slot, src.data(), bytes);
    posted.store(i, std::memory_order_release);
  }
  reader.join();
  return summarize(us).median;
}

}  // namespace

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? std::atof(argv[1]) : 10.0;
  if (!(seconds > 0) || seconds > 3600) {
    std::fprintf(stderr, "usage: host-probe [seconds, 0 < s <= 3600; default 10]\n");
    return 2;
  }
  const int cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));

  std::printf("# 1. gaps in a clock-reading loop, one thread pinned per CPU, %.0f s\n", seconds);
  std::printf("%-5s %10s %10s %8s %10s %8s %12s\n", "cpu", ">20us/s", ">100us/s", ">1ms/s", "max(us)", "lost%",
              "guest-csw/s");
  std::vector<gap_stats> stats(static_cast<std::size_t>(cpus));
  std::vector<std::thread> threads;
  for (int c = 0; c < cpus; ++c)
    threads.emplace_back([&, c] { stats[static_cast<std::size_t>(c)] = spin_for(c, seconds); });
  for (auto& t : threads) t.join();
  for (int c = 0; c < cpus; ++c) {
    const gap_stats& s = stats[static_cast<std::size_t>(c)];
    const double secs = static_cast<double>(s.total_ns) / 1e9;
    std::printf("%-5d %10.1f %10.1f %8.2f %10.1f %8.2f %12.1f%s\n", c, s.over_20us / secs, s.over_100us / secs,
                s.over_1ms / secs, s.max_ns / 1e3, 100.0 * static_cast<double>(s.lost_ns) / s.total_ns,
                s.involuntary / secs, s.pinned ? "" : "  (not pinned)");
  }

  const int samples = std::max(10, static_cast<int>(seconds * 1000 / 60));
  std::printf("\n# 2. fixed work every 50 ms, %d samples (us per sample)\n", samples);
  std::vector<char> a(256 << 10, 1), b(256 << 10);
  std::vector<double> alu, copy;
  volatile std::uint64_t sink = 0;
  for (int i = 0; i < samples; ++i) {
    const std::uint64_t t0 = now_ns();
    std::uint64_t x = static_cast<std::uint64_t>(i);
    for (int k = 0; k < 2000000; ++k) x = x * 6364136223846793005u + 1442695040888963407u;
    sink = sink + x;
    const std::uint64_t t1 = now_ns();
    for (int k = 0; k < 40; ++k) {
      std::memcpy(b.data(), a.data(), a.size());
      a[static_cast<std::size_t>(k)] = b[static_cast<std::size_t>(k) + 1];
    }
    const std::uint64_t t2 = now_ns();
    alu.push_back(static_cast<double>(t1 - t0) / 1e3);
    copy.push_back(static_cast<double>(t2 - t1) / 1e3);
    usleep(50000);
  }
  std::printf("%-22s %9s %9s %9s %9s %9s\n", "work", "min", "median", "p90", "max", "p90/min");
  for (auto [name, v] : {std::pair{"integer loop", &alu}, std::pair{"40 x memcpy 256 KiB", &copy}}) {
    const spread s = summarize(*v);
    std::printf("%-22s %9.0f %9.0f %9.0f %9.0f %9.2f\n", name, s.min, s.median, s.p90, s.max, s.p90 / s.min);
  }

#if defined(__x86_64__) || defined(__i386__)
  if (cpus >= 2) {
    std::printf("\n# 3. handoff from CPU 0 to CPU 1, lock-step (us per call; median of 5)\n");
    std::printf("%-10s %18s %18s %8s\n", "bytes", "written, read", "read only", "ratio");
    for (std::size_t bytes :
         {std::size_t{16} << 10, std::size_t{64} << 10, std::size_t{256} << 10, std::size_t{1} << 20}) {
      std::vector<double> moved, read;
      for (int r = 0; r < 5; ++r) {
        moved.push_back(handoff_us(bytes, false, 0, 1));
        read.push_back(handoff_us(bytes, true, 0, 1));
      }
      const double m = summarize(moved).median, o = summarize(read).median;
      std::printf("%-10zu %18.2f %18.2f %8.2f\n", bytes, m, o, m / o);
    }
    std::printf("\n# 4. streamed from CPU 0 to CPU 1, the writer ahead by up to 4 slots (reader's us per slot)\n");
    std::printf("%-10s %18s %18s %8s\n", "bytes", "plain stores", "non-temporal", "ratio");
    for (std::size_t bytes :
         {std::size_t{4} << 10, std::size_t{16} << 10, std::size_t{64} << 10, std::size_t{128} << 10,
          std::size_t{256} << 10, std::size_t{512} << 10, std::size_t{1} << 20}) {
      std::vector<double> plain, nt;
      for (int r = 0; r < 3; ++r) {  // alternating, so both see the same stretch of the host
        plain.push_back(streamed_us(bytes, false, 0, 1));
        nt.push_back(streamed_us(bytes, true, 0, 1));
      }
      const double p = summarize(plain).median, q = summarize(nt).median;
      std::printf("%-10zu %18.2f %18.2f %8.2f\n", bytes, p, q, p / q);
    }
  }
#endif
  return 0;
}
