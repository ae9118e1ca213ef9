// huge_backing: the caller's large buffers on transparent huge pages.
//
// A copy through a large buffer on 4 KiB pages takes a TLB miss every 4 KiB, and in
// a virtual machine each miss walks two page tables (likely where the time goes; not
// measured): a 2-rank shm all_gather of 16 MiB took 1.7x-2x as long on malloc's 4 KiB
// pages as on huge pages, an all_reduce up to 1.9x (docs/performance.md, "The
// caller's large buffers on huge pages"), and with more ranks than cores shm's single
// copy (CMA) lends only bytes on huge pages. So before a call, the part of each of its
// buffers that covers whole 2 MiB pages is collapsed into transparent huge pages with
// madvise(MADV_COLLAPSE) (Linux 6.1+). The bytes stay as they were; only the pages
// behind them change. The kernel refuses memory that may not take them (a file's
// pages, a range the program marked MADV_NOHUGEPAGE, pinned pages, no free huge page,
// an older kernel), and the call goes on as before.
//
// A collapse copies the range into fresh huge pages: here about 0.45 ms per 2 MiB
// (2 ms where the host had not given this machine that memory before), while asking
// again for a range already on huge pages costs about 1 us for 16 MiB. So a range is
// asked for at the ask_at_call-th call that covers it (a buffer used for one call
// gains nothing from it; one used for many, as a training loop's are, pays it back
// within a few calls), then again every recheck_every calls, so that a buffer freed and
// mapped again at the same address is collapsed again. The last `remembered` ranges
// are kept. A range refused for the first time is asked again at the next call: a
// buffer the program has not written yet has no pages to collapse (EINVAL) until the
// call writes them.
//
// Thread-safety: one thread at a time (the communicator's caller). Never throws.
#pragma once

#include <sys/mman.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>

namespace plait::detail {

class huge_backing {
 public:
  static constexpr std::size_t page_bytes = std::size_t{2} << 20;
  static constexpr std::uint32_t ask_at_call = 3;
  static constexpr std::uint32_t recheck_every = 1024;
  static constexpr std::size_t remembered = 8;
#ifdef MADV_COLLAPSE
  static constexpr int collapse = MADV_COLLAPSE;
#else
  static constexpr int collapse = 25;  // include/uapi/asm-generic/mman-common.h, Linux 6.1
#endif

  // What back() asked of the kernel: nothing (bytes 0), or the collapse of `bytes`
  // bytes, which took `took` and failed with `error` (0: done).
  struct asked {
    std::size_t bytes = 0;
    int error = 0;
    std::chrono::steady_clock::duration took{};
  };

  // The whole 2 MiB pages inside [p, p + bytes), at the ask_at_call-th call that
  // covers them, then every recheck_every calls.
  asked back(const void* p, std::size_t bytes) noexcept {
    if (bytes < page_bytes) return {};
    const auto begin = (reinterpret_cast<std::uintptr_t>(p) + page_bytes - 1) & ~(page_bytes - 1);
    const auto end = (reinterpret_cast<std::uintptr_t>(p) + bytes) & ~(page_bytes - 1);
    if (end <= begin) return {};
    range* hit = nullptr;
    for (range& r : ranges_)
      if (r.begin <= begin && end <= r.end) hit = &r;
    if (hit == nullptr) {
      hit = &ranges_[next_];
      next_ = (next_ + 1) % remembered;
      *hit = {begin, end, 0, ask_at_call};
    }
    if (++hit->calls < hit->due) return {};
    asked a;
    a.bytes = end - begin;
    const auto t0 = std::chrono::steady_clock::now();
    a.error = ::madvise(reinterpret_cast<void*>(begin), a.bytes, collapse) == 0 ? 0 : errno;
    a.took = std::chrono::steady_clock::now() - t0;
    // A first refusal is asked again at the next call: a buffer the program has not
    // written yet has no pages to collapse (EINVAL), and the call writes them.
    hit->calls = 0;
    hit->due = a.error != 0 && hit->due != 1 ? 1 : recheck_every;
    return a;
  }

 private:
  struct range {
    std::uintptr_t begin = 0, end = 0;
    std::uint32_t calls = 0;  // that covered it since it was last asked for
    std::uint32_t due = 0;    // asked for at this many
  };
  std::array<range, remembered> ranges_{};
  std::size_t next_ = 0;
};

}  // namespace plait::detail
