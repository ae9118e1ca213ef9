// The transport vocabulary: what every transport gives the executor.
//
// A transport connects this rank to its peers through the bootstrap store and
// returns a link_set: per peer, two FIFOs of fixed-size slots (DESIGN.md section 3).
//   send side:    acquire() a free slot, let the kernel fill its payload, post() it;
//   receive side: peek() the next full slot, let the kernel read it, release() it.
// None of these calls blocks: they return nullptr/false when the FIFO is full or
// empty, and the executor sleeps on the communicator's doorbell, which the transport
// rings on every event (a peer posted or freed a slot, bytes arrived, a peer died).
// Slots of one peer are delivered in the order they were posted.
// health(peer) is called while waiting on that peer: it throws plait::error
// (peer_lost, protocol, ...) when the link to it has failed. Slots a peer posted
// before it closed or died stay readable: peek() keeps returning them, so a rank
// that finished and left is only an error for peers that still wait on it. A link_set is used by one thread at a time
// (the executor); its own progress threads, if any, are internal. Destruction closes every link.
//
// A transport type T is a policy: traits, a name, and a connect() factory
//   static std::unique_ptr<link_set> connect(bootstrap_context&, detail::doorbell&,
//                                            const link_config&, std::span<const int> peers);
// called collectively by every rank (each with the peers it must reach; the relation
// is symmetric); the communicator<T> template checks it against transport_for.
#pragma once

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <plait/detail/doorbell.hpp>
#include <plait/error.hpp>
#include <plait/kernel/copy.hpp>
#include <plait/wire.hpp>

namespace plait {

using clock = std::chrono::steady_clock;

// What a transport can do, checked at compile time where it matters.
struct transport_traits {
  bool device_memory = false;  // slots may live in GPU memory
  bool one_sided = false;      // posts write straight into the peer's FIFO
  bool zero_copy = false;      // the kernel writes into memory the peer reads directly
  // Messages go through the kernel's network stack: each one costs system calls and
  // wake-ups, so `automatic` prefers the schedules that send the fewest of them.
  bool network = false;
  // Ranks on one host still talk through the network stack (tcp over loopback); a
  // hybrid's ranks on one host use its local transport instead.
  bool network_on_one_host = false;
  // One copy of a payload can be read by several peers (link_set::stage): a slice
  // for n peers costs one copy in and n out, so `automatic` takes the one-hop direct
  // broadcast and all_gather where that pays (the shared-memory transport).
  bool shares_copies = false;
};

// What a transport needs from the rendezvous: a key-value exchange scoped to this
// communicator, plus identity and addressing. Implemented over the TCP store.
class bootstrap_context {
 public:
  virtual ~bootstrap_context() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Publishes a value under key (keys are scoped to this communicator).
  virtual void put(std::string_view key, std::span<const std::byte> value) = 0;
  // Blocks until key is present or the deadline passes (timeout naming the key).
  virtual std::vector<std::byte> get(std::string_view key, clock::time_point deadline) = 0;
  // The value if key is present now, else nothing; never waits for the key.
  virtual std::optional<std::vector<std::byte>> try_get(std::string_view key) {
    try {
      return get(key, clock::now() + std::chrono::milliseconds(1));
    } catch (const error& e) {
      if (e.code() != errc::timeout) throw;
      return std::nullopt;
    }
  }
  // All ranks reach the named point, or timeout naming the ranks still missing.
  virtual void barrier(std::string_view name, clock::time_point deadline) = 0;
  // The shared secret all connections authenticate with (HMAC-SHA256 key).
  virtual std::span<const std::byte> token() const = 0;
  // Identity of this host (PLAIT_HOST_ID or the hostname): ranks with equal ids share memory.
  virtual std::string host_id() const = 0;
  // Address this rank listens on for peer connections (PLAIT_ADDR / PLAIT_IFNAME / loopback).
  virtual std::string listen_address() const = 0;
  // A string unique to this job and communicator, usable in shm names.
  virtual std::string job_key() const = 0;
};

// Why a rank closes its links, carried to its peers so that a failure cascading
// through ranks that only wait on each other still names its first cause.
// The first close() of a link_set decides the reason; later calls change nothing.
struct close_reason {
  errc code = errc::aborted;  // aborted: finished, destroyed or aborted; peer_lost / timeout: it
                              // lost / waited in vain for `culprit`
  int culprit = -1;           // the rank blamed, or -1 for the closing rank itself
  bool deliver = true;        // a clean end: deliver the slots posted so far before going
};

struct link_config {
  std::size_t slot_bytes = 0;  // payload capacity of one slot
  std::size_t depth = 0;       // slots per FIFO
  std::chrono::nanoseconds connect_timeout{};
  // Transports that can let a peer copy straight from this rank's memory (shm: CMA)
  // may; false keeps every byte in slots (PLAIT_SINGLE_COPY=off).
  bool single_copy = true;
  // Payload bytes a link may send ahead of the peer's credits, besides at most depth
  // frames (0: no cap but the slots); a frame always goes when nothing is out. Only
  // transports with a sender-side window (tcp) read it.
  std::size_t send_window_bytes = 0;
  // With a window: this many frames of the size being sent may be out, when that is
  // more than send_window_bytes (so a window sized by the smallest of the slices still
  // keeps as many of a larger one in flight; 0: the bytes alone).
  std::size_t send_window_frames = 0;
  // Congestion control for links whose bytes never leave this host (tcp: a connection
  // over the loopback device); empty leaves the system's. Loss-based and unpaced reno
  // by default: on loopback nothing is lost and nothing queues, and a paced controller
  // (bbr) only spaces the frames out (PLAIT_TCP_CONGESTION; docs/performance.md, "TCP
  // on one host: reno, not a paced congestion control").
  std::string host_congestion = "reno";
};

// A received slot, valid until release().
struct slot_view {
  const detail::slot_header* header = nullptr;
  const std::byte* payload = nullptr;
};

class link_set {
 public:
  virtual ~link_set() = default;

  // Peers reachable through this set (a hybrid splits the world between two sets).
  virtual bool reaches(int peer) const = 0;
  virtual std::size_t slot_bytes() const = 0;

  // Send side. acquire() returns the payload area of a free slot to `peer`, or
  // nullptr when the FIFO is full; called again before post() it returns the same
  // slot. post() publishes the slot last acquired for `peer`.
  virtual std::byte* acquire(int peer) = 0;
  virtual void post(int peer, const detail::slot_header& header) = 0;

  // Sends from the caller's memory (optional; the defaults say no). Where
  // sends_from_memory(peer) holds, post_from() publishes the slot last acquired for
  // `peer` with its payload read from `payload` instead of the slot, and returns a
  // ticket: the memory must stay unchanged until sent(peer, ticket) is true (the
  // bytes have left it). detach() copies every such payload not yet sent into its
  // slot, so the memory is free at once: a failed call does it before it returns.
  virtual bool sends_from_memory(int peer) const {
    (void)peer;
    return false;
  }
  virtual std::uint64_t post_from(int peer, const detail::slot_header& header, const std::byte* payload) {
    // No such path: copy into the slot (what does not fit, or no free slot, is for
    // post() to reject).
    std::byte* slot = acquire(peer);
    if (slot != nullptr && header.bytes > 0 && header.bytes <= slot_bytes())
      kernel::copy_bytes(slot, payload, header.bytes);
    post(peer, header);
    return 0;
  }
  virtual bool sent(int peer, std::uint64_t ticket) {
    (void)peer;
    (void)ticket;
    return true;
  }
  virtual void detach() noexcept {}
  // Whether post_from() to `peer` leaves the bytes in the caller's memory for the
  // peer to copy from there itself (shm's single copy), rather than moving them out
  // (tcp). Then it pays only where the receiver copies the bytes straight into its
  // output (receive_into below): a receiver that reduces them needs them in a slot.
  virtual bool sends_by_reference(int peer) const {
    (void)peer;
    return false;
  }
  // Whether post_from() may lend (above) whatever memory the payload is in, rather
  // than only where the transport judges a peer's copy from it cheap (shm: huge
  // pages). The caller says so where it measured that lending pays even so, and
  // until it says otherwise. The default transport never lends: nothing to do.
  virtual void lend_any_memory(bool on) { (void)on; }

  // Whether a slot of `bytes` to `peer` is better filled with non-temporal stores
  // (kernel::copy_bytes_streaming): the peer's core then reads the slot from memory
  // rather than from this core's cache, which on some hosts is the faster of the two.
  // The default: no (a transport whose slots this process reads itself, tcp).
  virtual bool streams_slots(int peer, std::size_t bytes) const {
    (void)peer;
    (void)bytes;
    return false;
  }

  // Whether slots to `peer` may be written with non-temporal stores at all, whatever
  // their size (the peer's core reads them from this process's shared memory), so
  // that a caller may time both ways (comm_core's reduction stream choices). The
  // default: no.
  virtual bool can_stream_slots(int peer) const {
    (void)peer;
    return false;
  }

  // Which of the two `peer` read faster, as it measured and passed on with
  // measured_streamed_slots() for slots of about `bytes` (the same power of two):
  // 1 streamed, 0 plain, -1 not measured (then streams_slots() alone decides).
  virtual int streamed_slots_measured(int peer, std::size_t bytes) const {
    (void)peer;
    (void)bytes;
    return -1;
  }
  // Passes to every peer that writes slots to this rank which of the two this rank
  // read faster for slots of about `bytes` (`streamed`: non-temporal stores). The
  // default keeps nothing (a transport that never streams).
  virtual void measured_streamed_slots(std::size_t bytes, bool streamed) {
    (void)bytes;
    (void)streamed;
  }

  // The same for a send of about `bytes` by reference (sends_by_reference) against
  // one through slots: whether `peer`, which reads this rank's sends, measured
  // lending faster (1), slots faster (0) or neither (-1), as it passed on with
  // measured_lending().
  virtual int lending_measured(int peer, std::size_t bytes) const {
    (void)peer;
    (void)bytes;
    return -1;
  }
  virtual void measured_lending(std::size_t bytes, bool lend) {
    (void)bytes;
    (void)lend;
  }

  // One payload for several peers, copied once (optional; the defaults say no).
  // Where shares_copies(peer) holds, stage() copies `bytes` at `payload` into memory
  // that every such peer reads (shm: a pool in this rank's segment) and returns a
  // handle, or 0 when no room is free now (then post through slots as usual); the
  // caller's memory is free again once it returns. post_staged() publishes the slot
  // last acquired for `peer` with the staged bytes as its payload; the peer reads
  // them in place (peek() gives their address) and release() frees its hold. A
  // handle may be posted to any number of peers until the next stage().
  virtual bool shares_copies(int peer) const {
    (void)peer;
    return false;
  }
  virtual std::uint64_t stage(const std::byte* payload, std::size_t bytes) {
    (void)payload;
    (void)bytes;
    return 0;
  }
  virtual void post_staged(int peer, const detail::slot_header& header, std::uint64_t handle) {
    (void)peer;
    (void)header;
    (void)handle;
    throw error(errc::invalid_argument, "post_staged() on a link set that stages nothing (see shares_copies())");
  }

  // Receive side. peek() returns the oldest full slot from `peer` (header not yet
  // validated beyond framing), or an empty view. release() frees it.
  virtual slot_view peek(int peer) = 0;
  virtual void release(int peer) = 0;
  // The head slot's payload, readable until release(). peek()'s payload may be
  // null for a slot whose bytes are still in the sender's memory (sends_by_reference):
  // fetch() brings them over first. Call it once the step will run (it may copy).
  virtual const std::byte* fetch(int peer) { return peek(peer).payload; }
  // For a head slot whose peek() payload is null: copies its payload (`bytes` of it)
  // into `dst` when the transport does that better than through fetch() (from the
  // sender's memory straight into `dst`); false: nothing done, the caller copies
  // from fetch().
  virtual bool receive_into(int peer, std::byte* dst, std::size_t bytes) {
    (void)peer;
    (void)dst;
    (void)bytes;
    return false;
  }

  // Receives into the caller's memory (optional; the defaults say no). Where
  // receives_into_memory(peer) holds, expect() asks that a data frame still to come
  // from `peer` land straight in `dst` instead of a slot: the frame after the `ahead`
  // ones from that peer not yet released. It lands only if its header equals `header`
  // in everything but offset and reserved (magic, version, flags, bytes, sender and
  // the call), checked before any byte is written; otherwise it goes to its slot as
  // usual. Either way peek() shows it, and its payload pointer is `dst` when it
  // landed there. later: beyond the window of frames the peer may send now, ask
  // again once slots are released; passed: it cannot land (it has arrived already,
  // or no such path). detach() (below, with the send side) also undoes every
  // expectation, so that nothing more is written into the caller's memory: a frame
  // landed or landing there goes on in its slot.
  enum class expectation { posted, later, passed };
  virtual bool receives_into_memory(int peer) const {
    (void)peer;
    return false;
  }
  virtual expectation expect(int peer, std::size_t ahead, const detail::slot_header& header, std::byte* dst) {
    (void)peer;
    (void)ahead;
    (void)header;
    (void)dst;
    return expectation::passed;
  }

  // Throws plait::error if the link to `peer` has failed (dead peer, protocol error).
  virtual void health(int peer) = 0;

  // Waiter-driven I/O, for transports that move bytes with a thread of their own (tcp);
  // the defaults do nothing. While the executor polls for news it calls progress():
  // move whatever can move now without blocking, in the calling thread, and return
  // true when there is news (a slot arrived, a send slot freed, a link failed). The
  // transport's thread stays out of the way meanwhile, so on a busy host one thread per
  // rank does the work, not two. release_io() hands the I/O back to the transport's
  // thread: before the executor sleeps (leaving = false), and when it leaves a call
  // (leaving = true: it may keep the I/O if nothing is left to send). Both may be
  // called from any thread that drives calls, concurrently with the calls above.
  virtual bool progress() noexcept { return false; }
  virtual void release_io(bool leaving) noexcept { (void)leaving; }
  // Where the executor holds the I/O (after progress()), it may sleep here instead of
  // handing the I/O back: block until a peer's bytes can move, `kick_fd` is readable
  // (the doorbell was rung) or `bound` passes, move what can move, and return true.
  // Return false, at once, where this link set cannot sleep so (its peers ring the
  // doorbell through shared memory, it is closing, another thread sleeps here); the
  // executor then calls release_io(false) and sleeps on the doorbell.
  virtual bool sleep(std::chrono::nanoseconds bound, int kick_fd) noexcept {
    (void)bound;
    (void)kick_fd;
    return false;
  }

  // Best effort, never throws: tell every peer this rank is going away or has failed,
  // and why. A peer that still waits on this rank reports peer_lost naming
  // why.culprit when it is set (this rank lost that one), else this rank.
  virtual void close(close_reason why = {}) noexcept = 0;
};

// A waiter that moves its links' bytes itself: the Io of doorbell::wait. Used by
// the communicator's wait (PLAIT_PROGRESS=caller) and by tests driving link sets.
struct io_waiter {
  link_set* links;
  bool progress() noexcept { return links->progress(); }
  void release() noexcept { links->release_io(false); }
  bool sleep(std::chrono::nanoseconds bound, int kick_fd) noexcept { return links->sleep(bound, kick_fd); }
};

template <class T>
concept transport_for = requires(bootstrap_context& ctx, detail::doorbell& bell, const link_config& cfg) {
  { T::traits } -> std::convertible_to<transport_traits>;
  { T::name } -> std::convertible_to<std::string_view>;
  { T::connect(ctx, bell, cfg, std::span<const int>{}) } -> std::same_as<std::unique_ptr<link_set>>;
};

}  // namespace plait
