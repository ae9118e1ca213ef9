// cma-rate: how fast one process can copy another's memory with process_vm_readv
// (CMA, the single-copy path of Open MPI's vader and of UCX on one host), next to a
// memcpy inside one process, for buffers on 4 KiB pages and on transparent huge pages.
//
// Usage: cma-rate [total bytes, default 16M] [chunk bytes, default 256K]
// A forked child owns the source (allocated and touched in the child, as a peer's
// buffer would be); the parent reads it chunk by chunk into its own destination.
// Prints GB/s (1e9 bytes/s), the median of 5 passes after one warm-up.
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

std::size_t parse(const char* s, std::size_t fallback) {
  if (s == nullptr) return fallback;
  char* end = nullptr;
  std::size_t v = std::strtoull(s, &end, 10);
  if (*end == 'K' || *end == 'k') v <<= 10;
  if (*end == 'M' || *end == 'm') v <<= 20;
  return v;
}

// 2 MiB-aligned, touched; huge: ask for transparent huge pages (MADV_HUGEPAGE).
char* buffer(std::size_t bytes, bool huge) {
  const std::size_t align = std::size_t{2} << 20;
  void* p = ::mmap(nullptr, bytes + align, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    std::perror("mmap");
    std::exit(1);
  }
  char* a = reinterpret_cast<char*>((reinterpret_cast<std::uintptr_t>(p) + align - 1) & ~(align - 1));
  if (huge) ::madvise(a, bytes, MADV_HUGEPAGE);
  std::memset(a, 1, bytes);
  return a;
}

template <class F>
double gbps(std::size_t bytes, F pass) {
  std::vector<double> t;
  for (int i = 0; i < 6; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    pass();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i > 0) t.push_back(s);
  }
  std::sort(t.begin(), t.end());
  return static_cast<double>(bytes) / t[t.size() / 2] / 1e9;
}

void measure(std::size_t total, std::size_t chunk, bool huge) {
  int to_parent[2], to_child[2];
  if (::pipe(to_parent) != 0 || ::pipe(to_child) != 0) std::exit(1);
  const pid_t child = ::fork();
  if (child == 0) {
    char* src = buffer(total, huge);
    if (::write(to_parent[1], &src, sizeof src) != sizeof src) ::_exit(1);
    char c;
    if (::read(to_child[0], &c, 1) < 0) ::_exit(1);
    ::_exit(0);
  }
  char* remote = nullptr;
  if (::read(to_parent[0], &remote, sizeof remote) != sizeof remote) std::exit(1);
  char* dst = buffer(total, huge);
  char* local = buffer(total, huge);
  const double cma = gbps(total, [&] {
    for (std::size_t off = 0; off < total; off += chunk) {
      const std::size_t n = std::min(chunk, total - off);
      iovec l{dst + off, n}, r{remote + off, n};
      if (::process_vm_readv(child, &l, 1, &r, 1, 0) != static_cast<ssize_t>(n)) {
        std::perror("process_vm_readv");
        std::exit(1);
      }
    }
  });
  const double copy = gbps(total, [&] {
    for (std::size_t off = 0; off < total; off += chunk)
      std::memcpy(dst + off, local + off, std::min(chunk, total - off));
  });
  std::printf("%-22s  %8zu  %10zu  %8.2f  %8.2f\n", huge ? "transparent huge pages" : "4 KiB pages", total, chunk, cma,
              copy);
  if (::write(to_child[1], "x", 1) != 1) std::exit(1);
  ::waitpid(child, nullptr, 0);
}

}  // namespace

int main(int argc, char** argv) {
  const std::size_t total = parse(argc > 1 ? argv[1] : nullptr, std::size_t{16} << 20);
  const std::size_t chunk = parse(argc > 2 ? argv[2] : nullptr, std::size_t{256} << 10);
  if (total == 0 || chunk == 0) {
    std::fprintf(stderr, "usage: cma-rate [total bytes] [chunk bytes] (K and M suffixes)\n");
    return 2;
  }
  std::printf("# cma-rate: process_vm_readv from a peer process vs memcpy in one process, GB/s\n");
  std::printf("%-22s  %8s  %10s  %8s  %8s\n", "# pages", "bytes", "chunk", "cma", "memcpy");
  measure(total, chunk, false);
  measure(total, chunk, true);
  return 0;
}
