// A schedule: what one rank does in one collective, as plain data.
//
// An algorithm turns (collective, rank, size, count, slice) into an ordered list of
// steps. Each step moves at most one slice: it reads up to one local region and up
// to two received slots, reduces them (or copies, with one source), and writes the
// result to up to one local region and up to two outgoing slots — NCCL's verbs
// (send, recv, recv_reduce_send, recv_reduce_copy_send, recv_copy_send, copy) are
// the named shapes of this one step. Because every step touches one slot per peer,
// any schedule whose per-peer order matches its peers' is deadlock-free with FIFOs
// of depth >= 1, and deeper FIFOs let ranks run ahead (the pipeline).
// Schedules can be printed (to_string), checked, and costed without a transport.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace plait::detail {

enum class region : std::uint8_t { none, input, output };

struct step {
  std::int32_t recv_peer[2] = {-1, -1};  // received slots, reduced in this order after the local source
  std::int32_t send_peer[2] = {-1, -1};  // outgoing slots, each gets the result
  region src = region::none;             // local source buffer
  bool write_output = false;             // write the result to output[out_offset ...]
  bool finalize = false;                 // apply the op's finalize (avg: divide by n) to the result
  std::uint8_t src_pos = 0;              // where the local source goes among the received slots (0: first)
  std::size_t src_offset = 0;            // elements
  std::size_t out_offset = 0;            // elements
  std::size_t count = 0;                 // elements in this slice (0 still exchanges a header)

  int recvs() const noexcept { return (recv_peer[0] >= 0) + (recv_peer[1] >= 0); }
  int sends() const noexcept { return (send_peer[0] >= 0) + (send_peer[1] >= 0); }
  int sources() const noexcept { return (src != region::none) + recvs(); }
};

// Named constructors: the verbs algorithms are written in.
inline step copy(region from, std::size_t src_off, std::size_t out_off, std::size_t n, bool finalize = false) {
  step s;
  s.src = from;
  s.src_offset = src_off;
  s.write_output = true;
  s.out_offset = out_off;
  s.count = n;
  s.finalize = finalize;
  return s;
}
inline step send(int peer, region from, std::size_t src_off, std::size_t n) {
  step s;
  s.src = from;
  s.src_offset = src_off;
  s.send_peer[0] = peer;
  s.count = n;
  return s;
}
inline step recv(int peer, std::size_t out_off, std::size_t n) {
  step s;
  s.recv_peer[0] = peer;
  s.write_output = true;
  s.out_offset = out_off;
  s.count = n;
  return s;
}
// Receive from `from`, reduce with input[src_off...], send the partial result to `to`.
inline step recv_reduce_send(int from, std::size_t src_off, int to, std::size_t n) {
  step s;
  s.recv_peer[0] = from;
  s.src = region::input;
  s.src_offset = src_off;
  s.send_peer[0] = to;
  s.count = n;
  return s;
}
// Receive, reduce with input, finalize, write to output and send the final result on.
inline step recv_reduce_copy_send(int from, std::size_t src_off, std::size_t out_off, int to, std::size_t n) {
  step s = recv_reduce_send(from, src_off, to, n);
  s.write_output = true;
  s.out_offset = out_off;
  s.finalize = true;
  return s;
}
// Receive a final result, write it to output and forward it unchanged.
inline step recv_copy_send(int from, std::size_t out_off, int to, std::size_t n) {
  step s = recv(from, out_off, n);
  s.send_peer[0] = to;
  return s;
}

using schedule = std::vector<step>;

inline std::string verb(const step& s) {
  const bool reduce = s.sources() > 1;
  std::string v;
  if (s.recvs() > 0) v += "recv_";
  if (reduce) v += "reduce_";
  if (s.write_output && (s.recvs() > 0 || reduce)) v += "copy_";
  if (s.sends() > 0) v += "send";
  if (v.empty() || v.back() == '_') {
    if (!v.empty()) v.pop_back();
    if (v.empty()) v = s.write_output ? "copy" : "nop";
  }
  return v;
}

inline std::string to_string(const step& s) {
  std::string out = verb(s);
  out += " count=" + std::to_string(s.count);
  for (int p : s.recv_peer)
    if (p >= 0) out += " from=" + std::to_string(p);
  for (int p : s.send_peer)
    if (p >= 0) out += " to=" + std::to_string(p);
  if (s.src != region::none)
    out += std::string(s.src == region::input ? " in[" : " out[") + std::to_string(s.src_offset) + "]";
  if (s.write_output) out += " -> out[" + std::to_string(s.out_offset) + "]";
  if (s.src_pos != 0) out += " local@" + std::to_string(s.src_pos);
  if (s.finalize) out += " finalize";
  return out;
}

// What an algorithm is asked for.
struct schedule_params {
  int rank = 0;
  int size = 1;
  int root = 0;
  std::size_t count = 0;        // see each collective for what count means
  std::size_t slice_elems = 1;  // max elements per step
  // Every rank once, in the order a chain through them should take (from the root on,
  // wrapping round), or empty: rank order. The communicator sets it where ranks that
  // share a CPU are better next to each other (comm_config::chain); ring::broadcast
  // follows it.
  std::span<const int> chain{};
  // Every rank once, the cycle a ring's reductions take, or empty: rank order. The
  // communicator sets it where a ring of ranks grouped by CPU is faster
  // (comm_config::ring_follows_cpus); ring's all_reduce and reduce_scatter follow it.
  std::span<const int> cycle{};
};

// Where `rank` stands in `order` (its rank, when the order is empty: rank order).
inline int place_in(std::span<const int> order, int rank) noexcept {
  if (order.empty()) return rank;
  int i = 0;
  while (order[static_cast<std::size_t>(i)] != rank) ++i;
  return i;
}
// Where `rank` stands in p.chain.
inline int chain_index(const schedule_params& p, int rank) noexcept { return place_in(p.chain, rank); }
// Where `rank` stands on p.cycle, and the rank at place `i` (rank order, where empty).
inline int cycle_index(const schedule_params& p, int rank) noexcept { return place_in(p.cycle, rank); }
inline int cycle_at(const schedule_params& p, int i) noexcept {
  return p.cycle.empty() ? i : p.cycle[static_cast<std::size_t>(i)];
}
// The place of `rank` after the root along p.chain, and the rank at place `pos`.
inline int chain_pos(const schedule_params& p, int rank) noexcept {
  return (chain_index(p, rank) - chain_index(p, p.root) + p.size) % p.size;
}
inline int chain_rank(const schedule_params& p, int pos) noexcept {
  const int i = (chain_index(p, p.root) + pos) % p.size;
  return p.chain.empty() ? i : p.chain[static_cast<std::size_t>(i)];
}

// Slices of [0, count): at least one (possibly empty) slice so that count 0 still
// exchanges headers and a mismatch against it is caught.
template <class F>
void for_each_slice(std::size_t count, std::size_t slice, F&& f) {
  if (count == 0) {
    f(std::size_t{0}, std::size_t{0});
    return;
  }
  for (std::size_t off = 0; off < count; off += slice) f(off, count - off < slice ? count - off : slice);
}

// A world of one: every slice of input copied to output, finalized (avg divides by 1).
// all_reduce and reduce_scatter on a single rank, in every algorithm.
inline schedule local_copy(std::size_t count, std::size_t slice) {
  schedule out;
  for_each_slice(count, slice,
                 [&](std::size_t off, std::size_t len) { out.push_back(copy(region::input, off, off, len, true)); });
  return out;
}

}  // namespace plait::detail
