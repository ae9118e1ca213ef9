// plait::tree — a pipelined binary tree (rooted at the call's root; rank 0 for all_reduce).
//
// Virtual rank v = (rank - root) mod n; parent (v-1)/2, children 2v+1 and 2v+2.
// Messages are cut into slices that stream up (reduce) and down (broadcast) the tree.
//
// reduce, S bytes, n ranks: depth ceil(log2(n+1)) - 1 hops; each non-root rank sends
//   S once; an inner node receives 2S. busbw factor 1.
// broadcast: the mirror image: each inner node receives S and sends 2S. busbw factor 1.
// all_reduce: reduce to rank 0 then broadcast, slice by slice. Each inner node moves
//   S up and 2S down; latency 2 * depth * slice + S / bandwidth. busbw factor 2(n-1)/n
//   (as nccl-tests reports any all-reduce), though the tree moves more bytes than the
//   ring: it wins on small messages (log n steps instead of 2(n-1)).
//   Timeline per rank: up(0) up(1) down(0) up(2) down(1) ... — the down phase of a
//   slice trails its up phase by `lag` slices, so a slice's round trip to the root
//   overlaps the next slices' ascent instead of stalling the pipe.
#pragma once

#include <plait/schedule.hpp>

namespace plait {

struct tree {
  static constexpr std::uint8_t id = 2;
  static constexpr const char* name = "tree";
  static constexpr int lag = 2;  // slices in flight between up and down phases (< FIFO depth)

  struct node {
    int parent = -1;
    int child[2] = {-1, -1};
  };
  static node shape(int rank, int size, int root) {
    node s;
    const int v = (rank - root + size) % size;
    auto real = [&](int w) { return (w + root) % size; };
    if (v > 0) s.parent = real((v - 1) / 2);
    if (2 * v + 1 < size) s.child[0] = real(2 * v + 1);
    if (2 * v + 2 < size) s.child[1] = real(2 * v + 2);
    return s;
  }

  // Reduce toward the root: input + children -> parent (or the root's output).
  static detail::step up(const node& t, std::size_t off, std::size_t len) {
    detail::step s;
    s.src = detail::region::input;
    s.src_offset = off;
    s.recv_peer[0] = t.child[0];
    s.recv_peer[1] = t.child[1];
    s.count = len;
    if (t.parent >= 0) {
      s.send_peer[0] = t.parent;
    } else {
      s.write_output = true;
      s.out_offset = off;
      s.finalize = true;
    }
    return s;
  }

  // Broadcast away from the root: parent -> output + children.
  static detail::step down(const node& t, std::size_t off, std::size_t len) {
    detail::step s;
    s.count = len;
    s.send_peer[0] = t.child[0];
    s.send_peer[1] = t.child[1];
    if (t.parent >= 0) {
      s.recv_peer[0] = t.parent;
      s.write_output = true;
      s.out_offset = off;
    } else {
      s.src = detail::region::output;
      s.src_offset = off;
    }
    return s;
  }

  static detail::schedule reduce(const detail::schedule_params& p) {
    detail::schedule out;
    const node t = shape(p.rank, p.size, p.root);
    detail::for_each_slice(p.count, p.slice_elems,
                           [&](std::size_t off, std::size_t len) { out.push_back(up(t, off, len)); });
    return out;
  }

  static detail::schedule broadcast(const detail::schedule_params& p) {
    detail::schedule out;
    const node t = shape(p.rank, p.size, p.root);
    detail::for_each_slice(p.count, p.slice_elems, [&](std::size_t off, std::size_t len) {
      detail::step s = down(t, off, len);
      if (s.sources() > 0 && (s.sends() > 0 || s.write_output)) out.push_back(s);
    });
    return out;
  }

  static detail::schedule all_reduce(const detail::schedule_params& p) {
    detail::schedule out;
    const node t = shape(p.rank, p.size, 0);
    std::vector<std::pair<std::size_t, std::size_t>> slices;
    detail::for_each_slice(p.count, p.slice_elems,
                           [&](std::size_t off, std::size_t len) { slices.emplace_back(off, len); });
    if (t.parent < 0) {  // the root reduces and starts the broadcast in one pass
      for (auto [off, len] : slices) {
        detail::step s = up(t, off, len);
        s.send_peer[0] = t.child[0];
        s.send_peer[1] = t.child[1];
        out.push_back(s);
      }
      return out;
    }
    const std::size_t k = slices.size();
    for (std::size_t i = 0; i < k + lag; ++i) {
      if (i < k) out.push_back(up(t, slices[i].first, slices[i].second));
      if (i >= static_cast<std::size_t>(lag)) {
        auto [off, len] = slices[i - lag];
        out.push_back(down(t, off, len));
      }
    }
    return out;
  }
};

}  // namespace plait
