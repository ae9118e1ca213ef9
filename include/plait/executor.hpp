// The executor: runs one rank's schedule over its links, slice by slice.
//
// advance() is a step function: it runs steps while their slots are ready (every
// received slot present, every outgoing slot free) and returns without blocking, so
// a progress thread, a blocking call and a simulator can all drive it; several calls
// may be in flight, each pair's traffic kept in issue order. check() turns a
// deadline, an abort or a failed peer into the call's error while waiting.
// Each step is one pass of the fused kernel: it reads the received slots and the
// local source, and writes the output and the outgoing slots directly (no staging).
// Where the transport can send from the caller's memory (tcp) and the result is
// already there (the output the step writes, or the source of a plain send), it is
// sent from there instead of a slot; the call then holds that memory until the
// bytes have left: no later step writes over it, and the call is done only then.
// A transport that lends the memory instead (shm's single copy: the receiver copies
// from it) is used so only where that pays (lending_pays), and a receiver copies
// such a slot straight into its output (link_set::receive_into). Where the transport
// can receive into the caller's memory (tcp), a frame that a step will only copy into
// the output is asked, a few steps ahead, to land there straight from the socket
// (link_set::expect); the step then has nothing left to copy.
// Where one slice of the caller's memory goes to several peers (a step with two
// sends, or the same slice again in the next step) and the transport can share a
// copy among them (link_set::shares_copies), it is copied once into the transport's
// staging memory and every one of those peers reads it there (link_set::stage).
// Every received slot is checked against the call: a different call description is
// `mismatch` naming both sides; an error notice from a peer is `mismatch` naming it.
// Not thread-safe: one call is driven by one thread at a time.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include <plait/detail/doorbell.hpp>
#include <plait/detail/timed_choice.hpp>
#include <plait/error.hpp>
#include <plait/kernel/copy.hpp>
#include <plait/schedule.hpp>
#include <plait/transport.hpp>
#include <plait/wire.hpp>

namespace plait::detail {

// The fused kernel for one (element type, op), behind a plain function pointer so
// the executor is compiled once, not once per composition.
using kernel_fn = void (*)(const void* op, const void* const* srcs, int nsrc, void* const* dsts, int ndst,
                           std::size_t count, int finalize_n) noexcept;

struct call {
  call_desc desc;
  schedule steps;
  std::size_t elem_size = 1;
  const std::byte* input = nullptr;
  std::byte* output = nullptr;
  kernel_fn kernel = nullptr;
  alignas(16) std::byte op[64] = {};  // a copy of the op functor (trivially copyable)
  int finalize_n = 1;                 // n for finalize (avg divides by it)
  clock::time_point deadline{};
  // The time the call is given, counted from when it enters the engine (comm_core
  // turns it into `deadline` with the clock read of the pass that takes the call in).
  std::chrono::nanoseconds timeout{0};
  std::size_t next = 0;       // first step not yet done
  std::size_t land_next = 0;  // first step not yet looked at for a landing (expect_landings)
  // Steps not yet done that send to / receive from each peer: a later call may use
  // a peer's FIFO only once every earlier call is done with it (per-pair order).
  std::vector<std::uint32_t> sends_left, recvs_left;
  int gave_up_on = -1;  // a peer closed after timing out waiting for this rank: name it at the deadline
  // An all_gather's or a broadcast's choice between lending and slots (lend_choice,
  // broadcast_lend_choice; rule: lending_pays alone decides); `timed`: comm_core times
  // the call for one of its choices from when it entered the engine (deadline - timeout).
  lend_plan lend = lend_plan::rule;
  // A broadcast's choice between slots written past the cache and plain ones
  // (stream_choice; rule: streams_slots and what the readers measured decide); an
  // all_reduce's or a reduce_scatter's (comm_core's reduction stream choices; rule:
  // plain).
  stream_plan stream = stream_plan::rule;
  bool timed = false;
  // Sends whose payload the transport still reads from this call's buffers
  // (link_set::post_from): no step may write over them, and the call is not done,
  // until they have left.
  struct pending_send {
    int peer;
    std::uint64_t ticket;
    const std::byte* begin;
    const std::byte* end;
  };
  std::vector<pending_send> pending;

  // Also makes room for every send to be pending at once, so that no call that
  // follows one of the same shape grows `pending` (allocates) while it runs.
  void count_peers(int size) {
    sends_left.assign(static_cast<std::size_t>(size), 0);
    recvs_left.assign(static_cast<std::size_t>(size), 0);
    std::size_t sends = 0;
    for (const step& s : steps) {
      for (int p : s.send_peer)
        if (p >= 0) ++sends_left[static_cast<std::size_t>(p)], ++sends;
      for (int p : s.recv_peer)
        if (p >= 0) ++recvs_left[static_cast<std::size_t>(p)];
    }
    pending.reserve(sends);
  }
  bool done() const noexcept { return next >= steps.size() && pending.empty(); }

  // Back to a fresh call, keeping the vectors' memory (comm_core reuses calls, so a
  // call in a loop allocates nothing once the first has run).
  void reset() noexcept {
    schedule s = std::move(steps);
    std::vector<std::uint32_t> sl = std::move(sends_left), rl = std::move(recvs_left);
    std::vector<pending_send> pd = std::move(pending);
    *this = call{};
    s.clear();
    sl.clear();
    rl.clear();
    pd.clear();
    steps = std::move(s);
    sends_left = std::move(sl);
    recvs_left = std::move(rl);
    pending = std::move(pd);
  }
};

class executor {
 public:
  // `last_seen` (2 x size entries, kept by the communicator across calls) records
  // the highest collective and send/recv sequence number seen from each peer.
  // `oversubscribed`: more ranks than cores on this host (likely), so a rank that
  // waits for a peer often waits for it to be scheduled. `lend_always`: lend every
  // plain copy the transport can, not only where lending_pays. `stream_from`: all_gather
  // calls whose output is this large or larger copy into it with non-temporal stores;
  // `broadcast_stream_from`: broadcasts, likewise.
  executor(int rank, int size, link_set* links, doorbell& bell, const std::atomic<bool>& aborted,
           std::span<std::uint64_t> last_seen, bool oversubscribed = false, bool lend_always = false,
           std::size_t stream_from = std::numeric_limits<std::size_t>::max(),
           std::size_t broadcast_stream_from = std::numeric_limits<std::size_t>::max())
      : rank_(rank),
        size_(size),
        links_(links),
        bell_(bell),
        aborted_(aborted),
        last_seen_(last_seen),
        oversubscribed_(oversubscribed),
        lend_always_(lend_always),
        stream_from_(stream_from),
        broadcast_stream_from_(broadcast_stream_from) {}

  // Runs steps while they are ready. Returns true when the call is complete.
  // `earlier` are the calls issued before this one and not yet complete: a step
  // waits while any of them still has traffic with the same peer in the same
  // direction, so each pair's slots stay in issue order.
  bool advance(call& c, std::span<call* const> earlier = {}) {
    while (c.next < c.steps.size()) {
      const step& s = c.steps[c.next];
      if (!earlier.empty() && blocked_by(s, earlier)) return false;
      if (earlier.empty() && links_ != nullptr) expect_landings(c);
      if (!try_step(c, s)) return false;
      for (int p : s.send_peer)
        if (p >= 0) --c.sends_left[static_cast<std::size_t>(p)];
      for (int p : s.recv_peer)
        if (p >= 0) --c.recvs_left[static_cast<std::size_t>(p)];
      ++c.next;
    }
    return drained(c, nullptr, nullptr);
  }

  // Sends from the caller's memory are worth it from this size (below it the copy
  // into the slot costs less than keeping track).
  static constexpr std::size_t min_send_from_memory = 16 * 1024;
  // A slice for several peers is staged once (link_set::stage) from this size.
  static constexpr std::size_t min_share_bytes = 16 * 1024;
  // Lending (a send by reference, link_set::sends_by_reference) pays for every call
  // of a copy-only collective from this size (the whole call's bytes).
  static constexpr std::size_t lend_from_call_bytes = 8 * 1024 * 1024;
  // all_gather with a core per rank (lends_any_memory) may lend from this size, where
  // lend_choice finds it faster: its own block's send goes before its copy, so the
  // peer's single copy and this rank's own copy overlap (docs/performance.md, "The own
  // block's send goes before its copy"). From 64K until blocks of 16K and up went by
  // reference (shm_link_set::min_reference_bytes): 2 ranks, 32K 4.7 -> 2.6 us, 64K
  // 5.2 -> 3.6 ("all_gather lends from 32 KiB of output").
  static constexpr std::size_t lend_gather_from_bytes = 32 * 1024;
  // A broadcast of one slot with a core per rank may lend from this size (shm posts
  // by reference from shm_link_set::min_reference_bytes), where its readers timed
  // lending as faster (comm_core's broadcast_lend_choice). 2 ranks, shm, 480 MiB L3
  // host type: 16K 2.3 -> 1.7 us, 256K 13.9 -> 9.5, 1M 61 -> 50; from 2 MiB (two
  // slices) lending was slower, 4M 293 -> 418 ("broadcast lends or not, by timing both").
  static constexpr std::size_t lend_broadcast_from_bytes = 16 * 1024;
  // An all_reduce or a reduce_scatter with a core per rank may write its slots past
  // the cache from this many bytes of its count (an all_reduce's vector, a
  // reduce_scatter's shard), where its timing finds that faster
  // (streams_reduction_slots). Below it calls are too short to time apart: timed from
  // 1 KiB, outside the slow windows 4 of 16 runs kept streamed slots at 4K-16K where
  // plain ones were up to 1.4x faster (docs/performance.md, "Reductions' slots past the
  // cache, by timing both").
  static constexpr std::size_t stream_reduction_from_bytes = 16 * 1024;
  // all_gather calls from gather_copy_slice_from (8 MiB, where lending pays) up to
  // gather_copy_slice_below of output go in the slices of plain copies
  // (comm_config::copy_slice_bytes, 1 MiB on shm) rather than the reductions' (256K),
  // and where they lend from any memory their own block is copied with plain stores
  // (streams()). Measured (docs/performance.md, "all_gather of 8 to 64 MiB in 1 MiB
  // slices"): 2 ranks 8M-32M 1.06-1.38x less time, 4 ranks level to 1.36x; from 64
  // MiB, slots with non-temporal stores beat lending on one host type and lose on
  // another, so the rule stops there.
  static constexpr std::size_t gather_copy_slice_from = lend_from_call_bytes;
  static constexpr std::size_t gather_copy_slice_below = 64 * 1024 * 1024;
  static constexpr bool gather_in_copy_slices(std::size_t output_bytes) noexcept {
    return output_bytes >= gather_copy_slice_from && output_bytes < gather_copy_slice_below;
  }
  // How far ahead of the next step frames are asked to land in the output.
  static constexpr std::size_t landing_lookahead = 16;

  // Throws if the call cannot go on: aborted, past its deadline, or a peer it waits
  // on has failed. Called between advances, while waiting.
  void check(call& c, clock::time_point now, bool health) {
    if (aborted_.load(std::memory_order_acquire))
      throw error(errc::aborted, "abort() was called on this communicator; recreate it to go on", rank_, -1,
                  c.desc.sequence);
    if (health) check_peers(c);
    if (now >= c.deadline) throw timed_out(c);
  }

  static constexpr auto max_sleep = std::chrono::milliseconds(50);

  // Tells every peer this rank failed call `d` (best effort, bounded): an error-notice
  // slot in each peer's FIFO, which they see at the head and turn into `mismatch`.
  // `culprit` is the rank the failure is blamed on (this rank for its own misuse;
  // the peer whose slot did not match for a mismatch), `code` what it was.
  void send_notice(const call_desc& d, clock::time_point deadline, int culprit, errc code) noexcept {
    if (links_ == nullptr) return;
    links_->release_io(false);  // the transport's own thread delivers them (this wait moves no bytes)
    slot_header h;
    h.flags = slot_error_notice;
    h.sender = rank_;
    h.desc = d;
    h.offset = static_cast<std::uint64_t>(code);
    h.reserved = static_cast<std::uint64_t>(culprit + 1);
    for (int p = 0; p < size_; ++p) {
      if (p == rank_ || !links_->reaches(p)) continue;
      try {
        for (;;) {
          const std::uint32_t seen = bell_.snapshot();
          if (links_->acquire(p) != nullptr) {
            links_->post(p, h);
            break;
          }
          if (clock::now() >= deadline) break;
          links_->health(p);
          bell_.wait(seen, std::chrono::milliseconds(10));
        }
      } catch (...) {
        // the peer is gone or broken: nothing more to tell it
      }
    }
  }

 private:
  // A send by reference leaves the bytes where they are and the receiver copies them:
  // it saves a copy only where every receive is a plain copy into the output
  // (broadcast, send/recv, all_gather), and the lender's call ends only once its
  // reader has copied. Measured (docs/performance.md, "Single copy on shm"): it pays
  // only from 8 MiB per call, for all_gather (from lend_gather_from_bytes with a core
  // per rank), and for broadcast and send/recv only with more ranks than cores (and
  // a broadcast with a core per rank, as timed: below). With a core per rank, a plain copy through slots in 1 MiB
  // slices keeps both cores copying and beats the reader's single copy (2 ranks, huge pages: 16M 623 against 1013 us,
  // 128M 8233 against 10860), except while the two cores trade dirty lines slowly (slots 5-10 times slower, lending
  // not: docs/performance.md, "A broadcast of several slices lends or not, by timing both"). An all_gather that lends
  // from any memory lends only where its plan (call::lend, comm_core's lend_choice) is not slots. A broadcast with a
  // core per rank lends each slice of a call from lend_broadcast_from_bytes, as its plan says (call::lend, comm_core's
  // broadcast_lend_choice) or, once its readers timed both for the call's size, as every one of them found faster
  // (link_set::lending_measured).
  bool lending_pays(const call& c, const step& s) const noexcept {
    const bool gather = c.desc.kind == collective_kind::all_gather;
    if (!gather && c.desc.kind != collective_kind::broadcast && c.desc.kind != collective_kind::point_to_point)
      return false;
    if (lend_always_) return true;
    if (gather && lends_any_memory(c)) return output_bytes(c) >= lend_gather_from_bytes && c.lend != lend_plan::slots;
    if (!gather && lends_any_memory(c)) {
      if (output_bytes(c) < lend_broadcast_from_bytes || c.lend == lend_plan::slots) return false;
      if (c.lend == lend_plan::lend) return true;
      for (int p : s.send_peer)
        if (p >= 0 && links_->lending_measured(p, output_bytes(c)) != 1) return false;
      return true;
    }
    // With more ranks than cores a broadcast whose output is written past the cache
    // goes through slots: its readers copy them out of the cache, not the root's
    // buffer out of memory (comm_config::broadcast_stream_from).
    return output_bytes(c) >= lend_from_call_bytes && (gather || (oversubscribed_ && !streams(c)));
  }

  // Whether what lending_pays lends may be on any pages (link_set::lend_any_memory),
  // not only on the huge pages shm otherwise asks for: all_gather and broadcast with a
  // core per rank. Measured (docs/performance.md, "all_gather lends from 4 KiB
  // pages"): 2 ranks, 8M-128M, 7-14 % less time than through slots; with 4 ranks on
  // 2 cores the A/B was within the noise, so there shm keeps to huge pages.
  bool lends_any_memory(const call& c) const noexcept {
    return (c.desc.kind == collective_kind::all_gather || c.desc.kind == collective_kind::broadcast) &&
           !oversubscribed_;
  }

  // The bytes of a call's output (all_gather's holds every rank's shard).
  std::size_t output_bytes(const call& c) const noexcept {
    const bool gather = c.desc.kind == collective_kind::all_gather;
    return c.desc.count * c.elem_size * (gather ? static_cast<std::size_t>(size_) : 1);
  }

  // Whether the call's copies into its output skip the cache: all_gather calls from
  // stream_from_ bytes of output, broadcasts from broadcast_stream_from_ (comm_config::
  // broadcast_stream_from). Measured (docs/performance.md, "all_gather copies into a
  // large output past the cache"): all_gather ahead at 16M and more in every run;
  // broadcast and all_reduce ahead in some runs and behind in others; broadcast, 2
  // ranks, ahead beyond half the last-level cache and behind below ("A broadcast's
  // output past the cache, beyond half the last-level cache"); all_reduce not yet.
  // Not where the call lends from any memory in copy slices (gather_in_copy_slices):
  // there a peer's single copy reads this rank's input while it copies its own block,
  // and non-temporal stores made that 1.4x slower (16M in one 8M slice: 2078 against
  // 1464 us). Where such a call goes through slots (call::lend), it streams.
  bool streams(const call& c) const noexcept {
    if (c.desc.kind == collective_kind::broadcast) return output_bytes(c) >= broadcast_stream_from_;
    if (c.desc.kind != collective_kind::all_gather || output_bytes(c) < stream_from_) return false;
    return !(gather_in_copy_slices(output_bytes(c)) && lends_any_memory(c) && c.lend != lend_plan::slots);
  }

  // Whether a plain copy of `bytes` into slots goes past the cache, where the transport
  // says its peers read such slots faster from memory (link_set::streams_slots):
  // for broadcast, and all_gather from gather_streams_slots_from, with a core per rank
  // (a peer on this very core would read them from memory). Measured against plain
  // stores, 2 ranks on shm (docs/performance.md, "Slots of 16 to 256 KiB written past
  // the cache"): broadcast 16K 2.5 -> 1.7 us, 64K 8.1 -> 5.4, 128K 14.1 -> 10.3;
  // all_gather 128K 13.6 -> 7.8, level at 64K and behind at 32K (3.0 -> 3.3, 16K
  // slots); all_reduce and reduce_scatter behind (all_reduce 128K 16.4 -> 21.6), so
  // not there: there each rank writes its slot and reads the other's at once, and
  // no sender runs ahead of its reader.
  // Which of the two is faster depends on the host (the same 64 KiB slot: streamed 4.4
  // against plain 9.2 us on one host type, 6.3 against 3.5 on another), so a broadcast
  // times both (call::stream, comm_core's stream_choice), and once a reader has
  // measured a size, its writers follow it (link_set::streamed_slots_measured).
  bool streams_slots(const call& c, std::size_t bytes) const noexcept {
    if (oversubscribed_ || c.stream == stream_plan::plain) return false;
    return c.desc.kind == collective_kind::broadcast ||
           (c.desc.kind == collective_kind::all_gather && bytes >= gather_streams_slots_from);
  }
  static constexpr std::size_t gather_streams_slots_from = 64 * 1024;

  // Whether an all_reduce's or a reduce_scatter's step writes its slots past the cache:
  // where its plan says so (call::stream, timed by comm_core's reduction stream
  // choices) and the transport lets every peer it sends to read such slots. A step
  // that copies one source does so with non-temporal stores; one that reduces into the
  // output writes the output, then copies it into the slots so (run_kernel); one that
  // reduces into slots alone (a ring of 3 ranks or more, before the last) keeps plain
  // stores. While two cores trade dirty lines slowly (2 ranks, shm, the 32 MiB L3 host
  // type, in windows of seconds to minutes), plain slots made a 2-rank all_reduce of
  // 1 MiB take 810 us against 104-110 streamed, 16 MiB 13.2 ms against 2.1-2.2; outside
  // them plain slots are the faster, 57 against 139 us and 2.0 against 3.7 ms
  // (docs/performance.md, "Reductions' slots past the cache, by timing both").
  bool streams_reduction_slots(const call& c, const step& s) const noexcept {
    if (c.stream != stream_plan::stream ||
        (c.desc.kind != collective_kind::all_reduce && c.desc.kind != collective_kind::reduce_scatter))
      return false;
    for (int p : s.send_peer)
      if (p >= 0 && !links_->can_stream_slots(p)) return false;
    return true;
  }

  // Runs the kernel of a ready step; `out`, where the step writes the output, is the
  // last of `dsts`. A step that only copies one source writes the output of a call
  // that streams() with non-temporal stores, and its slots through the kernel with
  // plain ones (the peer reads them soon, from cache), except the first `streamed`
  // of `dsts`: slots try_step found better written past the cache. A reduction step
  // with such slots writes the output first and copies the slots from it.
  void run_kernel(call& c, const step& s, const void* const* srcs, int ns, void* const* dsts, int nd,
                  const std::byte* out, int streamed) {
    const std::size_t bytes = s.count * c.elem_size;
    if (streamed > 0 && ns == 1 && !s.finalize) {
      for (int i = 0; i < streamed; ++i) kernel::copy_bytes_streaming(dsts[i], srcs[0], bytes);
      if (out == nullptr || out == srcs[0]) return;
      if (streams(c))
        kernel::copy_bytes_streaming(dsts[nd - 1], srcs[0], bytes);
      else
        c.kernel(c.op, srcs, ns, dsts + streamed, nd - streamed, s.count, 0);
      return;
    }
    if (streamed > 0 && out != nullptr) {
      c.kernel(c.op, srcs, ns, dsts + streamed, nd - streamed, s.count, s.finalize ? c.finalize_n : 0);
      for (int i = 0; i < streamed; ++i) kernel::copy_bytes_streaming(dsts[i], out, bytes);
      return;
    }
    if (ns == 1 && !s.finalize && out != nullptr && out != srcs[0] && streams(c)) {
      if (nd > 1) c.kernel(c.op, srcs, ns, dsts, nd - 1, s.count, 0);
      kernel::copy_bytes_streaming(dsts[nd - 1], srcs[0], bytes);
      return;
    }
    c.kernel(c.op, srcs, ns, dsts, nd, s.count, s.finalize ? c.finalize_n : 0);
  }

  // Asks the transport to land in the output the frames of the steps ahead that only
  // copy one received slot there (link_set::expect). Only for a call with no earlier
  // one in flight, so that the frames still to come from each peer are this call's,
  // in step order. Each step is looked at once; a frame beyond the peer's window is
  // asked for again when this runs next.
  void expect_landings(call& c) {
    if (c.land_next < c.next) c.land_next = c.next;
    const std::size_t end = std::min(c.steps.size(), c.next + landing_lookahead);
    for (; c.land_next < end; ++c.land_next) {
      const step& s = c.steps[c.land_next];
      std::byte* out = landing_place(c, s);
      if (out == nullptr) continue;
      const int p = s.recv_peer[0];
      std::size_t ahead = 0;  // frames from p before this one, for the steps before it
      for (std::size_t i = c.next; i < c.land_next; ++i)
        for (int q : c.steps[i].recv_peer) ahead += q == p ? 1 : 0;
      slot_header h;
      h.bytes = static_cast<std::uint32_t>(s.count * c.elem_size);
      h.sender = p;
      h.desc = c.desc;
      if (links_->expect(p, ahead, h, out) == link_set::expectation::later) return;
    }
  }

  // Where step `s` (the one at c.land_next) may have its frame land: its output
  // region, when the step only copies one received slot there and sends nothing
  // from a slot, and when nothing before it in this call (the steps not yet done,
  // the sends still reading the caller's memory) reads or writes that region; else
  // null. Small slices go through staging anyway (below min_send_from_memory).
  std::byte* landing_place(call& c, const step& s) {
    if (s.recvs() != 1 || s.recv_peer[0] < 0 || s.src != region::none || s.finalize || !s.write_output) return nullptr;
    const std::size_t bytes = s.count * c.elem_size;
    if (bytes < min_send_from_memory || !links_->receives_into_memory(s.recv_peer[0])) return nullptr;
    for (int q : s.send_peer)
      if (q >= 0 && (!links_->sends_from_memory(q) || links_->sends_by_reference(q))) return nullptr;
    std::byte* out = c.output + s.out_offset * c.elem_size;
    std::byte* const end = out + bytes;
    auto overlaps = [&](const std::byte* b, std::size_t n) { return b < end && out < b + n; };
    for (std::size_t i = c.next; i < c.land_next; ++i) {
      const step& e = c.steps[i];
      const std::size_t n = e.count * c.elem_size;
      if (e.src != region::none &&
          overlaps((e.src == region::input ? c.input : c.output) + e.src_offset * c.elem_size, n))
        return nullptr;
      if (e.write_output && overlaps(c.output + e.out_offset * c.elem_size, n)) return nullptr;
    }
    if (!c.pending.empty() && !drained(c, out, end)) return nullptr;
    return out;
  }

  static bool blocked_by(const step& s, std::span<call* const> earlier) {
    for (const call* e : earlier) {
      for (int p : s.send_peer)
        if (p >= 0 && e->sends_left[static_cast<std::size_t>(p)] > 0) return true;
      for (int p : s.recv_peer)
        if (p >= 0 && e->recvs_left[static_cast<std::size_t>(p)] > 0) return true;
    }
    return false;
  }

  // Forgets the sends from memory that have left; true when none is left that
  // overlaps [begin, end) (none at all when begin is null).
  bool drained(call& c, const std::byte* begin, const std::byte* end) {
    bool clear = true;
    for (std::size_t i = 0; i < c.pending.size();) {
      const call::pending_send& p = c.pending[i];
      if (links_->sent(p.peer, p.ticket)) {
        c.pending[i] = c.pending.back();
        c.pending.pop_back();
        continue;
      }
      if (begin == nullptr || (p.begin < end && begin < p.end)) clear = false;
      ++i;
    }
    return clear;
  }

  bool try_step(call& c, const step& s) {
    // Sources in reduction order: the received slots, with the local source at
    // position src_pos among them (0: first).
    const void* srcs[3];
    void* dsts[3];
    int ns = 0, nd = 0;
    const std::byte* local = nullptr;
    if (s.src != region::none) local = (s.src == region::input ? c.input : c.output) + s.src_offset * c.elem_size;
    const std::size_t bytes = s.count * c.elem_size;
    std::byte* out = s.write_output ? c.output + s.out_offset * c.elem_size : nullptr;
    // A send still reading the memory this step writes goes first.
    if (out != nullptr && !c.pending.empty() && !drained(c, out, out + bytes)) return false;
    // Where the result already is in the caller's memory (the local source of a step
    // that receives nothing, whose output is a plain copy of it; else the output this
    // step writes), the transport may send it from there instead of from a slot the
    // kernel fills.
    const std::byte* from = nullptr;
    bool lend = false;
    // The step's kernel does not write what it sends (its local source): the send may
    // go first. Not decided by comparing pointers: in place, an output can be at the
    // very address of the local source that a reduction reads.
    const bool sends_local = s.recvs() == 0 && local != nullptr && !s.finalize;
    const bool share = sends_local && shares(c, s, bytes);
    if (links_ != nullptr && bytes >= min_send_from_memory && s.sends() > 0 && !share) {
      if (sends_local)
        from = local;
      else if (out != nullptr)
        from = out;
      lend = lending_pays(c, s);
      for (int p : s.send_peer)
        if (p >= 0 && from != nullptr && (!links_->sends_from_memory(p) || (!lend && links_->sends_by_reference(p))))
          from = nullptr;
    }
    int recv_from[3];
    const std::byte* received[3];  // null: still in the sender's memory (fetch() brings it)
    int nr = 0;
    for (int p : s.recv_peer) {
      if (p < 0) continue;
      slot_view v = links_->peek(p);
      if (v.header == nullptr) return false;
      check_slot(c, s, p, *v.header, bytes);
      recv_from[nr] = p;
      received[nr++] = v.payload;
    }
    std::byte* slots[2];
    int nslots = 0;
    for (int p : s.send_peer) {
      if (p < 0) continue;
      std::byte* slot = links_->acquire(p);
      if (slot == nullptr) return false;
      slots[nslots++] = slot;
    }
    // Ready. A slice shared by several peers is staged once, or was by the step before.
    std::uint64_t staged = 0;
    if (share) {
      const bool again = shared_.sequence == c.desc.sequence && shared_.kind == c.desc.kind && shared_.c == &c &&
                         shared_.step + 1 == c.next && shared_.from == local && shared_.bytes == bytes;
      staged = again ? shared_.handle : links_->stage(local, bytes);
      shared_ = {};
      if (staged != 0) shared_ = {&c, c.desc.sequence, c.desc.kind, c.next, local, bytes, staged};
    }
    // Slots this step's kernel fills; a plain copy fills them with non-temporal stores
    // where it pays (streams_slots below).
    int streamed = 0;
    if (from == nullptr && staged == 0) {
      for (int i = 0; i < nslots; ++i) dsts[nd++] = slots[i];
      const bool one_source = nr + (local != nullptr ? 1 : 0) == 1;
      if (nslots > 0 && streams_slots(c, bytes) && !s.finalize && one_source) {
        streamed = nslots;
        for (int p : s.send_peer)
          if (p >= 0 && (!links_->streams_slots(p, bytes) ||
                         (c.stream == stream_plan::rule && links_->streamed_slots_measured(p, bytes) == 0)))
            streamed = 0;
      } else if (nslots > 0 && ((one_source && !s.finalize) || out != nullptr) && streams_reduction_slots(c, s)) {
        streamed = nslots;
      }
    }
    // A send from the local source goes before the kernel runs (it does not write
    // those bytes): a peer that copies them from this rank's memory does so while this
    // rank copies its own block (docs/performance.md, "The own block's send goes
    // before its copy"). So does a staged one: its peers read it while this rank copies.
    const bool send_first = (from != nullptr && sends_local) || staged != 0;
    if (send_first) post_sends(c, s, bytes, from, lend, staged);
    // Every slot is here and every outgoing slot free. A plain copy of one
    // slot still in the sender's memory into the output goes straight from there.
    const bool plain_copy = nr == 1 && local == nullptr && !s.finalize && out != nullptr && nd == 0;
    if (plain_copy && received[0] == out) {
      // it landed there (expect_landings)
    } else if (!(plain_copy && s.count > 0 && received[0] == nullptr &&
                 links_->receive_into(recv_from[0], out, bytes))) {
      for (int i = 0; i < nr; ++i) {
        if (local != nullptr && i == s.src_pos) srcs[ns++] = local, local = nullptr;
        srcs[ns++] = received[i] != nullptr ? received[i] : links_->fetch(recv_from[i]);
      }
      if (local != nullptr) srcs[ns++] = local;
      if (out != nullptr) dsts[nd++] = out;
      if (s.count > 0 && ns > 0 && nd > 0) run_kernel(c, s, srcs, ns, dsts, nd, out, streamed);
    }
    if (!send_first) post_sends(c, s, bytes, from, lend, 0);
    for (int p : s.recv_peer)
      if (p >= 0) links_->release(p);
    // What the next step may post again is a copy of memory nothing has written since.
    if (out != nullptr && shared_.from != nullptr && out != shared_.from && out < shared_.from + shared_.bytes &&
        shared_.from < out + bytes)
      shared_ = {};
    return true;
  }

  // Whether a step that sends its local source sends a slice that several peers get
  // (two sends, or the same slice in the next step, or in the step before, which
  // staged it) through a transport that can share one copy among them.
  bool shares(const call& c, const step& s, std::size_t bytes) const {
    if (links_ == nullptr || s.sends() == 0 || bytes < min_share_bytes || bytes > links_->slot_bytes()) return false;
    for (int p : s.send_peer)
      if (p >= 0 && !links_->shares_copies(p)) return false;
    auto same_slice = [&](const step& o) {
      return o.recvs() == 0 && o.sends() > 0 && !o.finalize && o.src == s.src && o.src_offset == s.src_offset &&
             o.count == s.count;
    };
    if (s.sends() == 2) return true;
    if (c.next + 1 < c.steps.size() && same_slice(c.steps[c.next + 1])) return true;
    return c.next > 0 && same_slice(c.steps[c.next - 1]);
  }

  // Posts a ready step's sends: its slots (`from` null), its bytes at `from`, or the
  // copy staged for them (`staged`, a link_set::stage handle).
  void post_sends(call& c, const step& s, std::size_t bytes, const std::byte* from, bool lend, std::uint64_t staged) {
    if (from != nullptr) links_->lend_any_memory(lend && lends_any_memory(c));
    for (int p : s.send_peer) {
      if (p < 0) continue;
      slot_header h;
      h.bytes = static_cast<std::uint32_t>(bytes);
      h.sender = rank_;
      h.offset = s.src_offset;
      h.desc = c.desc;
      if (staged != 0) {
        links_->post_staged(p, h, staged);
      } else if (from == nullptr) {
        links_->post(p, h);
      } else {
        const std::uint64_t ticket = links_->post_from(p, h, from);
        if (!links_->sent(p, ticket)) c.pending.push_back({p, ticket, from, from + bytes});
      }
    }
  }

  // Every slot from a peer is checked here before its payload is read: framing and
  // sequence (protocol), then the call it belongs to (mismatch), then its length.
  void check_slot(const call& c, const step& s, int peer, const slot_header& h, std::size_t bytes) {
    if (h.magic != slot_magic || h.version != wire_version || h.sender != peer)
      throw error(errc::protocol,
                  "malformed slot header from rank " + std::to_string(peer) +
                      " (bad magic, version or sender); is something else writing to this job's links?",
                  rank_, peer, c.desc.sequence);
    // Slots on one link come in issue order, so a peer's sequence numbers never go
    // back (collectives and send/recv are numbered apart). One that does is a
    // replayed, duplicated or corrupted slot, whatever the peer called.
    std::uint64_t& last =
        last_seen_[static_cast<std::size_t>(peer) * 2 + (h.desc.kind == collective_kind::point_to_point ? 1 : 0)];
    if (h.desc.sequence < last)
      throw error(errc::protocol,
                  "slot from rank " + std::to_string(peer) + " has sequence " + std::to_string(h.desc.sequence) +
                      " after one with " + std::to_string(last) +
                      ": a link's sequence numbers never go back (replayed or corrupted slot)",
                  rank_, peer, c.desc.sequence);
    last = h.desc.sequence;
    if (h.flags & slot_error_notice) {
      const int culprit =
          h.reserved > 0 && h.reserved <= static_cast<std::uint64_t>(size_) ? static_cast<int>(h.reserved - 1) : peer;
      const auto code = static_cast<errc>(h.offset);
      std::string what = code == errc::invalid_argument && culprit == peer
                             ? "rank " + std::to_string(peer) + " failed its " + to_string(h.desc.kind) + " #" +
                                   std::to_string(h.desc.sequence) + " with invalid_argument before moving data"
                             : "rank " + std::to_string(peer) + " stopped in its " + to_string(h.desc.kind) + " #" +
                                   std::to_string(h.desc.sequence) + " with " + std::string(to_string(code)) +
                                   " caused by rank " + std::to_string(culprit);
      throw error(errc::mismatch,
                  what +
                      " (see its error); this communicator is now broken on every rank: fix the call and "
                      "recreate it",
                  rank_, culprit, c.desc.sequence);
    }
    if (!(h.desc == c.desc))
      throw error(errc::mismatch,
                  "this rank called " + std::string(to_string(c.desc.kind)) + " but rank " + std::to_string(peer) +
                      " called " + to_string(h.desc.kind) + ": " + describe_difference(c.desc, h.desc) +
                      "; every rank must issue the same collectives in the same order with the same arguments",
                  rank_, peer, c.desc.sequence);
    if (h.bytes != bytes)
      throw error(errc::protocol,
                  "slot from rank " + std::to_string(peer) + " holds " + std::to_string(h.bytes) + " bytes, step " +
                      std::to_string(c.next) + " expects " + std::to_string(bytes) + " (" + to_string(s) + ")",
                  rank_, peer, c.desc.sequence);
  }

  // Peers this call waits on now: their failures matter; a peer that finished and
  // left does not, unless this rank still needs it. Notices are looked for first:
  // a peer that failed and then left is reported for its failure, not its leaving.
  void check_peers(call& c) {
    if (c.next >= c.steps.size()) {
      for (const call::pending_send& p : c.pending) links_->health(p.peer);  // its last sends still leaving
      return;
    }
    const step& s = c.steps[c.next];
    for (int p = 0; p < size_; ++p) {
      if (p == rank_ || !links_->reaches(p)) continue;
      slot_view v;
      try {
        v = links_->peek(p);
      } catch (const error&) {
        continue;  // a broken link is reported below if this call waits on it
      }
      if (v.header != nullptr && (v.header->flags & slot_error_notice)) check_slot(c, s, p, *v.header, 0);
    }
    // A peer that gave up waiting (timeout) and closed is not this rank's own timeout
    // yet: wait out this call's deadline, then name the rank it gave up on.
    auto health = [&](int p) {
      try {
        links_->health(p);
      } catch (const error& e) {
        if (e.code() != errc::timeout) throw;
        c.gave_up_on = e.peer();
      }
    };
    for (int p : s.recv_peer)
      if (p >= 0) health(p);
    for (int p : s.send_peer)
      if (p >= 0) health(p);
  }

  error timed_out(const call& c) const {
    std::string who = "its peers";
    int peer = -1;
    if (c.next < c.steps.size()) {
      const step& s = c.steps[c.next];
      for (int p : s.recv_peer)
        if (p >= 0 && links_->peek(p).header == nullptr) {
          peer = p;
          who = "rank " + std::to_string(p) + " to send its data";
          break;
        }
      if (peer < 0)
        for (int p : s.send_peer)
          if (p >= 0) {
            peer = p;
            who = "rank " + std::to_string(p) + " to drain its receive slots";
            break;
          }
    }
    if (c.next >= c.steps.size() && !c.pending.empty()) {
      peer = c.pending.front().peer;
      who = "rank " + std::to_string(peer) + " to take its last data";
    }
    if (c.gave_up_on >= 0 && c.gave_up_on != rank_) {
      peer = c.gave_up_on;
      who += " (peers gave up waiting for rank " + std::to_string(c.gave_up_on) + ")";
    }
    return error(errc::timeout,
                 std::string(to_string(c.desc.kind)) + " waited past its deadline for " + who + " (step " +
                     std::to_string(c.next + 1) + " of " + std::to_string(c.steps.size()) +
                     "): the peer is stopped, hung, or issued different collectives; raise PLAIT_TIMEOUT or "
                     "call_options::timeout if it is only slow",
                 rank_, peer, c.desc.sequence);
  }

  int rank_, size_;
  link_set* links_;
  doorbell& bell_;
  const std::atomic<bool>& aborted_;
  std::span<std::uint64_t> last_seen_;
  bool oversubscribed_;
  bool lend_always_;
  std::size_t stream_from_;
  std::size_t broadcast_stream_from_;
  // The slice the last step staged (link_set::stage), which the next step may post
  // again: its call, step and bytes, and the transport's handle.
  struct shared_slice {
    const call* c = nullptr;
    std::uint64_t sequence = 0;
    collective_kind kind{};
    std::size_t step = 0;
    const std::byte* from = nullptr;
    std::size_t bytes = 0;
    std::uint64_t handle = 0;
  } shared_;
};

}  // namespace plait::detail
