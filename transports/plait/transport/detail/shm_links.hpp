// shm_link_set: the link_set over shared-memory segments (see shm_segment.hpp).
//
// Per peer p: a send FIFO, which is FIFO[me] inside p's segment, and a receive
// FIFO, which is FIFO[p] inside this rank's own segment. Single producer, single
// consumer, lock-free: the producer owns tail, the consumer owns head; payload and
// header writes happen-before the release store of tail, and the consumer's reads
// of a slot happen-before its release store of head. Each side keeps its own
// counter in a local copy and caches the other side's, touching the shared cache
// line only when the cached value says full (producer) or empty (consumer).
// Every post() and release() rings the peer's doorbell (a peer may sleep waiting
// for data or for space); the doorbell makes the futex call only for a sleeper.
//
// Single copy (shm_single_copy.hpp): where the peer can read this rank's memory
// (it probed that at connect and set reader_copies in our send FIFO), post_from()
// of bytes on huge pages (on any pages after lend_any_memory(true)) posts the slot
// by reference (slot_by_reference, the address in the header) and keeps the memory
// until the peer releases the slot (sent()). The receiver copies such a slot
// straight into its output (receive_into()), or into a private staging buffer when
// it needs the bytes in memory (fetch(); peek() gives no payload for it). After
// every copy the receiver looks at the slot's flag again: a sender that failed has
// copied the bytes into the slot and cleared the flag (detach()), and the slot's
// copy is then the one to use; a sender that exited with the flag still set is
// peer_lost.
//
// Staging (link_set::stage): stage() copies a payload into a free chunk of this
// rank's pool (shm_segment.hpp), and post_staged() posts a slot that names the chunk
// (slot_staged, its index in `reserved`) after adding one to the chunk's holds. A
// peer's peek() gives the chunk's address in the segment it has mapped; its release()
// takes its hold off before it frees the slot. A chunk is reused only when no hold is
// left, so one copy in serves every reader. The caller's memory is free once stage()
// returns; a sender that fails leaves nothing to withdraw (the pool stays mapped by
// its readers), and a reader that fails leaves its chunks held: the sender stages less
// (stage() returns 0 when no chunk is free) and posts through slots.
//
// Errors: peek() validates the slot's framing (magic, version, bytes <= slot_bytes)
// and throws errc::protocol for a bad one; the failure sticks to that link, so
// peek() and health() on it throw it again. health(p) throws peer_lost when p's
// process has exited or p called close(), unless p is not what this rank waits on:
// slots p posted stay readable, so while one is unread and the FIFO to p has room,
// a peer that finished and left is no error (transport.hpp). Misuse (an unknown
// peer, post() with no free slot, release() with no slot held) is invalid_argument.
// Thread-safety: one thread at a time (the executor). Ownership: the set owns its
// mappings and pidfds; the doorbell passed to connect must outlive it (its word
// lives in this rank's segment until the destructor rebinds it).
#pragma once

#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <plait/kernel/copy.hpp>
#include <plait/transport.hpp>
#include <plait/transport/detail/shm_liveness.hpp>
#include <plait/transport/detail/shm_segment.hpp>
#include <plait/transport/detail/shm_single_copy.hpp>

namespace plait::transport::shm_detail {

// Where a doorbell points once the segment holding its word is gone: a process-wide
// word nobody else rings. Sharing it between communicators costs spurious wake-ups at most.
inline plait::detail::doorbell_word detached_bell{};

class shm_link_set final : public link_set {
 public:
  shm_link_set(int rank, int size, const geometry& g, plait::detail::doorbell& bell, bool single_copy = true)
      : rank_(rank),
        geometry_(g),
        bell_(&bell),
        index_of_(static_cast<std::size_t>(size), -1),
        single_copy_(single_copy) {}

  // Posts by reference from this many bytes up (below it a copy into the slot costs
  // less than the system call and the page pinning). Only a caller that lends asks
  // (post_from): all_gather with a core per rank where it timed lending as faster
  // (a 2-rank all_gather of 32K: lending 2.5 us against slots 3.7), and
  // PLAIT_SINGLE_COPY=always.
  static constexpr std::size_t min_reference_bytes = 16 * 1024;

  shm_link_set(const shm_link_set&) = delete;
  shm_link_set& operator=(const shm_link_set&) = delete;

  ~shm_link_set() override {
    close();
    if (own_.base() != nullptr && bell_->word() == &own_.header()->bell) bell_->bind(&detached_bell);
  }

  // --- connect steps (shm.hpp drives them) ---

  // Creates this rank's segment and moves the doorbell into it, before any peer can see it.
  void create_own(const std::string& name, std::span<const int> peers) {
    own_ = create_segment(own_name_, name, geometry_, peers, rank_);
    bell_->bind(&own_.header()->bell);
  }

  // Maps `peer`'s segment and starts watching its process; probes whether this rank
  // can copy from the peer's memory (probe_address/value from its announcement).
  void attach(int peer, std::int64_t pid, const std::string& name, std::size_t index_in_own,
              std::uint64_t probe_address = 0, std::uint64_t probe_value = 0) {
    std::size_t out_offset = 0;
    mapping map = open_segment(name, geometry_, rank_, peer, pid, out_offset);
    link l;
    l.peer = peer;
    l.peer_hdr = map.header();
    l.out_ctl = reinterpret_cast<fifo_control*>(map.base() + out_offset);
    l.out_slots = map.base() + out_offset + sizeof(fifo_control);
    const std::size_t in_offset =
        geometry_.first_fifo_offset(own_.header()->fifo_count) + index_in_own * geometry_.fifo_bytes;
    l.in_ctl = reinterpret_cast<fifo_control*>(own_.base() + in_offset);
    l.in_slots = own_.base() + in_offset + sizeof(fifo_control);
    const auto peer_fifos = static_cast<std::size_t>(l.peer_hdr->fifo_count);  // checked by open_segment
    l.pool_ctl = reinterpret_cast<chunk_control*>(map.base() + geometry_.pool_offset(peer_fifos));
    l.pool = map.base() + geometry_.chunk_offset(peer_fifos, 0);
    l.map = std::move(map);
    l.pid = static_cast<pid_t>(pid);
    l.lent.reserve(geometry_.depth);
    if (single_copy_ && probe(l.pid, probe_address, probe_value)) {
      l.staging.reset(new std::byte[geometry_.slot_bytes]);
      std::memset(l.staging.get(), 0, geometry_.slot_bytes);  // touched now, not on the first copy
      l.in_ctl->reader_copies.store(1, std::memory_order_release);
    }
    watch_.add(rank_, peer, static_cast<pid_t>(pid));
    index_of_[static_cast<std::size_t>(peer)] = static_cast<int>(links_.size());
    links_.push_back(std::move(l));
  }

  // Every peer has mapped our segment: drop its name, so that /dev/shm keeps nothing
  // of this job even if the process is killed later (the memory lives while mapped).
  void unlink_own() noexcept { own_name_.unlink(); }

  // --- link_set ---

  bool reaches(int peer) const override {
    return peer >= 0 && static_cast<std::size_t>(peer) < index_of_.size() &&
           index_of_[static_cast<std::size_t>(peer)] >= 0;
  }
  std::size_t slot_bytes() const override { return geometry_.slot_bytes; }

  std::byte* acquire(int peer) override {
    link& l = link_for(peer, "acquire");
    if (l.out_tail - l.out_head_seen >= geometry_.depth) {
      // Acquire: the consumer's reads of the slot we are about to reuse are done.
      l.out_head_seen = l.out_ctl->head.load(std::memory_order_acquire);
      if (l.out_tail - l.out_head_seen >= geometry_.depth) return nullptr;
    }
    return out_slot(l) + sizeof(plait::detail::slot_header);
  }

  void post(int peer, const plait::detail::slot_header& header) override {
    link& l = link_for(peer, "post");
    if (header.bytes > geometry_.slot_bytes)
      throw error(errc::invalid_argument,
                  "shm: post() of " + std::to_string(header.bytes) + " bytes into a slot of " +
                      std::to_string(geometry_.slot_bytes),
                  rank_, peer);
    if (acquire(peer) == nullptr)
      throw error(errc::invalid_argument, "shm: post() with no free slot (call acquire() first and check it)", rank_,
                  peer);
    publish(l, header);
  }

  bool sends_from_memory(int peer) const override { return lends(link_for(peer, "sends_from_memory")); }
  bool sends_by_reference(int peer) const override { return sends_from_memory(peer); }
  void lend_any_memory(bool on) override { any_memory_ = on; }

  // A slot the peer's core reads soon after this one wrote it crosses between the
  // two cores' caches line by line; from 16 KiB up to 256 KiB that costs more than
  // the peer reading it from memory. Measured (docs/performance.md, "Slots of 16 to
  // 256 KiB written past the cache"): a writer and a reader on two cores, a ring of
  // 4 slots, the reader's time per slot with plain stores against non-temporal ones:
  // 16K 1.9 / 1.5 us, 64K 9.2 / 4.4, 128K 14.3 / 8.9, 256K 17.2 / 19.6, 512K
  // 13.5 / 34.1; 4K 0.2 / 0.6 (host-probe part 4). On another host type the other way
  // round (64K 3.5 / 6.3), so this is the rule only until a reader has timed both
  // (streamed_slots_measured).
  static constexpr std::size_t stream_slots_from = 16 * 1024;
  static constexpr std::size_t stream_slots_below = 256 * 1024;
  bool streams_slots(int peer, std::size_t bytes) const override {
    (void)link_for(peer, "streams_slots");
    return bytes >= stream_slots_from && bytes < stream_slots_below;
  }
  bool can_stream_slots(int peer) const override {
    (void)link_for(peer, "can_stream_slots");
    return true;
  }
  // The reader's measurement (link_set): two bits per power of two of slot bytes in
  // fifo_control::streamed_faster, measured and which one won.
  int streamed_slots_measured(int peer, std::size_t bytes) const override {
    return measured(link_for(peer, "streamed_slots_measured").out_ctl->streamed_faster, bytes);
  }
  void measured_streamed_slots(std::size_t bytes, bool streamed) override {
    for (link& l : links_) measure(l.in_ctl->streamed_faster, bytes, streamed);
  }
  // And of lending against slots, in fifo_control::lend_faster.
  int lending_measured(int peer, std::size_t bytes) const override {
    return measured(link_for(peer, "lending_measured").out_ctl->lend_faster, bytes);
  }
  void measured_lending(std::size_t bytes, bool lend) override {
    for (link& l : links_) measure(l.in_ctl->lend_faster, bytes, lend);
  }

  bool shares_copies(int peer) const override {
    (void)link_for(peer, "shares_copies");
    return true;
  }

  // Copies the payload into the next free chunk of the pool, looking from the one
  // after the last staged; 0 when every chunk is still held.
  std::uint64_t stage(const std::byte* payload, std::size_t bytes) override {
    staged_ = 0;
    if (own_.base() == nullptr || bytes > geometry_.slot_bytes) return 0;
    const std::size_t fifos = static_cast<std::size_t>(own_.header()->fifo_count);
    auto* ctl = reinterpret_cast<chunk_control*>(own_.base() + geometry_.pool_offset(fifos));
    for (std::size_t k = 0; k < geometry_.depth; ++k) {
      const std::size_t i = (next_chunk_ + k) % geometry_.depth;
      // Acquire: the readers' reads of the chunk are done before we write over it.
      if (ctl[i].holds.load(std::memory_order_acquire) != 0) continue;
      plait::kernel::copy_bytes(own_.base() + geometry_.chunk_offset(fifos, i), payload, bytes);
      next_chunk_ = (i + 1) % geometry_.depth;
      staged_ = i + 1;
      staged_bytes_ = bytes;
      return staged_;
    }
    return 0;
  }

  void post_staged(int peer, const plait::detail::slot_header& header, std::uint64_t handle) override {
    link& l = link_for(peer, "post_staged");
    if (handle == 0 || handle != staged_ || header.bytes != staged_bytes_)
      throw error(errc::invalid_argument,
                  "shm: post_staged() of " + std::to_string(header.bytes) + " bytes with handle " +
                      std::to_string(handle) + ", not the last stage() call's (handle " + std::to_string(staged_) +
                      ", " + std::to_string(staged_bytes_) + " bytes)",
                  rank_, peer);
    if (acquire(peer) == nullptr)
      throw error(errc::invalid_argument, "shm: post_staged() with no free slot (call acquire() first and check it)",
                  rank_, peer);
    const std::size_t fifos = static_cast<std::size_t>(own_.header()->fifo_count);
    auto* ctl = reinterpret_cast<chunk_control*>(own_.base() + geometry_.pool_offset(fifos));
    // Ordered before the peer can see the slot by publish()'s release store.
    ctl[handle - 1].holds.fetch_add(1, std::memory_order_relaxed);
    plait::detail::slot_header h = header;
    h.flags = static_cast<std::uint16_t>(h.flags | plait::detail::slot_staged);
    h.reserved = handle - 1;
    publish(l, h);
  }

  std::uint64_t post_from(int peer, const plait::detail::slot_header& header, const std::byte* payload) override {
    link& l = link_for(peer, "post_from");
    if (header.bytes < min_reference_bytes || !lends(l) || (!any_memory_ && huge_.share(payload, header.bytes) < 0.5))
      return link_set::post_from(peer, header, payload);  // through the slot
    if (header.bytes > geometry_.slot_bytes || acquire(peer) == nullptr)
      throw error(errc::invalid_argument,
                  "shm: post_from() of " + std::to_string(header.bytes) +
                      " bytes with no free slot or into a slot of " + std::to_string(geometry_.slot_bytes),
                  rank_, peer);
    // Forget what the peer has released; the rest detach() may still have to copy.
    while (!l.lent.empty() && l.lent.front().index < l.out_head_seen) l.lent.erase(l.lent.begin());
    plait::detail::slot_header h = header;
    h.flags = static_cast<std::uint16_t>(h.flags | plait::detail::slot_by_reference);
    h.reserved = reinterpret_cast<std::uintptr_t>(payload);
    l.lent.push_back({l.out_tail, payload, header.bytes, header.flags});
    publish(l, h);
    return l.out_tail;  // the slot's index + 1: sent once the peer's head reaches it
  }

  bool sent(int peer, std::uint64_t ticket) override {
    if (ticket == 0) return true;
    link& l = link_for(peer, "sent");
    if (l.out_head_seen >= ticket) return true;
    l.out_head_seen = l.out_ctl->head.load(std::memory_order_acquire);
    return l.out_head_seen >= ticket;
  }

  // Copies every lent payload the peer has not released into its slot and clears
  // the slot's flag, so the memory is the caller's again at once.
  void detach() noexcept override {
    for (link& l : links_) {
      const std::uint64_t head = l.out_ctl->head.load(std::memory_order_acquire);
      for (const lent_slot& x : l.lent) {
        if (x.index < head) continue;
        std::byte* slot = l.out_slots + (x.index % geometry_.depth) * geometry_.slot_stride;
        auto* h = reinterpret_cast<plait::detail::slot_header*>(slot);
        std::memcpy(slot + sizeof(plait::detail::slot_header), x.from, x.bytes);
        // Full fence: the payload (maybe non-temporal stores) before the flag, and the
        // flag before the caller may change the memory the peer might still be reading.
        std::atomic_thread_fence(std::memory_order_seq_cst);
        std::atomic_ref<std::uint16_t>(h->flags).store(x.flags, std::memory_order_seq_cst);
      }
      l.lent.clear();
    }
  }

  slot_view peek(int peer) override {
    link& l = link_for(peer, "peek");
    if (l.failure) throw *l.failure;
    if (!refresh_in(l)) return {};
    const std::byte* slot = in_slot(l);
    // A copy: the peer cannot change the header under us once it is validated.
    std::memcpy(&l.in_header, slot, sizeof l.in_header);
    const auto& h = l.in_header;
    if (h.magic != plait::detail::slot_magic || h.version != plait::detail::wire_version ||
        h.bytes > geometry_.slot_bytes || ((h.flags & plait::detail::slot_by_reference) && !l.staging) ||
        ((h.flags & plait::detail::slot_staged) &&
         ((h.flags & plait::detail::slot_by_reference) || h.reserved >= geometry_.depth)))
      fail(l,
           error(errc::protocol,
                 "shm: slot #" + std::to_string(l.in_head) + " from rank " + std::to_string(peer) +
                     " has a bad header (magic " + std::to_string(h.magic) + ", version " + std::to_string(h.version) +
                     ", " + std::to_string(h.bytes) + " bytes in a slot of " + std::to_string(geometry_.slot_bytes) +
                     "), one by reference this rank did not offer to read, or one naming a pool chunk it does "
                     "not have: the peer runs a different plait version or wrote outside its slots",
                 rank_, peer));
    if (h.flags & plait::detail::slot_by_reference) return {&l.in_header, nullptr};  // fetch() brings it
    if (h.flags & plait::detail::slot_staged) return {&l.in_header, l.pool + h.reserved * geometry_.chunk_stride()};
    return {&l.in_header, slot + sizeof(plait::detail::slot_header)};
  }

  const std::byte* fetch(int peer) override {
    link& l = link_for(peer, "fetch");
    const slot_view v = peek(peer);
    if (v.header == nullptr)
      throw error(errc::invalid_argument, "shm: fetch() with no received slot (peek() first)", rank_, peer);
    return v.payload != nullptr ? v.payload : lent_payload(l, l.staging.get());
  }

  bool receive_into(int peer, std::byte* dst, std::size_t bytes) override {
    link& l = link_for(peer, "receive_into");
    const slot_view v = peek(peer);
    if (v.header == nullptr || v.payload != nullptr || bytes != v.header->bytes) return false;
    if (const std::byte* p = lent_payload(l, dst); p != dst) plait::kernel::copy_bytes(dst, p, bytes);
    return true;
  }

  void release(int peer) override {
    link& l = link_for(peer, "release");
    if (!refresh_in(l))
      throw error(errc::invalid_argument, "shm: release() with no received slot (peek() first)", rank_, peer);
    // A staged slot's hold on its chunk goes first: our reads of the chunk are done.
    // The flags and index as peek() validated them (the slot holds the same header).
    plait::detail::slot_header h;
    std::memcpy(&h, in_slot(l), sizeof h);
    if ((h.flags & plait::detail::slot_staged) && h.reserved < geometry_.depth)
      l.pool_ctl[h.reserved].holds.fetch_sub(1, std::memory_order_release);
    // Release: our reads of the slot complete before the producer may reuse it.
    l.in_ctl->head.store(++l.in_head, std::memory_order_release);
    // Ringing only when the FIFO was full would need a store-load fence on both
    // sides to be race-free; the ring is one atomic add, and a futex call only if
    // the peer sleeps.
    plait::detail::doorbell::ring(&l.peer_hdr->bell);
  }

  void health(int peer) override {
    link& l = link_for(peer, "health");
    if (l.failure) throw *l.failure;
    const auto i = static_cast<std::size_t>(index_of_[static_cast<std::size_t>(peer)]);
    const bool closed = l.peer_hdr->closed.load(std::memory_order_acquire) != 0;
    const bool exited = watch_.exited(i);
    if (!closed && !exited) return;
    // Gone, but not in the way: a slot of its is still to be read and the FIFO to it has room.
    if (refresh_in(l) && acquire(peer) != nullptr) return;
    std::string what = "shm: rank " + std::to_string(peer) + " (pid " + std::to_string(watch_.pid(i)) + ") ";
    const auto close_code = static_cast<errc>(l.peer_hdr->close_code);
    const int culprit = l.peer_hdr->close_culprit;
    const bool named = culprit >= 0 && static_cast<std::size_t>(culprit) < index_of_.size() && culprit != rank_;
    if (closed && close_code == errc::timeout && !named)  // it gave up waiting for this rank: not a loss
      fail(l, error(errc::timeout, "shm: rank " + std::to_string(peer) + " timed out waiting and closed its links",
                    rank_, peer));
    if (closed && (close_code == errc::peer_lost || close_code == errc::timeout) && named) {
      fail(l, error(close_code,
                    "shm: rank " + std::to_string(peer) +
                        (close_code == errc::timeout ? " timed out waiting for rank " : " lost rank ") +
                        std::to_string(culprit) + " and closed its links; look at rank " + std::to_string(culprit) +
                        " for the cause",
                    rank_, culprit));
    }
    if (closed) {
      char reason[reason_bytes + 1] = {};
      std::memcpy(reason, l.peer_hdr->reason, reason_bytes);
      what += "closed its links (" + std::string(reason) + ")";
      if (exited) what += " and exited";
    } else {
      what += "exited or was killed";
    }
    what += " while this rank still needs it; look at that rank's output for the cause";
    fail(l, error(errc::peer_lost, what, rank_, peer));
  }

  void close(close_reason why = {}) noexcept override {
    if (closed_) return;
    closed_ = true;
    if (own_.base() != nullptr) {
      segment_header* h = own_.header();
      h->close_code = static_cast<std::int32_t>(why.code);
      h->close_culprit = why.culprit;
      const char reason[] = "communicator destroyed or aborted, or connect failed";
      static_assert(sizeof reason <= reason_bytes);
      std::memcpy(h->reason, reason, sizeof reason);
      h->closed.store(1, std::memory_order_release);
    }
    for (link& l : links_) plait::detail::doorbell::ring(&l.peer_hdr->bell);
  }

 private:
  struct lent_slot {
    std::uint64_t index;  // the slot's number on its FIFO
    const std::byte* from;
    std::uint32_t bytes;
    std::uint16_t flags;  // the header's flags without slot_by_reference
  };

  struct link {
    int peer = -1;
    mapping map;  // the peer's segment
    segment_header* peer_hdr = nullptr;
    // send side: FIFO[me] in the peer's segment
    fifo_control* out_ctl = nullptr;
    std::byte* out_slots = nullptr;
    std::uint64_t out_tail = 0;       // ours: slots posted
    std::uint64_t out_head_seen = 0;  // the consumer's head, as last read
    // receive side: FIFO[peer] in our segment
    fifo_control* in_ctl = nullptr;
    std::byte* in_slots = nullptr;
    std::uint64_t in_head = 0;       // ours: slots released
    std::uint64_t in_tail_seen = 0;  // the producer's tail, as last read
    // the peer's staging pool, in its segment
    chunk_control* pool_ctl = nullptr;
    const std::byte* pool = nullptr;
    plait::detail::slot_header in_header;
    std::optional<error> failure;  // sticky: protocol error or peer lost
    // single copy
    pid_t pid = 0;
    std::unique_ptr<std::byte[]> staging;              // set when this rank can read the peer's memory
    std::vector<lent_slot> lent;                       // slots posted by reference, oldest first
    std::chrono::steady_clock::time_point alive_at{};  // the peer was last seen alive after this
  };

  const link& link_for(int peer, const char* call) const {
    return const_cast<shm_link_set*>(this)->link_for(peer, call);
  }
  link& link_for(int peer, const char* call) {
    if (!reaches(peer))
      throw error(errc::invalid_argument,
                  std::string("shm: ") + call + "() for rank " + std::to_string(peer) +
                      ", which this shm link set does not reach",
                  rank_, peer);
    return links_[static_cast<std::size_t>(index_of_[static_cast<std::size_t>(peer)])];
  }

  // Where a measurement word of `bits` bits (streamed_faster: 32, lend_faster: 64) keeps
  // `bytes`: bits 2 x (floor(log2 bytes) - 10) (measured) and the one above it (which
  // won), from 1 KiB up to 64 MiB (32 bits) or 4 TiB (64 bits); `bits` (kept nowhere)
  // outside.
  static unsigned measured_bit(std::size_t bytes, unsigned bits) noexcept {
    const auto log2 = static_cast<unsigned>(std::bit_width(bytes)) - 1u;
    return bytes == 0 || log2 < 10 || log2 >= 10 + bits / 2 ? bits : 2u * (log2 - 10u);
  }
  template <class Word>
  static int measured(const std::atomic<Word>& w, std::size_t bytes) noexcept {
    constexpr unsigned bits = 8 * sizeof(Word);
    const Word word = w.load(std::memory_order_relaxed);
    const unsigned bit = measured_bit(bytes, bits);
    if (bit >= bits || (word >> bit & 1u) == 0) return -1;
    return static_cast<int>(word >> (bit + 1) & 1u);
  }
  // Only this rank writes the words of its in FIFOs (it is their consumer).
  template <class Word>
  static void measure(std::atomic<Word>& w, std::size_t bytes, bool won) noexcept {
    constexpr unsigned bits = 8 * sizeof(Word);
    const unsigned bit = measured_bit(bytes, bits);
    if (bit >= bits) return;
    Word word = w.load(std::memory_order_relaxed);
    word = (word & ~(Word{3} << bit)) | Word{1} << bit | (won ? Word{2} << bit : Word{0});
    w.store(word, std::memory_order_relaxed);
  }

  std::byte* out_slot(const link& l) const noexcept {
    return l.out_slots + (l.out_tail % geometry_.depth) * geometry_.slot_stride;
  }
  const std::byte* in_slot(const link& l) const noexcept {
    return l.in_slots + (l.in_head % geometry_.depth) * geometry_.slot_stride;
  }

  // Is a posted slot waiting? Reads the producer's tail only when the cache says no.
  bool refresh_in(link& l) {
    if (l.in_tail_seen != l.in_head) return true;
    const std::uint64_t tail = l.in_ctl->tail.load(std::memory_order_acquire);
    if (tail - l.in_head > geometry_.depth)
      fail(l, error(errc::protocol,
                    "shm: rank " + std::to_string(l.peer) + " moved its FIFO tail to " + std::to_string(tail) +
                        " while " + std::to_string(l.in_head) + " slots were released (depth " +
                        std::to_string(geometry_.depth) + "): its memory is corrupt",
                    rank_, l.peer));
    l.in_tail_seen = tail;
    return tail != l.in_head;
  }

  // The producer may post by reference: it allows that, and the consumer can read us.
  bool lends(const link& l) const noexcept {
    return single_copy_ && l.out_ctl->reader_copies.load(std::memory_order_relaxed) != 0;
  }

  void publish(link& l, const plait::detail::slot_header& header) {
    std::memcpy(out_slot(l), &header, sizeof header);
#if defined(__x86_64__) || defined(__i386__)
    // A kernel may fill the payload with non-temporal stores, which a release store
    // does not order on x86; the fence makes them visible before the tail is.
    __builtin_ia32_sfence();
#endif
    l.out_ctl->tail.store(++l.out_tail, std::memory_order_release);
    plait::detail::doorbell::ring(&l.peer_hdr->bell);
  }

  // The head slot's payload, lent by its sender: copied into `dst`, which is
  // returned, or the slot's own payload where the sender withdrew it (detach()).
  const std::byte* lent_payload(link& l, std::byte* dst) {
    return copy_lent(l, dst) ? dst : in_slot(l) + sizeof(plait::detail::slot_header);
  }

  // Copies the head slot's lent payload from the peer's memory to `dst`. Returns
  // false when the slot itself holds the bytes (the peer failed and copied them
  // there): the caller copies from the slot. Throws when the bytes are lost.
  bool copy_lent(link& l, std::byte* dst) {
    const plait::detail::slot_header& h = l.in_header;
    const int err = read_from(l.pid, dst, static_cast<std::uintptr_t>(h.reserved), h.bytes);
    // Our own segment: writable; the flag is the one field the producer still changes.
    auto* shared = reinterpret_cast<plait::detail::slot_header*>(const_cast<std::byte*>(in_slot(l)));
    if ((std::atomic_ref<std::uint16_t>(shared->flags).load(std::memory_order_seq_cst) &
         plait::detail::slot_by_reference) == 0)
      return false;
    if (err == ESRCH || (err == 0 && !lender_alive(l)))
      fail(l, error(errc::peer_lost,
                    "shm: rank " + std::to_string(l.peer) + " (pid " + std::to_string(l.pid) +
                        ") exited while this rank copied its data from its memory; look at that rank's output "
                        "for the cause",
                    rank_, l.peer));
    if (err != 0)
      fail(l, error(errc::protocol,
                    "shm: copying " + std::to_string(h.bytes) + " bytes from rank " + std::to_string(l.peer) +
                        "'s memory failed (" + std::strerror(err) +
                        "): its slot points at memory it does not have, or something denies process_vm_readv now",
                    rank_, l.peer));
    return true;
  }

  // Whether a read from the lender's memory that has just ended read the lender's
  // own, not a process that took its PID after it died (its flag stays set then).
  // It did if the lender was seen alive less than alive_window before the read
  // ended: a PID comes back only once the dead process is reaped and the kernel has
  // handed out the other PIDs in turn (pid_max of them, at least 301), which takes
  // far longer than the window. So the look (a pidfd poll) is made at most once per
  // alive_window, not after every slice.
  bool lender_alive(link& l) {
    const auto now = std::chrono::steady_clock::now();
    if (now - l.alive_at < alive_window) return true;
    if (watch_.exited(static_cast<std::size_t>(index_of_[static_cast<std::size_t>(l.peer)]))) return false;
    l.alive_at = now;
    return true;
  }
  static constexpr std::chrono::microseconds alive_window{500};

  [[noreturn]] void fail(link& l, error e) {
    l.failure = std::move(e);
    throw *l.failure;
  }

  int rank_;
  geometry geometry_;
  plait::detail::doorbell* bell_;
  segment_name own_name_;
  mapping own_;
  std::vector<link> links_;
  std::vector<int> index_of_;  // rank -> index in links_, -1 when not reached
  peer_watch watch_;           // in links_ order
  bool closed_ = false;
  bool single_copy_ = true;  // this rank reads what peers lend and lends, where they can
  huge_pages huge_;
  bool any_memory_ = false;  // lend_any_memory(): lend from 4 KiB pages too
  // staging: the last stage() call's handle (chunk + 1; 0: none) and bytes, and where
  // the next one starts looking
  std::uint64_t staged_ = 0;
  std::size_t staged_bytes_ = 0;
  std::size_t next_chunk_ = 0;
};

}  // namespace plait::transport::shm_detail
