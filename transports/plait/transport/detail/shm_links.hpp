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

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <plait/transport.hpp>
#include <plait/transport/detail/shm_liveness.hpp>
#include <plait/transport/detail/shm_segment.hpp>

namespace plait::transport::shm_detail {

// Where a doorbell points once the segment holding its word is gone: a process-wide
// word nobody else rings. Sharing it between communicators costs spurious wake-ups at most.
inline plait::detail::doorbell_word detached_bell{};

class shm_link_set final : public link_set {
 public:
  shm_link_set(int rank, int size, const geometry& g, plait::detail::doorbell& bell)
      : rank_(rank), geometry_(g), bell_(&bell), index_of_(static_cast<std::size_t>(size), -1) {}

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

  // Maps `peer`'s segment and starts watching its process.
  void attach(int peer, std::int64_t pid, const std::string& name, std::size_t index_in_own) {
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
    l.map = std::move(map);
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
    std::memcpy(out_slot(l), &header, sizeof header);
#if defined(__x86_64__) || defined(__i386__)
    // A kernel may fill the payload with non-temporal stores, which a release store
    // does not order on x86; the fence makes them visible before the tail is.
    __builtin_ia32_sfence();
#endif
    l.out_ctl->tail.store(++l.out_tail, std::memory_order_release);
    plait::detail::doorbell::ring(&l.peer_hdr->bell);
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
        h.bytes > geometry_.slot_bytes)
      fail(l,
           error(errc::protocol,
                 "shm: slot #" + std::to_string(l.in_head) + " from rank " + std::to_string(peer) +
                     " has a bad header (magic " + std::to_string(h.magic) + ", version " + std::to_string(h.version) +
                     ", " + std::to_string(h.bytes) + " bytes in a slot of " + std::to_string(geometry_.slot_bytes) +
                     "): the peer runs a different plait version or wrote outside its slots",
                 rank_, peer));
    return {&l.in_header, slot + sizeof(plait::detail::slot_header)};
  }

  void release(int peer) override {
    link& l = link_for(peer, "release");
    if (!refresh_in(l))
      throw error(errc::invalid_argument, "shm: release() with no received slot (peek() first)", rank_, peer);
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
    plait::detail::slot_header in_header;
    std::optional<error> failure;  // sticky: protocol error or peer lost
  };

  link& link_for(int peer, const char* call) {
    if (!reaches(peer))
      throw error(errc::invalid_argument,
                  std::string("shm: ") + call + "() for rank " + std::to_string(peer) +
                      ", which this shm link set does not reach",
                  rank_, peer);
    return links_[static_cast<std::size_t>(index_of_[static_cast<std::size_t>(peer)])];
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
};

}  // namespace plait::transport::shm_detail
