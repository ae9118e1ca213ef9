// The call sequence of plait-soak: what each call is, drawn identically on every rank.
//
// A splitmix64 generator seeded from the command line draws each call's collective,
// element type, op (one valid for the type), algorithm, in-place or not, count
// (log-uniform), root or send/recv pair, pattern seed, alignment offset and poison
// byte. Every rank draws every call, including calls it takes no part in (a send/recv
// between two other ranks), so the sequences never drift apart. Plain data, no I/O.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "soak_reference.hpp"

namespace plait::soak {

enum class kind : std::uint8_t {
  all_reduce,
  all_gather,
  reduce_scatter,
  broadcast,
  reduce,
  all_to_all,
  send_recv,
  barrier
};
enum class elem : std::uint8_t { f32, i32, bf16, f64, u8 };
enum class redop : std::uint8_t { sum, prod, min, max, avg, band, bor, bxor };
enum class algo : std::uint8_t { automatic, ring, tree };

inline const char* name(kind k) {
  constexpr const char* n[] = {"all_reduce", "all_gather", "reduce_scatter", "broadcast",
                               "reduce",     "all_to_all", "send_recv",      "barrier"};
  return n[static_cast<int>(k)];
}
inline const char* name(elem e) {
  constexpr const char* n[] = {"float", "int32", "bfloat16", "double", "uint8"};
  return n[static_cast<int>(e)];
}
inline const char* name(redop o) {
  constexpr const char* n[] = {"sum", "prod", "min", "max", "avg", "band", "bor", "bxor"};
  return n[static_cast<int>(o)];
}
inline const char* name(algo a) {
  constexpr const char* n[] = {"automatic", "ring", "tree"};
  return n[static_cast<int>(a)];
}
inline std::size_t size_of(elem e) {
  constexpr std::size_t s[] = {4, 4, 2, 8, 1};
  return s[static_cast<int>(e)];
}

// One collective call, identical on every rank.
struct step {
  std::size_t index = 0;  // position in the sequence
  kind what = kind::barrier;
  elem type = elem::f32;
  redop op = redop::sum;
  algo alg = algo::automatic;
  bool in_place = false;
  bool async = false;
  std::size_t count = 0;  // elements of the largest buffer (block collectives use count / n per block)
  int root = 0;           // broadcast, reduce; the sender of a send/recv pair
  int peer = -1;          // send/recv: the receiver of a pair, or -1 for an exchange over `shift`
  int shift = 0;
  std::uint64_t seed = 0;  // pattern of this call
  std::size_t offset = 0;  // elements between the buffer start and the spans
  unsigned char poison = 0;
};

inline std::string describe(const step& s) {
  std::string d = "op " + std::to_string(s.index) + " " + name(s.what);
  if (s.what == kind::all_reduce || s.what == kind::broadcast) d += std::string("<") + name(s.alg) + ">";
  if (s.async) d += " async";
  if (s.what == kind::barrier) return d;
  if (s.what == kind::all_reduce) d += s.in_place ? " in-place" : " out-of-place";
  d += std::string(" ") + name(s.type);
  if (s.what == kind::all_reduce || s.what == kind::reduce_scatter || s.what == kind::reduce)
    d += std::string(" ") + name(s.op);
  d += " count " + std::to_string(s.count) + " offset " + std::to_string(s.offset);
  if (s.what == kind::broadcast || s.what == kind::reduce) d += " root " + std::to_string(s.root);
  if (s.what == kind::send_recv)
    d += s.peer >= 0 ? " " + std::to_string(s.root) + "->" + std::to_string(s.peer)
                     : " exchange shift " + std::to_string(s.shift);
  return d;
}

// splitmix64: the same numbers on every rank (ranks run the same binary, so the
// one libm call, in log_uniform, agrees too).
struct rng {
  std::uint64_t state;
  std::uint64_t next() {
    state += 0x9e3779b97f4a7c15ull;
    return mix(state - 0x9e3779b97f4a7c15ull);
  }
  std::uint64_t below(std::uint64_t n) { return next() % n; }
  bool percent(unsigned p) { return below(100) < p; }
  // Log-uniform in [0, max]: every order of magnitude about equally often.
  std::size_t log_uniform(std::size_t max) {
    const double u = static_cast<double>(next() >> 11) * 0x1p-53;
    const auto v = static_cast<std::size_t>(std::exp(u * std::log(static_cast<double>(max) + 1.0))) - 1;
    return v > max ? max : v;
  }
};

constexpr std::size_t max_in_flight = 4;

inline step draw_one(rng& r, kind what, int n, std::size_t max_bytes) {
  step s;
  s.what = what == kind::send_recv && n < 2 ? kind::barrier : what;
  s.type = static_cast<elem>(r.below(5));
  const bool integer = s.type == elem::i32 || s.type == elem::u8;
  s.op = static_cast<redop>(r.below(integer ? 8 : 5));
  s.alg = static_cast<algo>(r.below(3));
  s.in_place = r.percent(50);
  s.count = r.log_uniform(max_bytes / size_of(s.type));
  s.root = static_cast<int>(r.below(static_cast<std::uint64_t>(n)));
  if (s.what == kind::send_recv) {
    if (r.percent(50)) {
      s.peer = (s.root + 1 + static_cast<int>(r.below(static_cast<std::uint64_t>(n - 1)))) % n;
    } else {
      s.shift = 1 + static_cast<int>(r.below(static_cast<std::uint64_t>(n - 1)));
    }
  }
  s.seed = r.next();
  s.offset = r.below(4);
  s.poison = static_cast<unsigned char>(r.next());
  if (s.what == kind::barrier) s.count = 0;  // drawn all the same, so the sequence stays put
  return s;
}

// The next calls of the sequence: one call, or a batch of _async calls (mostly
// all_reduce) that are all in flight before the first wait. At most `room` calls.
inline std::vector<step> draw(rng& r, int n, std::size_t max_bytes, std::size_t room) {
  const unsigned pick = static_cast<unsigned>(r.below(100));
  std::vector<step> batch;
  if (pick < 12 && room > 1) {
    const std::size_t k = std::min<std::size_t>(room, 2 + r.below(max_in_flight - 1));
    for (std::size_t j = 0; j < k; ++j) {
      // all_reduce half the time, otherwise any collective with buffers on every rank.
      const kind what = r.percent(50) ? kind::all_reduce : static_cast<kind>(r.below(6));
      batch.push_back(draw_one(r, what, n, max_bytes));
      batch.back().async = true;
    }
    return batch;
  }
  kind what;
  if (pick < 37)
    what = kind::all_reduce;
  else if (pick < 47)
    what = kind::all_gather;
  else if (pick < 57)
    what = kind::reduce_scatter;
  else if (pick < 67)
    what = kind::broadcast;
  else if (pick < 77)
    what = kind::reduce;
  else if (pick < 86)
    what = kind::all_to_all;
  else if (pick < 95)
    what = kind::send_recv;
  else
    what = kind::barrier;
  batch.push_back(draw_one(r, what, n, max_bytes));
  batch.back().async = r.percent(10);
  return batch;
}

}  // namespace plait::soak
