// shm-ceiling: how fast N processes on this host do what an N-rank collective must do
// over shared memory with the benchmark's own buffers, per size: no library, only the
// bytes, by the fastest ways one process can get at another's memory here. The
// ceiling plait's shm transport (or any library on one host) works under here.
//
// Usage: shm-ceiling [-N ranks] [common bench options: -o -b -e -f -w -n -c -J ...]
// N processes (default 2), bound as plaitrun binds ranks: one CPU each where there are
// enough, else round robin (rank r on CPU r mod C); with more ranks than CPUs every
// setting also runs not bound (left to the scheduler), and the faster counts. Each owns
// its input and output in private memory, allocated as a benchmark allocates them
// (malloc: 4 KiB pages, or transparent huge pages under
// GLIBC_TUNABLES=glibc.malloc.hugetlb=1, as the peers' +hugetlb runs), so no
// mechanism may assume the user's buffers are shared. A rank gets at another's bytes
// either with the kernel's single copy (CMA: process_vm_readv, what Open MPI's vader
// and UCX use on one host), or through a shared-memory area both map (the owner copies
// in, the reader copies out). With S bytes in N blocks per call (all_reduce's last block
// takes what does not divide):
//   all_gather      out of place: the own block copied into the output, each other
//                   block read from its owner: CMA into the output, or through shared
//                   memory (every rank copies its block in, then the others' out);
//   broadcast       every rank but 0 gets rank 0's S bytes: CMA from rank 0's buffer,
//                   or a pipeline through shared memory (rank 0 copies chunks into 4
//                   slots, the others copy each out as it lands);
//   reduce_scatter  rank r's output is the float sum of block r of every input: each
//                   other input's block read by CMA, a chunk at a time into a buffer
//                   that stays in cache, and summed on; or through shared memory;
//   all_reduce      the reduce_scatter above, then the all_gather of the sums.
// A call starts with a barrier (the inputs are ready) and ends with one (no one still
// reads a buffer its owner may change), in shared memory: spin briefly, then yield.
// Each size runs under every setting of a grid and the best is reported:
//   mechanism   CMA in reads of 256K, 1M, 4M or the whole payload, or shared memory
//               (broadcast: slots of 64K, 256K or 1M);
//   copy        how the user-space copies into the output go: glibc's memcpy, plait's
//               copy loop (kernel::copy_bytes), or non-temporal stores
//               (kernel::copy_bytes_streaming).
// Times and busbw as every benchmark in bench/ (bench_report.hpp): each rank's median
// over the timed calls, the maximum over ranks, nccl-tests' bus factors; the setting
// that won is printed after each row. With -c 1 (the default) every setting's output
// is checked after its timed calls and #wrong is the count of wrong elements over all
// settings and ranks; the exit status is 1 if any was wrong. Every wait is bounded (30 s):
// a stuck or dead rank is an error, not a hang.
#include <sched.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <new>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <plait/kernel/copy.hpp>

#include "bench_report.hpp"
#include "ranks.hpp"

namespace {

using bench::ranks::die;
using bench::ranks::max_ranks;

constexpr int depth = 4;  // broadcast pipeline slots
// CMA reads of these sizes, then of the whole payload in one call (as a peer may read it).
constexpr std::size_t cma_chunks[] = {std::size_t{256} << 10, std::size_t{1} << 20, std::size_t{4} << 20,
                                      ~std::size_t{0}};
constexpr std::size_t slot_chunks[] = {std::size_t{64} << 10, std::size_t{256} << 10, std::size_t{1} << 20};
constexpr std::size_t sum_piece = std::size_t{256} << 10;  // summed at a time through shared memory

enum class copier { memcpy_, loop, streaming };
constexpr copier copiers[] = {copier::memcpy_, copier::loop, copier::streaming};

const char* name(copier c) {
  return c == copier::memcpy_ ? "memcpy" : c == copier::loop ? "copy loop" : "non-temporal stores";
}

void copy(copier c, void* d, const void* s, std::size_t n) {
  if (c == copier::memcpy_) std::memcpy(d, s, n);
  if (c == copier::loop) plait::kernel::copy_bytes(d, s, n);
  if (c == copier::streaming) plait::kernel::copy_bytes_streaming(d, s, n);
}

struct setting {
  bool cma = true;
  std::size_t chunk = 0;  // a CMA read, or a broadcast slot
  copier how = copier::memcpy_;
  bool copies = true;  // whether `how` is used (a CMA reduce or broadcast copies nothing itself)

  std::string text() const {
    std::string s = cma ? "CMA, reads of " : "shared memory";
    if (cma || chunk > 0) s += (cma ? "" : ", slots of ") + std::to_string(chunk >> 10) + "K";
    if (copies) s += std::string(", ") + name(how);
    return s;
  }
};

struct alignas(64) counter {
  std::atomic<std::uint64_t> v{0};
};

// Mapped shared before the fork: the barrier, the broadcast pipeline's counters, and
// where each rank's buffers are (for CMA).
struct shared_block {
  counter arrived, generation;
  counter written;              // broadcast: chunks rank 0 has put in the slots
  counter consumed[max_ranks];  // broadcast: chunks each other rank has taken out
  pid_t pid[max_ranks] = {};
  std::uintptr_t src[max_ranks] = {}, dst[max_ranks] = {};
};

template <class Ready>
void wait_for(Ready&& ready, bool may_spin) {
  for (int i = 0; i < (may_spin ? 1 << 14 : 64); ++i) {
    if (ready()) return;
#if defined(__x86_64__)
    _mm_pause();
#endif
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (unsigned k = 1;; ++k) {
    if (ready()) return;
    ::sched_yield();
    if (k % 256 == 0 && std::chrono::steady_clock::now() > deadline) {
      errno = ETIMEDOUT;
      die("no progress for 30 s (another rank stopped?)");
    }
  }
}

// out[i] = a[i] + b[i] (out may be a): the one reduce pass (vectorised at -O3).
void add(float* out, const float* a, const float* b, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

// Reads n bytes at `from` in process pid into `to`, in reads of at most `chunk`.
void cma_read(pid_t pid, char* to, std::uintptr_t from, std::size_t n, std::size_t chunk) {
  while (n > 0) {
    const std::size_t k = std::min(n, chunk);
    iovec local{to, k};
    iovec remote{reinterpret_cast<void*>(from), k};
    const ssize_t got = ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (got <= 0) die("process_vm_readv (CMA; ptrace rules may forbid it here)");
    to += got;
    from += static_cast<std::size_t>(got);
    n -= static_cast<std::size_t>(got);
  }
}

// S bytes in n blocks of whole floats, the last taking what does not divide (all_reduce's
// count need not be a multiple of the ranks).
struct split {
  std::size_t bytes = 0, n = 1;
  std::size_t even() const noexcept { return bytes / sizeof(float) / n * sizeof(float); }
  std::size_t off(std::size_t q) const noexcept { return q * even(); }
  std::size_t len(std::size_t q) const noexcept { return q + 1 == n ? bytes - off(q) : even(); }
  std::size_t largest() const noexcept { return len(n - 1); }
};

// One rank's view of a measurement.
struct rank_state {
  int rank = 0, n = 0;
  bool may_spin = false;
  shared_block* sh = nullptr;
  char* stage = nullptr;  // shared with every rank
  char* src = nullptr;
  char* dst = nullptr;
  char* bounce = nullptr;         // the largest CMA read, private
  std::uint64_t chunks_done = 0;  // broadcast chunks so far (the same on every rank)

  void barrier() const {
    const std::uint64_t gen = sh->generation.v.load(std::memory_order_acquire);
    if (sh->arrived.v.fetch_add(1, std::memory_order_acq_rel) == static_cast<std::uint64_t>(n - 1)) {
      sh->arrived.v.store(0, std::memory_order_relaxed);
      sh->generation.v.store(gen + 1, std::memory_order_release);
      return;
    }
    wait_for([&] { return sh->generation.v.load(std::memory_order_acquire) != gen; }, may_spin);
  }
  int peer(int j) const { return (rank + j) % n; }  // j = 1 .. n-1: the others, from the next on
  pid_t pid_of(int q) const { return sh->pid[q]; }

  // Block r of every rank's input summed into out, CMA or shared memory.
  void reduce_block(char* out, const split& sp, const setting& s) {
    const auto r = static_cast<std::size_t>(rank), un = static_cast<std::size_t>(n);
    const std::size_t at = sp.off(r), len = sp.len(r);
    const char* mine = src + at;
    if (s.cma) {
      for (std::size_t off = 0; off < len; off += s.chunk) {
        const std::size_t k = std::min(s.chunk, len - off);
        for (int j = 1; j < n; ++j) {
          cma_read(pid_of(peer(j)), bounce, sh->src[peer(j)] + at + off, k, k);
          add(reinterpret_cast<float*>(out + off), reinterpret_cast<const float*>(j == 1 ? mine + off : out + off),
              reinterpret_cast<const float*>(bounce), k / sizeof(float));
        }
      }
      return;
    }
    // Through shared memory: rank q's block p at stage + (q n + p) x the largest block.
    for (int j = 1; j < n; ++j) {
      const auto p = static_cast<std::size_t>(peer(j));
      copy(s.how, stage + (r * un + p) * sp.largest(), src + sp.off(p), sp.len(p));
    }
    barrier();
    for (std::size_t off = 0; off < len; off += sum_piece) {
      const std::size_t k = std::min(sum_piece, len - off);
      for (int j = 1; j < n; ++j) {
        const auto q = static_cast<std::size_t>(peer(j));
        add(reinterpret_cast<float*>(out + off), reinterpret_cast<const float*>(j == 1 ? mine + off : out + off),
            reinterpret_cast<const float*>(stage + (q * un + r) * sp.largest() + off), k / sizeof(float));
      }
    }
  }

  // Every other rank q's block into its place in dst: by CMA from the start of q's src
  // (from_dst false) or from the same place in q's dst; or from that place in
  // shared_area. The own block is in place already.
  void gather_blocks(const split& sp, bool from_dst, const setting& s, const char* shared_area) {
    for (int j = 1; j < n; ++j) {
      const int q = peer(j);
      const std::size_t at = sp.off(static_cast<std::size_t>(q)), len = sp.len(static_cast<std::size_t>(q));
      if (s.cma)
        cma_read(pid_of(q), dst + at, from_dst ? sh->dst[q] + at : sh->src[q], len, s.chunk);
      else
        copy(s.how, dst + at, shared_area + at, len);
    }
  }

  void all_gather(std::size_t bytes, const setting& s) {
    const split sp{bytes, static_cast<std::size_t>(n)};
    const auto r = static_cast<std::size_t>(rank);
    barrier();
    if (!s.cma) copy(s.how, stage + sp.off(r), src, sp.len(r));
    copy(s.how, dst + sp.off(r), src, sp.len(r));
    if (!s.cma) barrier();
    gather_blocks(sp, false, s, stage);
    barrier();
  }

  void reduce_scatter(std::size_t bytes, const setting& s) {
    barrier();
    reduce_block(dst, split{bytes, static_cast<std::size_t>(n)}, s);
    barrier();
  }

  void all_reduce(std::size_t bytes, const setting& s) {
    const auto un = static_cast<std::size_t>(n), r = static_cast<std::size_t>(rank);
    const split sp{bytes, un};
    barrier();
    reduce_block(dst + sp.off(r), sp, s);
    char* sums = stage + un * un * sp.largest();  // after the reduce's area: each rank's sum block
    if (!s.cma) copy(s.how, sums + sp.off(r), dst + sp.off(r), sp.len(r));
    barrier();
    gather_blocks(sp, true, s, sums);
    barrier();
  }

  void broadcast(std::size_t bytes, const setting& s) {
    if (s.cma) {
      barrier();
      if (rank != 0) cma_read(pid_of(0), dst, sh->src[0], bytes, s.chunk);
      barrier();
      return;
    }
    const std::size_t c = s.chunk, chunks = (bytes + c - 1) / c;
    for (std::size_t k = 0; k < chunks; ++k) {
      const std::uint64_t g = chunks_done + k;
      char* slot = stage + (g % depth) * c;
      const std::size_t len = std::min(c, bytes - k * c);
      if (rank == 0) {
        wait_for(
            [&] {
              for (int q = 1; q < n; ++q)
                if (sh->consumed[q].v.load(std::memory_order_acquire) + depth < g + 1) return false;
              return true;
            },
            may_spin);
        plait::kernel::copy_bytes(slot, src + k * c, len);
        sh->written.v.store(g + 1, std::memory_order_release);
      } else {
        wait_for([&] { return sh->written.v.load(std::memory_order_acquire) >= g + 1; }, may_spin);
        copy(s.how, dst + k * c, slot, len);
        sh->consumed[rank].v.store(g + 1, std::memory_order_release);
      }
    }
    chunks_done += chunks;
  }

  void call(const std::string& op, std::size_t bytes, const setting& s) {
    if (op == "all_gather") all_gather(bytes, s);
    if (op == "reduce_scatter") reduce_scatter(bytes, s);
    if (op == "all_reduce") all_reduce(bytes, s);
    if (op == "broadcast") broadcast(bytes, s);
  }
};

// Input element i of rank q.
float input(int q, std::size_t i) { return static_cast<float>(q + 1 + static_cast<int>(i % 7)); }

// The elements of this rank's output that are wrong after a call of op.
long wrong_elements(const std::string& op, const rank_state& st, std::size_t bytes) {
  const auto* out = reinterpret_cast<const float*>(st.dst);
  const std::size_t count = bytes / sizeof(float), n = static_cast<std::size_t>(st.n);
  const std::size_t be = count / n;  // elements per block
  const float base = static_cast<float>(n * (n + 1) / 2);
  long wrong = 0;
  auto expect = [&](std::size_t i, float v) { wrong += out[i] != v ? 1 : 0; };
  if (op == "all_gather")
    for (std::size_t i = 0; i < count; ++i) expect(i, input(static_cast<int>(i / be), i % be));
  if (op == "broadcast" && st.rank != 0)
    for (std::size_t i = 0; i < count; ++i) expect(i, input(0, i));
  if (op == "reduce_scatter")
    for (std::size_t i = 0; i < be; ++i)
      expect(i, base + static_cast<float>(n * ((static_cast<std::size_t>(st.rank) * be + i) % 7)));
  if (op == "all_reduce")
    for (std::size_t i = 0; i < count; ++i) expect(i, base + static_cast<float>(n * (i % 7)));
  return wrong;
}

// The settings tried for op at `bytes`, in order.
std::vector<setting> grid(const std::string& op, std::size_t bytes, int n) {
  const split sp{bytes, static_cast<std::size_t>(n)};
  const std::size_t payload = op == "broadcast" ? bytes : sp.largest();  // the most one CMA read may carry
  std::vector<setting> out;
  const bool own_copy = op == "all_gather";  // the only CMA mechanism with a user-space copy
  for (std::size_t c : cma_chunks) {
    const std::size_t chunk = std::max<std::size_t>(std::min(c, payload), sizeof(float));
    if (own_copy)
      for (copier how : copiers) out.push_back({true, chunk, how, true});
    else
      out.push_back({true, chunk, copier::memcpy_, false});
    if (chunk >= payload) break;
  }
  if (op == "broadcast") {
    for (std::size_t c : slot_chunks) {
      const std::size_t chunk = std::max<std::size_t>(std::min(c, bytes), sizeof(float));
      for (copier how : copiers) out.push_back({false, chunk, how, true});
      if (chunk >= bytes) break;
    }
  } else {
    for (copier how : copiers) out.push_back({false, 0, how, true});
  }
  return out;
}

// Shared bytes op needs at S = top: the reduce's area (n^2 blocks), all_reduce's sums
// after it (S), all_gather's blocks (S), broadcast's slots.
std::size_t stage_bytes(const std::string& op, std::size_t top, int n) {
  const auto un = static_cast<std::size_t>(n);
  const std::size_t reduce_area = un * top + sizeof(float) * un * un * un;  // n^2 blocks of at most S/n + n floats
  if (op == "reduce_scatter") return reduce_area;
  if (op == "all_reduce") return reduce_area + top;
  if (op == "all_gather") return top;
  return depth * slot_chunks[std::size(slot_chunks) - 1];
}

template <class T>
T* map_shared(std::size_t bytes) {
  void* p = ::mmap(nullptr, std::max<std::size_t>(bytes, 1), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) die("mmap of the shared area");
  return static_cast<T*>(p);
}

int run(const bench::ranks::team& team, int ranks, const bench::options& o, shared_block* sh, char* stage,
        std::size_t stage_size) {
  const int rank = team.rank;
  bench::ranks::bind_to_cpu(rank, team.allowed);
  const std::vector<std::size_t> sizes = bench::sizes(o);
  const std::size_t top = std::max<std::size_t>(sizes.empty() ? 0 : sizes.back(), sizeof(float));
  // The benchmark's buffers, private to this rank, touched now and not while timing.
  std::vector<float> src(top / sizeof(float) + 1), dst(top / sizeof(float) + 1);
  // A CMA reduce reads into this a chunk at a time (the whole block at most).
  std::vector<char> bounce(std::max(
      top / static_cast<std::size_t>(ranks) + sizeof(float) * static_cast<std::size_t>(ranks), std::size_t{4} << 20));
  rank_state st;
  st.rank = rank;
  st.n = ranks;
  st.may_spin = team.cpus >= ranks;
  st.sh = sh;
  st.stage = stage;
  st.src = reinterpret_cast<char*>(src.data());
  st.dst = reinterpret_cast<char*>(dst.data());
  st.bounce = bounce.data();
  // Every rank writes the shared area once (zeros, before anyone uses it: the barrier
  // below), so its pages are in every rank's page tables and not faulted in while timing.
  std::memset(stage, 0, stage_size);
  sh->pid[rank] = ::getpid();
  sh->src[rank] = reinterpret_cast<std::uintptr_t>(st.src);
  sh->dst[rank] = reinterpret_cast<std::uintptr_t>(st.dst);
  team.ctl.barrier();  // every rank's addresses are in place

  bench::report rep(
      o, "shm-ceiling", "0.1", ranks,
      bench::ranks::placement(ranks, team.cpus) +
          ", private buffers as malloc gives them, the bytes and local memory work the collective must "
          "do (own block copied, one float-sum pass), a shared-memory barrier at each end of a call; per "
          "size the best of mechanism (CMA reads of 256K/1M/4M/all, or shared memory; broadcast: 4 slots of "
          "64K/256K/1M) x copy (memcpy, copy loop, non-temporal stores)" +
          (st.may_spin ? "" : " x placement (bound round robin, not bound); waits yield at once: more ranks than CPUs"),
      rank == 0);
  rep.header();
  long all_wrong = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    rep.progress(i, sizes.size(), sizes[i]);
    const std::size_t count = bench::count_for(o, sizes[i], sizeof(float), ranks);
    const std::size_t bytes = count * sizeof(float);
    for (std::size_t e = 0; e < count; ++e) src[e] = input(rank, e);
    bool tried = false;
    double best = 0;
    long faults = 0, wrong = 0;
    setting best_setting;
    bool best_bound = true;
    // With more ranks than CPUs, each setting bound round robin (as plaitrun binds) and
    // not bound (as the scheduler places them): the faster counts.
    for (bool bound : {true, false})
      for (const setting& s : grid(o.op, bytes, ranks)) {
        if (!bound && team.cpus >= ranks) continue;
        bench::ranks::place(rank, team.allowed, bound);
        team.ctl.barrier();
        std::fill(dst.begin(), dst.end(), 0.0f);
        const bench::timed_calls t = bench::time_calls(
            o.warmup, o.iters, [&] { st.call(o.op, bytes, s); }, [&] { team.ctl.barrier(); });
        bench::ranks::result got{bench::median(t.us()), t.faults, o.check != 0 ? wrong_elements(o.op, st, bytes) : 0};
        team.ctl.gather(got);
        if (rank == 0) {
          if (!tried || got.median < best) {
            best = got.median;
            best_setting = s;
            best_bound = bound;
          }
          faults = std::max(faults, got.faults);
          wrong += got.wrong;
        }
        tried = true;
        team.ctl.barrier();
      }
    bench::ranks::bind_to_cpu(rank, team.allowed);
    all_wrong += wrong;
    bench::ranks::add_best(rep, o, bytes, count, best, faults, o.check != 0 ? wrong : -1,
                           (team.cpus < ranks ? std::string(best_bound ? "bound round robin, " : "not bound, ") : "") +
                               best_setting.text());
  }
  const bool written = rep.finish();
  return written && all_wrong == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  bench::ranks::program() = "shm-ceiling";
  int ranks = 2;
  const bench::options o = bench::ranks::parse_options(argc, argv, "shm", ranks);
  if (o.type != "float" || o.redop != "sum") bench::usage(argv[0], "-d float -r sum only");

  // Shared before the fork: the control block, and the staging area (each rank touches it).
  auto* sh = new (map_shared<shared_block>(sizeof(shared_block))) shared_block;
  const std::vector<std::size_t> sizes = bench::sizes(o);
  const std::size_t stage_size = stage_bytes(o.op, sizes.empty() ? 0 : sizes.back(), ranks);
  char* stage = map_shared<char>(stage_size);
  const bench::ranks::team team = bench::ranks::fork_team(ranks);
  return bench::ranks::finish_team(team, run(team, ranks, o, sh, stage, stage_size));
}
