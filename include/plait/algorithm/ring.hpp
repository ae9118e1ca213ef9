// plait::ring — the bandwidth-optimal ring (Patarasuk & Yuan; NCCL's and Gloo's ring).
//
// Ranks form a cycle r -> r+1 (all_reduce and reduce_scatter: or the one
// schedule_params::cycle gives, where the communicator groups ranks by CPU). Data is
// cut into rounds of n chunks of at most one slice each; every round runs the whole
// ring, so FIFO slots never hold more than one slice per peer per step and rounds
// pipeline behind each other.
//
// all_reduce (reduce-scatter then all-gather), S bytes, n ranks, per rank:
//   steps 2(n-1) per round; bytes sent 2(n-1)/n * S; busbw factor 2(n-1)/n
//   round timeline for rank r (c(s) = (r - s) mod n):
//     s=0         send            chunk c(0) from input            -> r+1
//     s=1..n-2    recv_reduce_send chunk c(s) (+ input)      r-1 -> r+1
//     s=n-1       recv_reduce_copy_send chunk c(n-1), finalize: the chunk is final here
//     s=n..2n-3   recv_copy_send  chunk c(s)                   r-1 -> r+1
//     s=2n-2      recv            chunk c(2n-2)
// all_gather / reduce_scatter: n-1 steps per slice, (n-1)/n * S sent (S = full size),
//   busbw factor (n-1)/n.
// broadcast: a pipelined chain from the root, n-1 hops; each rank sends S once
//   (the last sends nothing); busbw factor 1. Latency (n-1) * slice + S / bandwidth.
//   The chain follows schedule_params::chain (ranks sharing a CPU next to each other,
//   where the communicator knows it), else rank order from the root.
#pragma once

#include <plait/schedule.hpp>

namespace plait {

struct ring {
  static constexpr std::uint8_t id = 1;
  static constexpr const char* name = "ring";

  // count: elements of the whole vector.
  static detail::schedule all_reduce(const detail::schedule_params& p) {
    using namespace detail;
    schedule out;
    const int n = p.size;
    if (n == 1) return local_copy(p.count, p.slice_elems);
    const int r = cycle_index(p, p.rank);  // place on the cycle (p.cycle, or rank order)
    const int next = cycle_at(p, (r + 1) % n), prev = cycle_at(p, (r + n - 1) % n);
    const std::size_t round = p.slice_elems * static_cast<std::size_t>(n);
    for_each_slice(p.count, round, [&](std::size_t base, std::size_t len) {
      const std::size_t chunk = (len + static_cast<std::size_t>(n) - 1) / static_cast<std::size_t>(n);
      auto at = [&](int s) {  // chunk c(s) = (r - s) mod n: its offset and size
        const auto c = static_cast<std::size_t>(((r - s) % n + n) % n);
        const std::size_t lo = c * chunk < len ? c * chunk : len;
        const std::size_t hi = lo + chunk < len ? lo + chunk : len;
        return std::pair{base + lo, hi - lo};
      };
      auto [o0, n0] = at(0);
      out.push_back(send(next, region::input, o0, n0));
      for (int s = 1; s <= n - 2; ++s) {
        auto [o, c] = at(s);
        out.push_back(recv_reduce_send(prev, o, next, c));
      }
      {
        auto [o, c] = at(n - 1);
        out.push_back(recv_reduce_copy_send(prev, o, o, next, c));
      }
      for (int s = n; s <= 2 * n - 3; ++s) {
        auto [o, c] = at(s);
        out.push_back(recv_copy_send(prev, o, next, c));
      }
      auto [ol, cl] = at(2 * n - 2);
      out.push_back(recv(prev, ol, cl));
    });
    return out;
  }

  // count: elements of one shard (input); output holds n shards, rank i's at i*count.
  static detail::schedule all_gather(const detail::schedule_params& p) {
    using namespace detail;
    schedule out;
    const int n = p.size, r = p.rank;
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    auto block = [&](int s) { return static_cast<std::size_t>(((r - s) % n + n) % n) * p.count; };
    for_each_slice(p.count, p.slice_elems, [&](std::size_t off, std::size_t len) {
      step first = copy(region::input, off, block(0) + off, len);
      if (n > 1) first.send_peer[0] = next;
      out.push_back(first);
      for (int s = 1; s <= n - 2; ++s) out.push_back(recv_copy_send(prev, block(s) + off, next, len));
      if (n > 1) out.push_back(recv(prev, block(n - 1) + off, len));
    });
    return out;
  }

  // count: elements of one shard (output); input holds n shards.
  static detail::schedule reduce_scatter(const detail::schedule_params& p) {
    using namespace detail;
    schedule out;
    const int n = p.size;
    if (n == 1) return local_copy(p.count, p.slice_elems);
    const int r = cycle_index(p, p.rank);
    const int next = cycle_at(p, (r + 1) % n), prev = cycle_at(p, (r + n - 1) % n);
    // The block of the rank (s + 1) places back on the cycle, so that the last step
    // (s = n-1) reduces this rank's own block.
    auto block = [&](int s) { return static_cast<std::size_t>(cycle_at(p, ((r - s - 1) % n + n) % n)) * p.count; };
    for_each_slice(p.count, p.slice_elems, [&](std::size_t off, std::size_t len) {
      out.push_back(send(next, region::input, block(0) + off, len));
      for (int s = 1; s <= n - 2; ++s) out.push_back(recv_reduce_send(prev, block(s) + off, next, len));
      step last = recv_reduce_send(prev, block(n - 1) + off, -1, len);
      last.write_output = true;
      last.out_offset = off;
      last.finalize = true;
      out.push_back(last);
    });
    return out;
  }

  // In place: the root's output buffer is the source.
  static detail::schedule broadcast(const detail::schedule_params& p) {
    using namespace detail;
    schedule out;
    const int n = p.size;
    const int v = chain_pos(p, p.rank);  // position on the chain (p.chain, or rank order)
    const int next = v + 1 < n ? chain_rank(p, v + 1) : -1;
    const int prev = chain_rank(p, (v + n - 1) % n);
    for_each_slice(p.count, p.slice_elems, [&](std::size_t off, std::size_t len) {
      if (v == 0) {
        if (next >= 0) out.push_back(send(next, region::output, off, len));
      } else if (next >= 0) {
        out.push_back(recv_copy_send(prev, off, next, len));
      } else {
        out.push_back(recv(prev, off, len));
      }
    });
    return out;
  }
};

}  // namespace plait
