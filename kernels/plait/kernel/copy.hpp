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
// Never throws; thread-safe for disjoint destinations.
#pragma once

#include <cstddef>
#include <cstring>

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

}  // namespace v1
}  // namespace plait::kernel
