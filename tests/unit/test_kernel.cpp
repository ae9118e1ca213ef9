// The host reduce_copy kernel against a scalar reference: every fan-in (1..3) and fan-out
// (0..3), counts around the block size, every element type, in-place aliasing, finalize,
// misaligned arrays and user ops. Comparisons are bit-exact and name the first bad element.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <span>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

#include <plait/kernel/reduce_copy.hpp>
#include <plait/ops.hpp>
#include <plait/types.hpp>

namespace {

using plait::bfloat16;
using plait::half;

struct absmax {
  float operator()(float a, float b) const { return std::fabs(a) < std::fabs(b) ? b : a; }
};

template <class T>
std::string show(T x) {
  std::ostringstream s;
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) {
    s << static_cast<float>(x) << " (bits 0x" << std::hex << x.bits << ")";
  } else if constexpr (sizeof(T) == 1) {
    s << static_cast<int>(x);
  } else {
    s << x;
  }
  return s.str();
}

template <class T>
bool same_bits(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

// Input k, element i: values that exercise rounding for floats (the kernel and the
// reference reduce in the same order, so even inexact sums must match bit for bit),
// negative values and wrap-around for integers.
template <class T>
T input(std::size_t k, std::size_t i) {
  const auto x = static_cast<std::uint32_t>(i * 2654435761u + k * 40503u);
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) {
    return T(static_cast<float>(static_cast<int>(x % 2001) - 1000) * 0.0625f);
  } else if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>(static_cast<int>(x % 200001) - 100000) / T(7);
  } else {
    return static_cast<T>(x ^ (x >> 7));  // wraps into the whole range of T
  }
}

// The scalar reference, element by element in the documented order.
template <class T, class Op>
std::vector<T> reference(const Op& op, const std::vector<std::vector<T>>& srcs, std::size_t count, int finalize_n) {
  std::vector<T> out(count);
  for (std::size_t i = 0; i < count; ++i) {
    auto v = plait::to_compute(srcs[0][i]);
    for (std::size_t k = 1; k < srcs.size(); ++k) v = op(v, plait::to_compute(srcs[k][i]));
    if constexpr (plait::has_finalize<Op, T>) {
      if (finalize_n != 0) v = op.finalize(v, finalize_n);
    }
    out[i] = plait::from_compute<T>(v);
  }
  return out;
}

// Checks got[0..count) against want, and that the guard elements after count are intact.
// One assertion per array; on failure it names the first bad element, expected and got.
template <class T>
void check_array(const char* what, const T* got, const std::vector<T>& want, std::size_t count,
                 const std::type_identity_t<T>* guard_got, const std::type_identity_t<T>* guard_want,
                 std::size_t guard) {
  std::size_t bad = 0;
  std::ostringstream first;
  for (std::size_t i = 0; i < count; ++i) {
    if (!same_bits(got[i], want[i]) && bad++ == 0)
      first << what << ": element " << i << " of " << count << ": expected " << show(want[i]) << ", got "
            << show(got[i]);
  }
  for (std::size_t i = 0; i < guard; ++i) {
    if (!same_bits(guard_got[i], guard_want[i]) && bad++ == 0)
      first << what << ": wrote past the end, at element " << count + i;
  }
  INFO(first.str() << " (" << bad << " bad elements)");
  CHECK(bad == 0);
}

constexpr std::size_t guard = 5;

// Runs reduce_copy with nsrc fresh sources into ndst fresh destinations (each allocated
// with a guard tail and offset by `offset` elements to misalign them) and checks the result.
template <class T, class Op>
void run_case(const Op& op, std::size_t nsrc, std::size_t ndst, std::size_t count, int finalize_n = 0,
              std::size_t offset = 0) {
  CAPTURE(nsrc, ndst, count, finalize_n, offset);
  std::vector<std::vector<T>> src_vals(nsrc);
  std::vector<std::vector<T>> src_bufs;
  for (std::size_t k = 0; k < nsrc; ++k) {
    auto& vals = src_vals[k];
    for (std::size_t i = 0; i < count; ++i) vals.push_back(input<T>(k, i));
    std::vector<T> buf(offset + count + guard, input<T>(k + 7, 3));
    std::copy(vals.begin(), vals.end(), buf.begin() + static_cast<std::ptrdiff_t>(offset));
    src_bufs.push_back(std::move(buf));
  }
  const std::vector<T> fill(offset + count + guard, input<T>(9, 1));
  std::vector<std::vector<T>> dst_bufs(ndst, fill);

  std::array<const T*, 3> srcs{};
  std::array<T*, 3> dsts{};
  for (std::size_t k = 0; k < nsrc; ++k) srcs[k] = src_bufs[k].data() + offset;
  for (std::size_t k = 0; k < ndst; ++k) dsts[k] = dst_bufs[k].data() + offset;
  plait::kernel::reduce_copy<T>(op, std::span<const T* const>(srcs.data(), nsrc),
                                std::span<T* const>(dsts.data(), ndst), count, finalize_n);

  const std::vector<T> want = reference(op, src_vals, count, finalize_n);
  for (std::size_t k = 0; k < ndst; ++k) {
    const std::string what = "destination " + std::to_string(k);
    const T* d = dsts[k];
    check_array(what.c_str(), d, want, count, d + count, fill.data(), guard);
  }
  for (std::size_t k = 0; k < nsrc; ++k) {  // sources are read-only
    const std::string what = "source " + std::to_string(k) + " (must not change)";
    const T* s = srcs[k];
    check_array(what.c_str(), s, src_vals[k], count, s + count, s + count, 0);
  }
}

constexpr std::size_t counts[] = {0, 1, 13, 63, 64, 65, 4099};

template <class T, class Op>
void sweep(const Op& op) {
  for (std::size_t count : counts)
    for (std::size_t nsrc = 1; nsrc <= 3; ++nsrc)
      for (std::size_t ndst = 0; ndst <= 3; ++ndst) run_case<T>(op, nsrc, ndst, count);
}

}  // namespace

TEMPLATE_TEST_CASE("reduce_copy sum: 1-3 sources x 0-3 destinations equals the reference", "[kernel]", float, double,
                   std::int8_t, std::int16_t, std::int32_t, std::int64_t, std::uint8_t, std::uint16_t, std::uint32_t,
                   std::uint64_t, half, bfloat16) {
  sweep<TestType>(plait::sum{});
}

TEMPLATE_TEST_CASE("reduce_copy max equals the reference", "[kernel]", float, std::int32_t, std::uint8_t, bfloat16,
                   half) {
  sweep<TestType>(plait::max{});
}

TEMPLATE_TEST_CASE("reduce_copy min, prod and bitwise ops", "[kernel]", std::int64_t, std::uint16_t, std::int8_t) {
  for (std::size_t nsrc = 1; nsrc <= 3; ++nsrc) {
    run_case<TestType>(plait::min{}, nsrc, 2, 4099);
    run_case<TestType>(plait::prod{}, nsrc, 1, 4099);
    run_case<TestType>(plait::band{}, nsrc, 1, 4099);
    run_case<TestType>(plait::bor{}, nsrc, 3, 4099);
    run_case<TestType>(plait::bxor{}, nsrc, 2, 4099);
  }
}

TEMPLATE_TEST_CASE("reduce_copy on misaligned arrays", "[kernel]", float, double, half, std::int8_t) {
  for (std::size_t offset = 1; offset <= 3; ++offset)
    for (std::size_t nsrc = 1; nsrc <= 3; ++nsrc) run_case<TestType>(plait::sum{}, nsrc, 2, 4099, 0, offset);
}

TEMPLATE_TEST_CASE("reduce_copy avg applies finalize once", "[kernel]", std::int32_t, std::int8_t, std::uint16_t, float,
                   double, half, bfloat16) {
  for (std::size_t count : counts)
    for (std::size_t nsrc = 1; nsrc <= 3; ++nsrc) {
      run_case<TestType>(plait::avg{}, nsrc, 1, count, 3);
      run_case<TestType>(plait::avg{}, nsrc, 2, count, static_cast<int>(nsrc));
      run_case<TestType>(plait::avg{}, nsrc, 1, count, 0);  // 0: no finalize, a plain sum
    }
}

TEST_CASE("reduce_copy avg on int32 truncates toward zero", "[kernel]") {
  const std::int32_t a[] = {-7, 7, -1, 5};
  const std::int32_t b[] = {0, 0, 0, 0};
  std::int32_t out[4] = {};
  const std::array<const std::int32_t*, 2> srcs{a, b};
  const std::array<std::int32_t*, 1> dsts{out};
  plait::kernel::reduce_copy<std::int32_t>(plait::avg{}, srcs, dsts, 4, 2);
  CHECK(out[0] == -3);
  CHECK(out[1] == 3);
  CHECK(out[2] == 0);
  CHECK(out[3] == 2);
}

TEMPLATE_TEST_CASE("reduce_copy in place: a destination is a source", "[kernel]", float, std::int32_t, bfloat16, half,
                   std::uint8_t, double) {
  using T = TestType;
  for (std::size_t count : counts) {
    for (std::size_t nsrc = 1; nsrc <= 3; ++nsrc) {
      for (std::size_t alias = 0; alias < nsrc; ++alias) {  // which source the first destination is
        CAPTURE(count, nsrc, alias);
        std::vector<std::vector<T>> vals(nsrc);
        for (std::size_t k = 0; k < nsrc; ++k)
          for (std::size_t i = 0; i < count + guard; ++i) vals[k].push_back(input<T>(k, i));
        auto bufs = vals;
        std::vector<T> extra(count + guard, input<T>(5, 5));
        const std::vector<T> extra_fill = extra;
        std::array<const T*, 3> srcs{};
        for (std::size_t k = 0; k < nsrc; ++k) srcs[k] = bufs[k].data();
        // In place, plus a second destination elsewhere, plus the same array twice.
        const std::array<T*, 3> dsts{bufs[alias].data(), extra.data(), bufs[alias].data()};
        const int finalize_n = 2;
        plait::kernel::reduce_copy<T>(plait::avg{}, std::span<const T* const>(srcs.data(), nsrc),
                                      std::span<T* const>(dsts), count, finalize_n);
        const std::vector<T> want = reference(plait::avg{}, vals, count, finalize_n);
        const T* tail = vals[alias].data() + count;
        check_array("in-place destination", dsts[0], want, count, dsts[0] + count, tail, guard);
        check_array("second destination", dsts[1], want, count, dsts[1] + count, extra_fill.data() + count, guard);
        for (std::size_t k = 0; k < nsrc; ++k) {
          if (k == alias) continue;
          const std::string what = "source " + std::to_string(k) + " (must not change)";
          check_array(what.c_str(), bufs[k].data(), vals[k], count + guard, nullptr, nullptr, 0);
        }
      }
    }
  }
}

TEST_CASE("reduce_copy copy is bit-exact and skips a destination that is the source", "[kernel]") {
  // Signalling NaN and negative-zero half patterns: a conversion through float would quiet
  // the NaN; the copy path must not touch the bits.
  std::vector<half> src(4099);
  for (std::size_t i = 0; i < src.size(); ++i)
    src[i] = half::from_bits(static_cast<std::uint16_t>(i % 3 == 0 ? 0x7c01 : i % 3 == 1 ? 0x8000 : i));
  std::vector<half> a(src.size()), b(src.size());
  std::vector<half> same = src;
  const std::array<const half*, 1> srcs{same.data()};
  const std::array<half*, 3> dsts{a.data(), same.data(), b.data()};
  plait::kernel::reduce_copy<half>(plait::sum{}, srcs, dsts, src.size(), 0);
  for (std::size_t i = 0; i < src.size(); ++i) {
    CAPTURE(i);
    REQUIRE(a[i].bits == src[i].bits);
    REQUIRE(b[i].bits == src[i].bits);
    REQUIRE(same[i].bits == src[i].bits);
  }
}

TEST_CASE("copy_bytes and copy_bytes_streaming copy every length at every alignment, nothing around it", "[kernel]") {
  // Lengths around the plain loop's and the streaming loop's 64-byte passes and around
  // copy_bytes' switch to memcpy; destination and source offsets around 16-byte lines.
  constexpr std::size_t guard = 64;
  const std::size_t lengths[] = {0,
                                 1,
                                 15,
                                 16,
                                 63,
                                 64,
                                 65,
                                 79,
                                 127,
                                 128,
                                 129,
                                 200,
                                 255,
                                 333,
                                 2047,
                                 2048,
                                 2049,
                                 4161,
                                 (1u << 20) - 5,
                                 (1u << 20) + 77};
  for (auto copy : {&plait::kernel::copy_bytes, &plait::kernel::copy_bytes_streaming}) {
    const bool streaming = copy == &plait::kernel::copy_bytes_streaming;
    for (std::size_t n : lengths) {
      for (std::size_t dst_off : {0, 1, 7, 15, 16, 33}) {
        for (std::size_t src_off : {0, 5, 16}) {
          CAPTURE(streaming, n, dst_off, src_off);
          std::vector<unsigned char> src(n + src_off + 1),
              dst(n + dst_off + 2 * guard, 0xA5);  // never empty: no null array
          for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 131 + 7);
          copy(dst.data() + guard + dst_off, src.data() + src_off, n);
          for (std::size_t i = 0; i < dst.size(); ++i) {
            const bool inside = i >= guard + dst_off && i < guard + dst_off + n;
            const unsigned char want = inside ? src[i - guard - dst_off + src_off] : 0xA5;
            if (dst[i] != want)
              FAIL("byte " << i << " of the destination is " << int(dst[i]) << ", want " << int(want));
          }
        }
      }
    }
  }
  SUCCEED("every length and alignment copied exactly");
}

TEST_CASE("reduce_copy with a user functor", "[kernel]") {
  for (std::size_t count : counts) {
    run_case<float>(absmax{}, 3, 2, count);
    run_case<bfloat16>(absmax{}, 2, 1, count);
  }
}

TEST_CASE("reduce_copy propagates NaN through max", "[kernel]") {
  std::vector<float> a(100, 1.0f), b(100, 2.0f), out(100);
  a[70] = std::numeric_limits<float>::quiet_NaN();
  b[3] = std::numeric_limits<float>::quiet_NaN();
  const std::array<const float*, 2> srcs{a.data(), b.data()};
  const std::array<float*, 1> dsts{out.data()};
  plait::kernel::reduce_copy<float>(plait::max{}, srcs, dsts, out.size(), 0);
  for (std::size_t i = 0; i < out.size(); ++i) {
    CAPTURE(i);
    if (i == 3 || i == 70)
      CHECK(std::isnan(out[i]));
    else
      CHECK(out[i] == 2.0f);
  }
}

TEST_CASE("reduce_copy aborts on a fan-in or fan-out it does not support", "[kernel]") {
  // A caller bug, not a runtime condition: the kernel cannot throw, so it says what was
  // wrong on stderr and aborts. Checked in a child process.
  auto aborts = [](std::size_t nsrc, std::size_t ndst) {
    const pid_t pid = fork();
    if (pid == 0) {
      float buf[4] = {};
      const std::array<const float*, 4> srcs{buf, buf, buf, buf};
      const std::array<float*, 4> dsts{buf, buf, buf, buf};
      std::fclose(stderr);  // keep the expected message out of the test log
      plait::kernel::reduce_copy<float>(plait::sum{}, std::span<const float* const>(srcs.data(), nsrc),
                                        std::span<float* const>(dsts.data(), ndst), 4, 0);
      _exit(0);
    }
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    return WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
  };
  CHECK(aborts(0, 1));
  CHECK(aborts(4, 1));
  CHECK(aborts(2, 4));
  CHECK_FALSE(aborts(3, 3));
  CHECK_FALSE(aborts(1, 0));
}
