// plait::recursive_doubling — all_reduce in log2(n) pairwise exchanges (n a power of two).
//
// In round j each rank swaps its whole partial result with partner r xor 2^j and
// combines the two, the lower-ranked group's value first, so after the last round
// every rank holds ((x0 op x1) op (x2 op x3)) ... in the same association: the same
// bits everywhere, for any op, commutative or not.
//
// all_reduce, S bytes, n = 2^k ranks, per rank: k rounds of one send and one
// receive-reduce; bytes sent k * S. Against the tree (2k dependent hops: up, then
// down) it halves the latency; against the ring (2(n-1) hops) more so; it sends
// more bytes than either, so `automatic` takes it only for small messages
// (automatic::doubling_below_bytes). Per slice, every round runs before the next
// slice starts, so each pair's slots are ordered identically on both sides.
//
// all_gather, n = 2^k ranks: in round j each rank swaps the 2^j shards it holds (one
// run of the output: its group of 2^j ranks) with partner r xor 2^j, so k rounds
// (log2 n dependent hops against the ring's n-1) with one send and one receive
// each; (n-1)/n * S received per rank, as with the ring. Round 0 sends from the
// input while copying the own shard into place (one fused step).
#pragma once

#include <plait/schedule.hpp>

namespace plait {

struct recursive_doubling {
  static constexpr std::uint8_t id = 4;
  static constexpr const char* name = "recursive_doubling";

  static constexpr bool supports(int ranks) noexcept { return ranks > 0 && (ranks & (ranks - 1)) == 0; }

  // count: elements of the whole vector. Requires supports(size).
  static detail::schedule all_reduce(const detail::schedule_params& p) {
    using namespace detail;
    schedule out;
    const int n = p.size, r = p.rank;
    if (n == 1) return local_copy(p.count, p.slice_elems);
    for_each_slice(p.count, p.slice_elems, [&](std::size_t off, std::size_t len) {
      for (int bit = 1; bit < n; bit <<= 1) {
        const int partner = r ^ bit;
        // Round 0 reads the input; later rounds the partial result in the output.
        const region from = bit == 1 ? region::input : region::output;
        out.push_back(send(partner, from, off, len));
        step combine;
        combine.recv_peer[0] = partner;
        combine.src = from;
        combine.src_offset = off;
        combine.src_pos = static_cast<std::uint8_t>((r & bit) != 0 ? 1 : 0);  // the lower group first
        combine.write_output = true;
        combine.out_offset = off;
        combine.count = len;
        combine.finalize = bit << 1 >= n;
        out.push_back(combine);
      }
    });
    return out;
  }

  // count: elements of one shard (input); output holds n shards, rank i's at i*count.
  // Requires supports(size).
  static detail::schedule all_gather(const detail::schedule_params& p) {
    using namespace detail;
    schedule out;
    const int n = p.size, r = p.rank;
    const std::size_t c = p.count;
    const std::size_t own = static_cast<std::size_t>(r) * c;
    for_each_slice(c, p.slice_elems, [&](std::size_t off, std::size_t len) {
      step first = copy(region::input, off, own + off, len);
      if (n > 1) first.send_peer[0] = r ^ 1;
      out.push_back(first);
      if (n > 1) out.push_back(recv(r ^ 1, static_cast<std::size_t>(r ^ 1) * c + off, len));
    });
    for (int bit = 2; bit < n; bit <<= 1) {
      const int partner = r ^ bit;
      const std::size_t mine = static_cast<std::size_t>(r & ~(bit - 1)) * c;
      const std::size_t theirs = static_cast<std::size_t>(partner & ~(bit - 1)) * c;
      for_each_slice(static_cast<std::size_t>(bit) * c, p.slice_elems, [&](std::size_t off, std::size_t len) {
        out.push_back(send(partner, region::output, mine + off, len));
        out.push_back(recv(partner, theirs + off, len));
      });
    }
    return out;
  }
};

}  // namespace plait
