// Single copy between ranks on one host: the receiver copies a sender's bytes
// straight from the sender's memory with process_vm_readv (cross-memory attach,
// CMA), instead of the sender copying them into a slot and the receiver out of it.
//
// CMA needs ptrace access to the peer (same user; Yama's ptrace_scope 0; no seccomp
// filter denying the call, as some container runtimes install), so each reader
// probes every peer at connect: it reads a word the peer published with a random
// value, and uses the path only when it gets that value (probe()).
// The kernel pins each source page it copies: on 4 KiB pages CMA runs at 4–6 GB/s
// here, slower than the two copies through a slot, on huge pages at 14–17 GB/s
// (bench/cma-rate, docs/performance.md). So a sender lends only bytes that are on
// huge pages (huge_share(), one PAGEMAP_SCAN ioctl; Linux 6.7+, else never).
#pragma once

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <random>

namespace plait::transport::shm_detail {

// The word a peer reads to test that CMA reaches this process (and that the pid it
// has is this process): published with its value in the shm announcement.
inline const std::uint64_t* probe_address() {
  static const std::uint64_t word = [] {
    std::random_device rd;
    return (static_cast<std::uint64_t>(rd()) << 32 | rd()) | 1;  // never 0: 0 is "no probe"
  }();
  return &word;
}

// Copies `bytes` from `src` in process `pid` to `dst` here. Returns 0, or the errno
// of the failed call (ESRCH: gone; EFAULT: not mapped there; EPERM: not allowed).
inline int read_from(pid_t pid, void* dst, std::uintptr_t src, std::size_t bytes) noexcept {
  auto* to = static_cast<char*>(dst);
  while (bytes > 0) {
    iovec local{to, bytes};
    iovec remote{reinterpret_cast<void*>(src), bytes};
    const ssize_t n = ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return EFAULT;
    to += n;
    src += static_cast<std::uintptr_t>(n);
    bytes -= static_cast<std::size_t>(n);
  }
  return 0;
}

// True when CMA reads `pid`'s probe word at `address` and finds `value`.
inline bool probe(pid_t pid, std::uint64_t address, std::uint64_t value) noexcept {
  if (address == 0 || value == 0) return false;
  std::uint64_t got = 0;
  return read_from(pid, &got, static_cast<std::uintptr_t>(address), sizeof got) == 0 && got == value;
}

// The fraction (0..1) of [p, p + bytes) of this process that is on huge pages
// (transparent or hugetlbfs), from /proc/self/pagemap's PAGEMAP_SCAN; 0 where the
// kernel lacks it. The layout is the kernel's ABI (include/uapi/linux/fs.h, 6.7+).
class huge_pages {
 public:
  huge_pages() : fd_(::open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC)) {}
  ~huge_pages() {
    if (fd_ >= 0) ::close(fd_);
  }
  huge_pages(const huge_pages&) = delete;
  huge_pages& operator=(const huge_pages&) = delete;

  double share(const void* p, std::size_t bytes) noexcept {
    if (fd_ < 0 || bytes == 0) return 0;
    constexpr std::uint64_t page_mask = 4095;
    const auto begin = reinterpret_cast<std::uint64_t>(p) & ~page_mask;
    const auto end = (reinterpret_cast<std::uint64_t>(p) + bytes + page_mask) & ~page_mask;
    region found[8];
    scan_arg a{};
    a.size = sizeof a;
    a.start = begin;
    a.end = end;
    a.vec = reinterpret_cast<std::uint64_t>(found);
    a.vec_len = 8;
    a.category_mask = page_is_huge;
    a.return_mask = page_is_huge;
    const int n = ::ioctl(fd_, pagemap_scan, &a);
    if (n < 0) {
      if (errno == ENOTTY || errno == EINVAL) {  // no PAGEMAP_SCAN: never ask again
        ::close(fd_);
        fd_ = -1;
      }
      return 0;
    }
    std::uint64_t huge = 0;
    for (int i = 0; i < n; ++i) huge += found[i].end - found[i].start;
    return static_cast<double>(huge) / static_cast<double>(end - begin);
  }

 private:
  struct region {
    std::uint64_t start, end, categories;
  };
  struct scan_arg {
    std::uint64_t size, flags, start, end, walk_end, vec, vec_len, max_pages, category_inverted, category_mask,
        category_anyof_mask, return_mask;
  };
  static constexpr std::uint64_t page_is_huge = 1 << 6;
  static constexpr unsigned long pagemap_scan = _IOWR('f', 16, scan_arg);
  int fd_;
};

}  // namespace plait::transport::shm_detail
