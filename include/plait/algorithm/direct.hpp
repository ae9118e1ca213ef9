// plait::direct — every rank talks to every other rank directly.
//
// all_to_all, S bytes per rank (n blocks of S/n): n-1 exchange rounds; in round k a
// rank sends block (r+k) to rank r+k and receives block (r-k) from rank r-k, slice by
// slice, so each pair's traffic is ordered identically on both sides. Bytes sent per
// rank (n-1)/n * S; busbw factor (n-1)/n. The own block is a local copy.
// all_reduce (small messages, 2 or 3 ranks): one exchange. Every rank sends its
// whole input to the others, then reduces the n contributions itself in rank order
// ((x0 op x1) op x2), so every rank gets the same bits for any op, commutative or
// not. One hop instead of the tree's 2 log n; bytes sent per rank (n-1) * S, so
// `automatic` takes it only below direct_below_bytes.
// all_gather, per slice: the own shard copied to its place and sent to every peer
// (two peers per step), then the n-1 peers' shards received in place. The same
// bytes as the ring ((n-1)/n * S sent per rank, busbw factor (n-1)/n) in one hop
// instead of n-1.
// reduce_scatter, per slice: block p of the input sent to rank p, for every peer;
// then this rank's block reduced with the n-1 received ones, two per step, its
// own first and the others in rank order ((y_r op y_a) op y_b ...). The ring's bytes,
// one hop; each block is computed on one rank only, so the order is free.
// send / recv: the message cut into slices, sent in order on the pair's FIFO;
// a send returns once its last slice is posted (small messages: before the receive
// is posted; large ones: when the receiver has drained all but the FIFO's depth).
#pragma once

#include <plait/schedule.hpp>

namespace plait {

struct direct {
  static constexpr std::uint8_t id = 3;
  static constexpr const char* name = "direct";

  // count: elements per block; input and output hold n blocks.
  static detail::schedule all_to_all(const detail::schedule_params& p) {
    using namespace detail;
    schedule out;
    const int n = p.size, r = p.rank;
    const std::size_t b = p.count;
    for_each_slice(b, p.slice_elems, [&](std::size_t off, std::size_t len) {
      out.push_back(
          copy(region::input, static_cast<std::size_t>(r) * b + off, static_cast<std::size_t>(r) * b + off, len));
    });
    for (int k = 1; k < n; ++k) {
      const int to = (r + k) % n, from = (r - k + n) % n;
      for_each_slice(b, p.slice_elems, [&](std::size_t off, std::size_t len) {
        out.push_back(send(to, region::input, static_cast<std::size_t>(to) * b + off, len));
        out.push_back(recv(from, static_cast<std::size_t>(from) * b + off, len));
      });
    }
    return out;
  }

  // count: elements of one shard (input); output holds n shards, rank i's at i*count.
  static detail::schedule all_gather(const detail::schedule_params& p) {
    using namespace detail;
    schedule out;
    const int n = p.size, r = p.rank;
    const std::size_t mine = static_cast<std::size_t>(r) * p.count;
    for_each_slice(p.count, p.slice_elems, [&](std::size_t off, std::size_t len) {
      step first = copy(region::input, off, mine + off, len);
      int k = 1;
      for (int slot = 0; slot < 2 && k < n; ++slot, ++k) first.send_peer[slot] = (r + k) % n;
      out.push_back(first);
      while (k < n) {
        step more = send((r + k) % n, region::input, off, len);
        ++k;
        if (k < n) more.send_peer[1] = (r + k++) % n;
        out.push_back(more);
      }
      for (int j = 1; j < n; ++j) {
        const int from = (r - j + n) % n;
        out.push_back(recv(from, static_cast<std::size_t>(from) * p.count + off, len));
      }
    });
    return out;
  }

  // count: elements of one shard (output); input holds n shards.
  static detail::schedule reduce_scatter(const detail::schedule_params& p) {
    using namespace detail;
    schedule out;
    const int n = p.size, r = p.rank;
    for_each_slice(p.count, p.slice_elems, [&](std::size_t off, std::size_t len) {
      for (int k = 1; k < n; ++k) {
        const int to = (r + k) % n;
        out.push_back(send(to, region::input, static_cast<std::size_t>(to) * p.count + off, len));
      }
      // Own block first, then the peers in rank order, two per step, into the output.
      step acc;
      acc.src = region::input;
      acc.src_offset = static_cast<std::size_t>(r) * p.count + off;
      acc.write_output = true;
      acc.out_offset = off;
      acc.count = len;
      int slot = 0;
      for (int q = 0; q < n; ++q) {
        if (q == r) continue;
        if (slot == 2) {
          out.push_back(acc);
          acc.src = region::output;
          acc.src_offset = off;
          acc.recv_peer[0] = acc.recv_peer[1] = -1;
          slot = 0;
        }
        acc.recv_peer[slot++] = q;
      }
      acc.finalize = true;
      out.push_back(acc);
    });
    return out;
  }

  // 2 or 3 ranks (max_all_reduce_ranks): one step reduces every contribution, so the
  // local input is read before the output is written, in place or not.
  static constexpr int max_all_reduce_ranks = 3;
  static detail::schedule all_reduce(const detail::schedule_params& p) {
    using namespace detail;
    schedule out;
    const int n = p.size, r = p.rank;
    if (n == 1) return local_copy(p.count, p.slice_elems);
    for_each_slice(p.count, p.slice_elems, [&](std::size_t off, std::size_t len) {
      step send_all = send((r + 1) % n, region::input, off, len);
      if (n == 3) send_all.send_peer[1] = (r + 2) % n;
      out.push_back(send_all);
      step reduce;  // x0 op x1 [op x2], x(r) being the local input
      reduce.src = region::input;
      reduce.src_offset = off;
      reduce.src_pos = static_cast<std::uint8_t>(r);
      for (int k = 0, slot = 0; k < n; ++k)
        if (k != r) reduce.recv_peer[slot++] = k;
      reduce.write_output = true;
      reduce.out_offset = off;
      reduce.count = len;
      reduce.finalize = true;
      out.push_back(reduce);
    });
    return out;
  }

  // In place: the root's output buffer is the source. Per slice the root sends to
  // every other rank (two per step) and each of them receives from the root.
  static detail::schedule broadcast(const detail::schedule_params& p) {
    using namespace detail;
    schedule out;
    const int n = p.size, r = p.rank, root = p.root;
    for_each_slice(p.count, p.slice_elems, [&](std::size_t off, std::size_t len) {
      if (r != root) {
        out.push_back(recv(root, off, len));
        return;
      }
      for (int k = 1; k < n; k += 2) {
        step s = send((root + k) % n, region::output, off, len);
        if (k + 1 < n) s.send_peer[1] = (root + k + 1) % n;
        out.push_back(s);
      }
    });
    return out;
  }

  static detail::schedule send_to(int peer, std::size_t count, std::size_t slice) {
    detail::schedule out;
    detail::for_each_slice(count, slice, [&](std::size_t off, std::size_t len) {
      out.push_back(detail::send(peer, detail::region::input, off, len));
    });
    return out;
  }

  static detail::schedule recv_from(int peer, std::size_t count, std::size_t slice) {
    detail::schedule out;
    detail::for_each_slice(count, slice,
                           [&](std::size_t off, std::size_t len) { out.push_back(detail::recv(peer, off, len)); });
    return out;
  }
};

// plait::automatic — picks an algorithm per call from the call alone (so every rank
// picks the same): for all_reduce on 2 or 3 ranks below direct_below_bytes(n) the
// one-exchange direct algorithm, on 4, 8, 16 ... ranks below doubling_below_bytes(n)
// recursive doubling (log2 n exchanges); else the tree below a size
// threshold (latency-bound: log n steps), the ring above it (bandwidth-bound).
// Replaced by the cost model when it exists.
struct automatic {
  static constexpr std::uint8_t id = 0;
  static constexpr const char* name = "automatic";
  static constexpr std::size_t tree_below_bytes = 64 * 1024;
  // One exchange beats the tree and the ring on 2 ranks up to 256 KiB (same bytes as
  // the ring, half the steps); on 3 ranks only while latency dominates (docs/performance.md).
  static constexpr std::size_t direct_below_bytes(int ranks) noexcept { return ranks == 2 ? 256 * 1024 : 16 * 1024; }
  // log2(n) exchanges beat the tree's 2 log2(n) hops while latency dominates: on 4
  // ranks below 64 KiB (4K: 10.9 vs 16.2 us), on 8 below 32 KiB (docs/performance.md).
  static constexpr std::size_t doubling_below_bytes(int ranks) noexcept { return ranks == 4 ? 64 * 1024 : 32 * 1024; }
  // reduce_scatter (S the whole input): direct below this, ring above. Measured on 4
  // ranks: 4K 16.7 vs 23.5 us, even at 16K, the ring ahead from 64K. all_gather does
  // not take direct (4 ranks, 4K: 8.8 vs the ring's 8.6 us) but recursive doubling
  // (doubling_gather).
  static constexpr std::size_t scatter_direct_below_bytes(int ranks) noexcept { return ranks >= 4 ? 16 * 1024 : 0; }
  // Over a network transport (tcp) every message costs system calls and wake-ups, and
  // with more ranks than cores each is paid on a shared core, so the number of
  // messages matters more than the hops: all_reduce takes the tree, which sends the
  // fewest (2(n-1) per slice), on 3 or more ranks up to this size, ahead of direct,
  // recursive doubling and the ring (4 ranks: 4K 77 vs 89 us, 64K 119 vs 242, 1M 1019
  // vs 1694; docs/performance.md), and reduce_scatter stays on the ring (4 ranks, 4K:
  // 109 vs 149 us with direct). When every rank is on one host (comm_config::one_host)
  // the tree goes on at every size: there the cost stays per message, not per byte on
  // a link (3, 4 and 8 ranks on 2 cores, 2M-128M: the tree 1.1-1.4x ahead of the
  // ring); between hosts the ring's fewer bytes per link win above this size.
  static constexpr std::size_t network_tree_upto_bytes = 1024 * 1024;
  // all_gather on 4, 8, ... ranks: recursive doubling (log2 n rounds) over a network
  // transport at every size: 4 ranks, tcp, against the ring: 4K 87 vs 110 us, 64K 94
  // vs 164, 1M 425 vs 617, 64M 36.8 vs 44.1 ms; 8 ranks 4K 291 vs 472 and level at 1M.
  // Over memory below doubling_gather_below_bytes (the whole output): 4 ranks on 2
  // cores 4K 9.9 vs 13.9 us, 64K 19.4 vs 22.5, 128K 34.3 vs 38.1; 8 ranks 4K 35.0 vs
  // 48.8, 64K 76.0 vs 99.8; the ring ahead from 512K (279 vs 207) (docs/performance.md).
  static constexpr std::size_t doubling_gather_below_bytes = 256 * 1024;
  // Where every peer reads one staged copy of a slice (comm_config::shares_copies:
  // shm), direct sends it to all peers for one copy in: broadcast on 3 or more ranks
  // from this size, 2 cores, against the ring: 3 ranks 64K 6.3 vs 8.5 us, 1M 102 vs
  // 242; 4 ranks 64K 6.5 vs 9.5, 1M 122 vs 228, 16M 5.9 vs 8.9 ms; 8 ranks 1M 169
  // vs 489, 16M 14.4 vs 27.6 ms (docs/performance.md, "One copy for several peers").
  static constexpr std::size_t broadcast_direct_from_bytes = 16 * 1024;
  // all_gather from this size (the whole output): 3 ranks 1M 283 vs 331 us, 16M 8.1
  // vs 11.2 ms; 4 ranks 4M 2.07 vs 2.54 ms, 16M 7.7 vs 12.5 (level at 1M); 8 ranks
  // 256K 187 vs 255 us, 16M 14.9 vs 30.0 ms. Below it the ring or recursive doubling.
  static constexpr std::size_t gather_direct_from_bytes(int ranks) noexcept {
    return ranks >= 8 ? 256 * 1024 : 1024 * 1024;
  }
  // all_gather over a network transport with ranks sharing the CPUs they are bound to
  // (comm_config::shared_cpus), from this size (the whole output): direct against
  // recursive doubling, tcp, bound round robin on 2 CPUs: 4 ranks 32M 14.1 vs 15.0 ms,
  // 64M 29.0 vs 32.0, 128M 58.3 vs 62.5 (level at 16M); 8 ranks 128M 139 vs 149 ms,
  // level at 32M, behind at 8M (docs/performance.md, "TCP, ranks sharing bound CPUs").
  static constexpr std::size_t network_gather_direct_from_bytes = std::size_t{64} << 20;
  static constexpr bool doubling_gather(int ranks, bool network, std::size_t total_bytes) noexcept {
    return ranks >= 4 && (ranks & (ranks - 1)) == 0 && (network || total_bytes < doubling_gather_below_bytes);
  }
};

}  // namespace plait
