// half and bfloat16 conversions against known bit patterns, exhaustive round trips, and the
// dtype table.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include <plait/types.hpp>

namespace {

using plait::bfloat16;
using plait::half;

std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float float_from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

bool half_is_nan(std::uint16_t b) { return (b & 0x7c00u) == 0x7c00u && (b & 0x03ffu) != 0; }
bool bf16_is_nan(std::uint16_t b) { return (b & 0x7f80u) == 0x7f80u && (b & 0x007fu) != 0; }

// The bits half(f) produces, for a readable failure message.
std::uint16_t h(float f) { return half(f).bits; }
std::uint16_t bf(float f) { return bfloat16(f).bits; }

}  // namespace

// Usable in constant expressions (and so in device code without host-only calls).
static_assert(half(1.0f).bits == 0x3c00);
static_assert(static_cast<float>(half::from_bits(0xc000)) == -2.0f);
static_assert(bfloat16(1.0f).bits == 0x3f80);
static_assert(static_cast<float>(bfloat16::from_bits(0x4040)) == 3.0f);

TEST_CASE("half from float: exact values", "[types][half]") {
  CHECK(h(0.0f) == 0x0000);
  CHECK(h(-0.0f) == 0x8000);
  CHECK(h(1.0f) == 0x3c00);
  CHECK(h(-2.0f) == 0xc000);
  CHECK(h(0.5f) == 0x3800);
  CHECK(h(65504.0f) == 0x7bff);  // largest finite half
  CHECK(h(-65504.0f) == 0xfbff);
  CHECK(h(0x1p-14f) == 0x0400);         // smallest normal
  CHECK(h(0x1p-24f) == 0x0001);         // smallest subnormal
  CHECK(h(1023 * 0x1p-24f) == 0x03ff);  // largest subnormal
  CHECK(h(-0x1p-24f) == 0x8001);
}

TEST_CASE("half from float: overflow and infinities", "[types][half]") {
  CHECK(h(65519.996f) == 0x7bff);  // just below the halfway point to 65536
  CHECK(h(65520.0f) == 0x7c00);    // halfway, 65504 is odd: ties to even = inf
  CHECK(h(-65520.0f) == 0xfc00);
  CHECK(h(1e6f) == 0x7c00);
  CHECK(h(std::numeric_limits<float>::max()) == 0x7c00);
  CHECK(h(std::numeric_limits<float>::infinity()) == 0x7c00);
  CHECK(h(-std::numeric_limits<float>::infinity()) == 0xfc00);
}

TEST_CASE("half from float: ties round to even", "[types][half]") {
  CHECK(h(1.0f + 0x1p-11f) == 0x3c00);             // halfway 1 .. 1+2^-10: down to even 1.0
  CHECK(h(1.0f + 3 * 0x1p-11f) == 0x3c02);         // halfway 0x3c01 .. 0x3c02: up to even
  CHECK(h(1.0f + 0x1p-11f + 0x1p-20f) == 0x3c01);  // just above halfway
  CHECK(h(2049.0f) == 0x6800);                     // halfway 2048 .. 2050: 2048
  CHECK(h(2051.0f) == 0x6802);                     // halfway 2050 .. 2052: 2052
  CHECK(h(0x1p-25f) == 0x0000);                    // half the smallest subnormal: ties to 0
  CHECK(h(-0x1p-25f) == 0x8000);
  CHECK(h(std::nextafter(0x1p-25f, 1.0f)) == 0x0001);
  CHECK(h(3 * 0x1p-25f) == 0x0002);     // 1.5 subnormal steps: up to even 2
  CHECK(h(5 * 0x1p-25f) == 0x0002);     // 2.5 steps: down to even 2
  CHECK(h(2047 * 0x1p-25f) == 0x0400);  // 1023.5 steps: up into the normal range
  CHECK(h(1e-10f) == 0x0000);
  CHECK(h(1e-40f) == 0x0000);  // float subnormal
  CHECK(h(-1e-40f) == 0x8000);
}

TEST_CASE("half from float: NaN stays NaN with its sign", "[types][half]") {
  const float qnan = std::numeric_limits<float>::quiet_NaN();
  CHECK(half_is_nan(h(qnan)));
  CHECK((h(qnan) & 0x8000) == 0);
  CHECK(half_is_nan(h(-qnan)));
  CHECK((h(-qnan) & 0x8000) == 0x8000);
  // A signalling NaN whose payload sits below the bits half keeps must not become inf.
  const std::uint16_t s = h(float_from_bits(0x7f800001u));
  CHECK(half_is_nan(s));
  CHECK((s & 0x0200) != 0);  // quiet
  CHECK(half_is_nan(h(float_from_bits(0xff800001u))));
}

TEST_CASE("half to float: exact values", "[types][half]") {
  CHECK(static_cast<float>(half::from_bits(0x0000)) == 0.0f);
  CHECK(bits_of(static_cast<float>(half::from_bits(0x8000))) == 0x80000000u);
  CHECK(static_cast<float>(half::from_bits(0x3c00)) == 1.0f);
  CHECK(static_cast<float>(half::from_bits(0x7bff)) == 65504.0f);
  CHECK(static_cast<float>(half::from_bits(0x0001)) == 0x1p-24f);
  CHECK(static_cast<float>(half::from_bits(0x03ff)) == 1023 * 0x1p-24f);
  CHECK(static_cast<float>(half::from_bits(0x8200)) == -512 * 0x1p-24f);
  CHECK(static_cast<float>(half::from_bits(0x0400)) == 0x1p-14f);
  CHECK(static_cast<float>(half::from_bits(0x7c00)) == std::numeric_limits<float>::infinity());
  CHECK(static_cast<float>(half::from_bits(0xfc00)) == -std::numeric_limits<float>::infinity());
  const float nan = static_cast<float>(half::from_bits(0xfe00));
  CHECK(std::isnan(nan));
  CHECK(std::signbit(nan));
}

TEST_CASE("bfloat16 from float", "[types][bfloat16]") {
  CHECK(bf(0.0f) == 0x0000);
  CHECK(bf(-0.0f) == 0x8000);
  CHECK(bf(1.0f) == 0x3f80);
  CHECK(bf(-2.0f) == 0xc000);
  CHECK(bf(1.0f + 0x1p-8f) == 0x3f80);                // halfway 0x3f80 .. 0x3f81: even
  CHECK(bf(1.0f + 3 * 0x1p-8f) == 0x3f82);            // halfway 0x3f81 .. 0x3f82: even
  CHECK(bf(1.0f + 0x1p-8f + 0x1p-20f) == 0x3f81);     // just above halfway
  CHECK(bf(float_from_bits(0x7f7f7fffu)) == 0x7f7f);  // just below halfway to 2^128
  CHECK(bf(float_from_bits(0x7f7f8000u)) == 0x7f80);  // halfway, 0x7f7f is odd: inf
  CHECK(bf(3.4e38f) == 0x7f80);                       // past halfway to 2^128: inf
  CHECK(bf(-3.4e38f) == 0xff80);
  CHECK(bf(std::numeric_limits<float>::infinity()) == 0x7f80);
  CHECK(bf(-std::numeric_limits<float>::infinity()) == 0xff80);
  // Float subnormals keep their top bits and round like any other value.
  CHECK(bf(float_from_bits(0x00010000u)) == 0x0001);
  CHECK(bf(float_from_bits(0x00000001u)) == 0x0000);
  CHECK(bf(float_from_bits(0x00008000u)) == 0x0000);  // tie, 0 is even
  CHECK(bf(float_from_bits(0x00018000u)) == 0x0002);  // tie, 1 is odd
  CHECK(bf(float_from_bits(0x807f8001u)) == 0x8080);  // rounds up into the normal range
  // NaN: truncating 0x7f800001 would give inf; the conversion must keep it NaN, quiet.
  CHECK(bf(float_from_bits(0x7f800001u)) == 0x7fc0);
  CHECK(bf(float_from_bits(0xff800001u)) == 0xffc0);
  CHECK(bf16_is_nan(bf(std::numeric_limits<float>::quiet_NaN())));
}

TEST_CASE("bfloat16 to float", "[types][bfloat16]") {
  CHECK(static_cast<float>(bfloat16::from_bits(0x3f80)) == 1.0f);
  CHECK(static_cast<float>(bfloat16::from_bits(0x7f7f)) == float_from_bits(0x7f7f0000u));
  CHECK(bits_of(static_cast<float>(bfloat16::from_bits(0x0001))) == 0x00010000u);
  CHECK(bits_of(static_cast<float>(bfloat16::from_bits(0x8000))) == 0x80000000u);
  CHECK(std::isnan(static_cast<float>(bfloat16::from_bits(0xffc1))));
}

TEST_CASE("every half bit pattern survives half -> float -> half", "[types][half]") {
  int failures = 0;
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    const auto in = static_cast<std::uint16_t>(b);
    const std::uint16_t out = half(static_cast<float>(half::from_bits(in))).bits;
    const bool ok = half_is_nan(in) ? half_is_nan(out) && (out & 0x8000) == (in & 0x8000) : out == in;
    if (!ok && ++failures <= 5) FAIL_CHECK("half 0x" << std::hex << b << " came back as 0x" << out);
  }
  CHECK(failures == 0);
}

TEST_CASE("every bfloat16 bit pattern survives bfloat16 -> float -> bfloat16", "[types][bfloat16]") {
  int failures = 0;
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    const auto in = static_cast<std::uint16_t>(b);
    const std::uint16_t out = bfloat16(static_cast<float>(bfloat16::from_bits(in))).bits;
    const bool ok = bf16_is_nan(in) ? bf16_is_nan(out) && (out & 0x8000) == (in & 0x8000) : out == in;
    if (!ok && ++failures <= 5) FAIL_CHECK("bfloat16 0x" << std::hex << b << " came back as 0x" << out);
  }
  CHECK(failures == 0);
}

// A sample of all floats (every 65521st pattern, about 65,000 values, all exponents)
// against an independent reference written with integer arithmetic.
TEST_CASE("half and bfloat16 rounding agree with a bit-level reference", "[types]") {
  auto ref_half = [](std::uint32_t x) -> std::uint16_t {
    const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
    const std::uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return 0;  // NaN: not compared here
    if (ax >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);
    // value = m * 2^(e - 150); as a multiple of 2^-24 (the subnormal step) it is
    // m * 2^(e - 126); for normal halves round at the 10th mantissa bit instead.
    const std::uint32_t e = ax >> 23;
    const std::uint64_t m = e == 0 ? (ax & 0x7fffffu) : ((ax & 0x7fffffu) | 0x800000u);
    const int exp = e == 0 ? 1 : static_cast<int>(e);
    // Round m * 2^(exp - 150) to a multiple of 2^q, q = max(-24, floor(log2) - 10).
    const int log2 = exp - 127;  // of the leading bit, for normal floats
    const int q = e == 0 ? -24 : (log2 - 10 < -24 ? -24 : log2 - 10);
    const int shift = q - (exp - 150);  // bits of m dropped
    std::uint64_t r = shift >= 64 ? 0 : m >> shift;
    const std::uint64_t rem = shift >= 64 ? m : m & ((std::uint64_t{1} << shift) - 1);
    const std::uint64_t halfway = shift >= 65 ? ~std::uint64_t{0} : std::uint64_t{1} << (shift - 1);
    if (rem > halfway || (rem == halfway && (r & 1))) ++r;
    // r * 2^q as half bits: subnormal if q == -24 and r < 1024, else normal.
    std::uint32_t hbits;
    if (q == -24) {
      hbits = static_cast<std::uint32_t>(r);  // r <= 1024; 1024 is the smallest normal
    } else {
      int hexp = q + 10 + 15;  // biased exponent of r * 2^q with r in [1024, 2048]
      if (r == 2048) {
        r = 1024;
        ++hexp;
      }
      hbits = hexp >= 31 ? 0x7c00u : (static_cast<std::uint32_t>(hexp) << 10) | (r & 0x3ffu);
    }
    return static_cast<std::uint16_t>(sign | hbits);
  };
  int failures = 0;
  for (std::uint64_t x = 0; x <= 0xffffffffu; x += 65521) {
    const auto u = static_cast<std::uint32_t>(x);
    const float f = float_from_bits(u);
    if (std::isnan(f)) continue;
    const std::uint16_t want_h = ref_half(u);
    const std::uint16_t lo = u & 0xffffu, hi = static_cast<std::uint16_t>(u >> 16);
    const auto want_bf = static_cast<std::uint16_t>(hi + ((lo > 0x8000u || (lo == 0x8000u && (hi & 1))) ? 1 : 0));
    if (h(f) != want_h && ++failures <= 5)
      FAIL_CHECK("half(float 0x" << std::hex << u << ") = 0x" << h(f) << ", want 0x" << want_h);
    if (bf(f) != want_bf && ++failures <= 5)
      FAIL_CHECK("bfloat16(float 0x" << std::hex << u << ") = 0x" << bf(f) << ", want 0x" << want_bf);
  }
  CHECK(failures == 0);
}

TEST_CASE("dtype table", "[types]") {
  using plait::dtype;
  static_assert(plait::dtype_of<float> == dtype::f32);
  static_assert(plait::dtype_of<double> == dtype::f64);
  static_assert(plait::dtype_of<std::int8_t> == dtype::i8);
  static_assert(plait::dtype_of<std::int16_t> == dtype::i16);
  static_assert(plait::dtype_of<std::int32_t> == dtype::i32);
  static_assert(plait::dtype_of<std::int64_t> == dtype::i64);
  static_assert(plait::dtype_of<std::uint8_t> == dtype::u8);
  static_assert(plait::dtype_of<std::uint16_t> == dtype::u16);
  static_assert(plait::dtype_of<std::uint32_t> == dtype::u32);
  static_assert(plait::dtype_of<std::uint64_t> == dtype::u64);
  static_assert(plait::dtype_of<half> == dtype::f16);
  static_assert(plait::dtype_of<bfloat16> == dtype::bf16);
  static_assert(static_cast<int>(dtype::f32) == 1 && static_cast<int>(dtype::bf16) == 12);

  static_assert(plait::element_type<half> && plait::element_type<std::uint64_t>);
  static_assert(!plait::element_type<const float>);
  static_assert(!plait::element_type<char>);
  static_assert(!plait::element_type<bool>);
  static_assert(!plait::element_type<long double>);
  static_assert(!plait::element_type<float*>);

  static_assert(std::is_same_v<plait::compute_t<half>, float>);
  static_assert(std::is_same_v<plait::compute_t<bfloat16>, float>);
  static_assert(std::is_same_v<plait::compute_t<std::int8_t>, std::int8_t>);
  static_assert(std::is_same_v<plait::compute_t<double>, double>);

  const struct {
    dtype d;
    std::size_t size;
    const char* name;
  } table[] = {{dtype::f32, 4, "float"},  {dtype::f64, 8, "double"}, {dtype::i8, 1, "int8"},
               {dtype::i16, 2, "int16"},  {dtype::i32, 4, "int32"},  {dtype::i64, 8, "int64"},
               {dtype::u8, 1, "uint8"},   {dtype::u16, 2, "uint16"}, {dtype::u32, 4, "uint32"},
               {dtype::u64, 8, "uint64"}, {dtype::f16, 2, "half"},   {dtype::bf16, 2, "bfloat16"}};
  for (const auto& row : table) {
    CAPTURE(row.name);
    CHECK(plait::dtype_size(row.d) == row.size);
    CHECK(std::string(plait::dtype_name(row.d)) == row.name);
  }
  CHECK(plait::dtype_size(static_cast<dtype>(0)) == 0);
  CHECK(std::string(plait::dtype_name(static_cast<dtype>(200))) == "unknown");
}

TEST_CASE("to_compute and from_compute", "[types]") {
  static_assert(std::is_same_v<decltype(plait::to_compute(half(1.0f))), float>);
  CHECK(plait::to_compute(half::from_bits(0x3e00)) == 1.5f);
  CHECK(plait::from_compute<half>(1.5f).bits == 0x3e00);
  CHECK(plait::from_compute<bfloat16>(-2.0f).bits == 0xc000);
  CHECK(plait::to_compute(std::int16_t{-7}) == -7);
  CHECK(plait::from_compute<std::uint8_t>(200) == 200);
}
