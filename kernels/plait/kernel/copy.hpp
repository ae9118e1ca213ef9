// copy_bytes: the copy every payload takes on the host (a slot filled from the
// caller's memory, a slot copied into the output). Like memcpy: non-overlapping
// arrays, bit-exact.
//
// Why not memcpy itself: for 2 KiB up to 1 MiB, glibc's memcpy (2.36, x86-64) moves
// the bytes with `rep movsb`, and on the machines plait is measured on (AMD EPYC
// vCPUs) slot copies made that way, while the other core copies the slot before,
// cost about twice what a vector loop's do. Measured with glibc's own vector loop
// forced (GLIBC_TUNABLES=glibc.cpu.x86_rep_movsb_threshold=67108864), 2-rank shm
// broadcast in 256 KiB slices: 1 MiB 85.3 -> 40.6 us, 4 MiB 356.6 -> 172.5 us. Why is
// not established: a lock-step hand-off (host-probe part 3, memcpy on both sides) is
// the same either way (docs/performance.md, "Copies without rep movsb"). So from
// copy_loop_from bytes up to where glibc's memcpy takes its vector loop itself
// (copy_loop_upto) the bytes go through the loop below.
//
// The loop moves 64 bytes per pass with fixed-size copies the compiler turns into
// vector moves; the empty asm hides the index from the compilers' idiom recognition,
// which would otherwise turn the loop back into a call to memcpy.
//
// copy_bytes_streaming: the same copy with non-temporal stores, for a destination
// nobody reads soon and too large to stay in cache (the output of a large call):
// the lines go to memory without being read first and without pushing the working
// set out of the cache. Measured on this project's machines (2 threads, each
// copying 16-64 MiB in 256 KiB pieces; docs/performance.md, "all_gather copies
// into a large output past the cache"): 5-8.5 GB/s with plain
// stores, 7.8-13.4 GB/s with these; at 1-4 MiB, where everything stays in cache, plain
// stores are 2-3x faster, so the caller picks by size. It ends with a store fence,
// so the bytes are ordered before any later store (a release, a flag) like plain
// ones. x86-64 (SSE2, in every x86-64 CPU); elsewhere it is copy_bytes.
// Never throws; thread-safe for disjoint destinations.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) || defined(_M_X64)
#include <emmintrin.h>
#endif

namespace plait::kernel {
inline namespace v1 {

inline constexpr std::size_t copy_loop_from = 2048;
inline constexpr std::size_t copy_loop_upto = std::size_t{1} << 20;

inline void copy_bytes(void* dst, const void* src, std::size_t n) noexcept {
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  if (n < copy_loop_from || n >= copy_loop_upto) {
    std::memcpy(d, s, n);
    return;
  }
  std::size_t i = 0;
  for (; n - i >= 64; i += 64) {
    __builtin_memcpy(d + i, s + i, 64);
    asm("" : "+r"(i));
  }
  std::memcpy(d + i, s + i, n - i);
}

inline void copy_bytes_streaming(void* dst, const void* src, std::size_t n) noexcept {
#if defined(__x86_64__) || defined(_M_X64)
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  // Up to the first 16-byte boundary of the destination with plain stores.
  std::size_t i = (16 - (reinterpret_cast<std::uintptr_t>(d) & 15)) & 15;
  if (n < i + 64) {
    copy_bytes(d, s, n);
    return;
  }
  std::memcpy(d, s, i);
  for (; n - i >= 64; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
  std::memcpy(d + i, s + i, n - i);
  _mm_sfence();
#else
  copy_bytes(dst, src, n);
#endif
}

}  // namespace v1
}  // namespace plait::kernel
