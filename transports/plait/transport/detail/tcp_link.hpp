// One TCP link: the two slot FIFOs to one peer and the byte stream that connects them.
//
// Two sides touch a link, each through its own half:
//   executor thread: acquire/post (send FIFO) and peek/release (receive FIFO), never
//     blocking and never allocating; it publishes with the counters posted_/released_;
//   I/O side: pump_rx()/pump_tx() on the non-blocking socket, by the link set's
//     progress thread or by a waiting executor (tcp_link_set::progress), one at a time
//     under the link set's I/O mutex; it publishes with arrived_/sent_. Each counter has
//     one writer side (single-producer/single-consumer).
// Flow control is by credits: the sender starts with `depth` and spends one per data
// frame; the receiver returns one per release(), at its next pump, or (a few credits
// for small frames, owed by a rank polling inside a call or leaving an exchange:
// credits_may_wait) with its next frame to that peer, or before it sleeps or hands
// its I/O to the progress thread. So a data frame always finds a free receive slot,
// the I/O side can always drain the socket, and control frames (credits, closing) are
// never stuck behind data the executor has not consumed.
// A send window may also cap the payload bytes of the frames not yet credited back
// (link_config::send_window_bytes), or, when more, send_window_frames frames of the
// size being sent: full frames then stop short of the slots while small ones still use
// them all. A frame always goes when none is out.
// Failures (end-of-stream, reset, garbage) are recorded once per link, with a message,
// under a mutex; health() reads them (see tcp_link_set for when they are raised).
// Receives into the caller's memory: the executor may expect() a frame still to come
// (by its index on the link) to land in its output. The I/O side lands it there only
// when its whole header is the one expected, checked before any payload byte is read;
// peek() then shows that address as the payload. detach() undoes it all.
#pragma once

#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>

#include <plait/detail/socket.hpp>
#include <plait/error.hpp>
#include <plait/transport.hpp>
#include <plait/transport/detail/tcp_frame_reader.hpp>
#include <plait/transport/detail/tcp_wire.hpp>
#include <plait/wire.hpp>

namespace plait::transport::tcp_detail {

using plait::detail::slot_header;

// depth slots of [slot_header | payload], each padded to 64 bytes so payloads stay aligned.
class slot_ring {
 public:
  slot_ring(std::size_t depth, std::size_t slot_bytes)
      : depth_(depth),
        stride_((sizeof(slot_header) + slot_bytes + 63) / 64 * 64),
        memory_(static_cast<std::byte*>(::operator new (depth_* stride_, std::align_val_t{64}))) {
    // Touched now, at connect: a collective never takes a page fault on a slot.
    std::memset(memory_, 0, depth_ * stride_);
  }
  ~slot_ring() { ::operator delete (memory_, std::align_val_t{64}); }
  slot_ring(const slot_ring&) = delete;
  slot_ring& operator=(const slot_ring&) = delete;

  std::byte* slot(std::uint64_t index) const noexcept { return memory_ + (index % depth_) * stride_; }
  slot_header* header(std::uint64_t index) const noexcept { return reinterpret_cast<slot_header*>(slot(index)); }
  std::byte* payload(std::uint64_t index) const noexcept { return slot(index) + sizeof(slot_header); }

 private:
  std::size_t depth_;
  std::size_t stride_;
  std::byte* memory_;
};

// When a pump returns the credits owed to the peer (tcp_link::credits_may_wait).
enum class credit_timing {
  now,      // every credit owed goes
  leaving,  // a rank leaving a call
  polling,  // a rank polling for news inside a call
};

enum class link_state : int {
  ok,
  closed,  // the peer sent a closing frame (it finished, aborted or failed)
  lost,    // the connection ended without one, or before the announced frames arrived
  broken,  // garbage on the wire (protocol)
};

class tcp_link {
 public:
  tcp_link(int rank, int peer, plait::detail::fd_handle fd, std::size_t slot_bytes, std::size_t depth,
           std::size_t send_window_bytes = 0, std::size_t send_window_frames = 0)
      : rank_(rank),
        peer_(peer),
        fd_(std::move(fd)),
        slot_bytes_(slot_bytes),
        depth_(depth),
        send_(depth, slot_bytes),
        recv_(depth, slot_bytes),
        external_(new const std::byte*[depth]()),
        landings_(new landing[depth]),
        recv_dst_(new std::byte*[depth]()),
        started_bytes_(new std::size_t[depth]()),
        window_bytes_(send_window_bytes),
        window_frames_(send_window_frames),
        credits_(depth) {
    plait::detail::set_nonblocking(fd_.get(), true);  // neither I/O driver may block in I/O
  }

  int peer() const noexcept { return peer_; }
  int fd() const noexcept { return fd_.get(); }

  // ---- executor thread ---------------------------------------------------------

  std::byte* acquire() noexcept {
    if (state_.load(std::memory_order_acquire) != link_state::ok) {
      send_after_failure_ = true;  // nobody will drain it: health() must say so
      return nullptr;
    }
    if (posted_local_ - sent_.load(std::memory_order_acquire) >= depth_) return nullptr;
    return send_.payload(posted_local_);
  }

  void post(const slot_header& h) { post_from(h, nullptr); }

  // The same, the payload read from `payload` (caller's memory) when it is not null;
  // returns the ticket sent() compares with.
  std::uint64_t post_from(const slot_header& h, const std::byte* payload) {
    if (posted_local_ - sent_.load(std::memory_order_acquire) >= depth_)
      throw error(errc::invalid_argument, "post() to rank " + std::to_string(peer_) + " without a slot from acquire()",
                  rank_, peer_);
    if (h.bytes > slot_bytes_)
      throw error(
          errc::invalid_argument,
          "post() of " + std::to_string(h.bytes) + " bytes into a " + std::to_string(slot_bytes_) + "-byte slot", rank_,
          peer_);
    std::memcpy(send_.header(posted_local_), &h, sizeof h);
    external_[posted_local_ % depth_] = h.bytes > 0 ? payload : nullptr;
    ++posted_local_;
    posted_.store(posted_local_, std::memory_order_seq_cst);  // seq_cst: pairs with the sleep check
    return posted_local_;
  }

  // Every slot up to `ticket` has left: its payload is no longer read.
  bool sent(std::uint64_t ticket) const noexcept { return sent_.load(std::memory_order_acquire) >= ticket; }

  slot_view peek() const noexcept {
    if (arrived_.load(std::memory_order_acquire) == released_local_) return {};
    return {recv_.header(released_local_), recv_dst_[released_local_ % depth_]};
  }

  // Asks that the frame after the `ahead` arrived or to come and not yet released
  // land in `dst` if its header is `h` (link_set::expect). Only within the window the
  // peer may fill now (ahead < depth), so the I/O side never reads an entry that is
  // being rewritten: the entry for index i is rewritten (for i + depth) only once
  // frame i was released.
  link_set::expectation expect(std::size_t ahead, const slot_header& h, std::byte* dst) noexcept {
    if (ahead >= depth_) return link_set::expectation::later;
    const std::uint64_t index = released_local_ + ahead;
    if (arrived_.load(std::memory_order_acquire) > index) return link_set::expectation::passed;
    landing& e = landings_[index % depth_];
    e.header = h;
    e.dst = dst;
    e.index.store(index + 1, std::memory_order_release);
    return link_set::expectation::posted;
  }

  void release() {
    if (arrived_.load(std::memory_order_acquire) == released_local_)
      throw error(errc::invalid_argument, "release() from rank " + std::to_string(peer_) + " with no slot to release",
                  rank_, peer_);
    ++released_local_;
    released_.store(released_local_, std::memory_order_seq_cst);
  }

  // Throws the link's failure when this rank is still waiting on the peer: a peer
  // that closed or died is an error only once nothing it sent is left to read and
  // nothing more is announced, or when this rank tries to send to it.
  void health() const {
    const link_state s = state_.load(std::memory_order_acquire);
    if (s == link_state::ok) return;
    if (s != link_state::broken && !send_after_failure_) {
      if (s == link_state::closed && remaining_.load(std::memory_order_acquire) > 0) return;
      if (arrived_.load(std::memory_order_acquire) != released_local_) return;
    }
    std::lock_guard lock(mutex_);
    throw error(code_, why_, rank_, blame_);
  }

  link_state state() const noexcept { return state_.load(std::memory_order_acquire); }

  // ---- I/O side (under the link set's I/O mutex) -------------------------------------

  // Reads everything the socket has; returns true when the executor has news.
  bool pump_rx() {
    if (rx_done_) return false;
    const read_result r = reader_.pump(fd_.get(), *this);
    switch (r.status) {
      case read_status::drained:
        return r.news;
      case read_status::end_of_stream:
        on_end_of_stream();
        return true;
      case read_status::failed:
        on_stream_error(r.error);
        return true;
      case read_status::stopped:
        return true;  // the failure is recorded
    }
    return true;
  }

  // Starts the end of this link: announce what is still to come, send it, then FIN.
  void begin_close(close_reason why) noexcept {
    close_why_ = why;
    closing_ = true;
  }

  // Writes control frames and posted slots the credits allow; true when a send slot freed.
  // Credits that may wait (credits_may_wait, by `when`) stay owed, to go with this
  // rank's next frame to the peer or a later pump.
  bool pump_tx(credit_timing when = credit_timing::now) {
    if (when == credit_timing::leaving) exchanged_ = sent_local_ != sent_at_leave_;
    const bool news = pump_tx_pass(when);
    if (when == credit_timing::leaving) sent_at_leave_ = sent_local_;
    return news;
  }

  void on_writable() noexcept { want_writable_ = false; }

  // Anything pump_tx() could do right now (the sleep check; seq_cst pairs with post/release).
  bool tx_ready() const noexcept {
    if (tx_done_ || want_writable_) return false;
    if (ctl_off_ < ctl_len_ || frame_off_ > 0) return true;
    if (closing_)
      return !closing_sent_ || sent_local_ == posted_limit_ || (sent_local_ < posted_limit_ && next_may_start());
    if (released_.load(std::memory_order_seq_cst) != credited_) return true;
    return posted_.load(std::memory_order_seq_cst) != sent_local_ && next_may_start();
  }

  // Anything this rank still owes the peer, whether or not it can go now: a frame or
  // control bytes half written, a posted slot not sent, credits not returned (unless
  // they may wait, by `when`).
  bool tx_pending(credit_timing when = credit_timing::now) const noexcept {
    if (tx_done_) return false;
    if (ctl_off_ < ctl_len_ || frame_off_ > 0 || closing_) return true;
    if (posted_.load(std::memory_order_seq_cst) != sent_local_) return true;
    const std::uint64_t released = released_.load(std::memory_order_seq_cst);
    return released != credited_ && !credits_may_wait(released, when);
  }

  // Whether the credits for the frames released up to `released` may wait for this
  // rank's next frame to the peer (one sendmsg instead of two, and one wake-up of the
  // peer fewer): fewer than half the slots are owed, and those held small frames (the
  // peer can still start more than half its FIFO, and its send window hardly
  // shrinks), and this rank is
  //   - polling inside a call: a rank waiting on several peers in small steps then
  //     sends no lone credit frames (4 ranks over loopback, 4 KiB: all_gather and
  //     all_reduce made 40 % fewer sendmsg calls, docs/performance.md);
  //   - leaving a call in which it sent the peer frames (an exchange, likely again next
  //     call; a rank that only received, as in a broadcast, returns its credits as it
  //     leaves): they go with its next frame to the peer or at a later pump;
  // and never when it is about to sleep or to hand its I/O to the progress thread
  // (`now`): every credit goes then, so no peer waits on credits held by a rank that
  // sleeps. A frame that goes in the same pass takes every credit owed (stage_control).
  bool credits_may_wait(std::uint64_t released, credit_timing when) const noexcept {
    if (when == credit_timing::now || (when == credit_timing::leaving && !exchanged_)) return false;
    const std::uint64_t owed = released - credited_;
    if (2 * owed >= depth_) return false;
    std::size_t bytes = 0;
    for (std::uint64_t i = credited_; i < released; ++i) bytes += recv_.header(i)->bytes;
    return bytes <= lazy_credit_bytes;
  }
  static constexpr std::size_t lazy_credit_bytes = 16 * 1024;

  // Copies the payloads still to be sent from the caller's memory into their slots
  // (a partly written frame continues from the slot, where the same bytes now are);
  // on the receive side, drops every expectation and moves what landed in the
  // caller's memory into its slot (a frame half read goes on into its slot). Called
  // by the executor's thread with the I/O side held (the link set's I/O mutex).
  void detach() noexcept {
    const std::uint64_t posted = posted_.load(std::memory_order_acquire);
    for (std::uint64_t i = sent_local_; i < posted; ++i) {
      const std::byte*& ext = external_[i % depth_];
      if (ext == nullptr) continue;
      std::memcpy(send_.payload(i), ext, send_.header(i)->bytes);
      ext = nullptr;
    }
    for (std::size_t i = 0; i < depth_; ++i) landings_[i].index.store(0, std::memory_order_relaxed);
    for (std::uint64_t i = released_local_; i < arrived_local_; ++i) to_slot(i, recv_.header(i)->bytes);
    if (reader_.payload_left() > 0) {
      const std::size_t done = recv_.header(arrived_local_)->bytes - reader_.payload_left();
      if (to_slot(arrived_local_, done)) reader_.redirect(recv_.payload(arrived_local_) + done);
    }
  }

  // Diagnostics (I/O side): readv calls made on this link's socket.
  std::uint64_t socket_reads() const noexcept { return reader_.reads(); }

  short poll_events() const noexcept {
    short ev = 0;
    if (!rx_done_) ev |= POLLIN;
    if (!tx_done_ && want_writable_) ev |= POLLOUT;
    return ev;
  }

  // After begin_close(): everything this rank posted left and was acknowledged by the
  // peer's kernel (so closing the socket cannot reset it away), or the peer no longer
  // reads (it closed too, or the link failed), so nothing more is worth waiting for.
  bool settled() const noexcept {
    if (state() != link_state::ok) return true;
    if (!tx_done_) return false;
    int unacked = 0;
    if (::ioctl(fd_.get(), SIOCOUTQ, &unacked) != 0) return true;
    return unacked == 0;
  }

  // Stops everything at once (destruction): no more reads or writes.
  void shut_down() noexcept {
    ::shutdown(fd_.get(), SHUT_RDWR);
    rx_done_ = tx_done_ = true;
  }

 private:
  // pump_tx()'s writes, in one pass.
  bool pump_tx_pass(credit_timing when) {
    bool news = false;
    while (!tx_done_ && !want_writable_) {
      stage_control(when);
      iovec iov[max_iov];
      int n = 0;
      std::size_t total = 0;
      if (ctl_off_ < ctl_len_) {
        iov[n++] = {ctl_ + ctl_off_, ctl_len_ - ctl_off_};
        total += ctl_len_ - ctl_off_;
      }
      const std::uint64_t limit = closing_ ? posted_limit_ : posted_.load(std::memory_order_acquire);
      std::uint64_t startable = credits_;
      std::size_t out_bytes = in_flight_bytes_;
      for (std::uint64_t i = sent_local_; i < limit && n + 2 <= max_iov; ++i) {
        const bool started = i == sent_local_ && frame_off_ > 0;
        const std::size_t bytes = send_.header(i)->bytes;
        if (!started) {
          if (!may_start(startable, out_bytes, bytes)) break;
          --startable;
          out_bytes += bytes;
        }
        const std::size_t off = i == sent_local_ ? frame_off_ : 0;
        const std::byte* ext = external_[i % depth_];
        if (ext == nullptr) {
          iov[n++] = {send_.slot(i) + off, sizeof(slot_header) + bytes - off};
        } else {  // the header from the slot, the payload from the caller's memory
          constexpr std::size_t hs = sizeof(slot_header);
          if (off < hs) iov[n++] = {send_.slot(i) + off, hs - off};
          const std::size_t done = off > hs ? off - hs : 0;
          iov[n++] = {const_cast<std::byte*>(ext) + done, bytes - done};
        }
        total += sizeof(slot_header) + bytes - off;
      }
      if (n == 0) {
        if (closing_ && closing_sent_ && sent_local_ == posted_limit_) finish_tx();
        break;
      }
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = static_cast<std::size_t>(n);
      const ssize_t k = ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (k < 0) {
        const int e = errno;
        if (e == EINTR) continue;
        if (e == EAGAIN || e == EWOULDBLOCK) {
          want_writable_ = true;
          break;
        }
        news |= pump_rx();  // a closing frame may be waiting behind the reset
        on_stream_error(e);
        return true;
      }
      news |= consume_written(static_cast<std::size_t>(k));
      if (static_cast<std::size_t>(k) < total) want_writable_ = true;
    }
    return news;
  }

  // Records the link's failure; the first loss or protocol error wins.
  void fail(errc code, std::string why) {
    {
      std::lock_guard lock(mutex_);
      if (state_.load(std::memory_order_relaxed) == link_state::broken ||
          state_.load(std::memory_order_relaxed) == link_state::lost)
        return;
      code_ = code;
      why_ = std::move(why);
    }
    state_.store(code == errc::protocol ? link_state::broken : link_state::lost, std::memory_order_release);
  }

  friend class frame_reader;
  static constexpr int max_iov = 64;

  std::string who() const { return "rank " + std::to_string(peer_); }

  void garbage(const std::string& what) {
    fail(errc::protocol, "garbage from " + who() + ": " + what +
                             "; the stream to that rank is corrupt (mixed plait versions, or something "
                             "else writing to this job's sockets?)");
    rx_done_ = tx_done_ = true;
    ::shutdown(fd_.get(), SHUT_RDWR);
  }

  void on_end_of_stream() {
    rx_done_ = true;
    const link_state s = state_.load(std::memory_order_relaxed);
    if (s == link_state::closed) {
      const std::uint64_t left = remaining_.load(std::memory_order_relaxed);
      if (left > 0 || reader_.mid_frame())
        fail(errc::peer_lost, who() + " closed its connection before delivering its last " + std::to_string(left) +
                                  " slot(s) (its process exited or was killed while closing)");
      return;
    }
    if (s == link_state::ok)
      fail(errc::peer_lost,
           who() + (reader_.mid_frame() ? " closed its connection inside a frame" : " closed its connection") +
               " (process exited or was killed); see that rank's own output for why");
  }

  void on_stream_error(int e) {
    rx_done_ = tx_done_ = true;
    const link_state s = state_.load(std::memory_order_relaxed);
    if (s != link_state::ok && !(s == link_state::closed && remaining_.load(std::memory_order_relaxed) > 0)) return;
    const bool reset = e == ECONNRESET || e == EPIPE || e == ENOTCONN || e == ETIMEDOUT;
    fail(errc::peer_lost,
         who() + (reset ? " reset its connection (process exited or was killed): " : " connection failed: ") +
             plait::detail::errno_text(e));
  }

  // ---- frame_reader callbacks ----

  std::byte* on_slot_header(const slot_header& h) {
    if (auto why = check_data_header(h, slot_bytes_); !why.empty()) return garbage(why), nullptr;
    if (state_.load(std::memory_order_relaxed) == link_state::closed && remaining_.load(std::memory_order_relaxed) == 0)
      return garbage("a slot after its closing frame announced no more"), nullptr;
    if (arrived_local_ - released_.load(std::memory_order_acquire) >= depth_)
      return garbage("more slots than this rank granted credits for (depth " + std::to_string(depth_) + ")"), nullptr;
    std::memcpy(recv_.header(arrived_local_), &h, sizeof h);
    std::byte* dst = recv_.payload(arrived_local_);
    landing& e = landings_[arrived_local_ % depth_];
    if (e.index.load(std::memory_order_acquire) == arrived_local_ + 1) {
      if (same_frame(e.header, h)) dst = e.dst;
      e.index.store(0, std::memory_order_relaxed);
    }
    recv_dst_[arrived_local_ % depth_] = dst;
    return dst;
  }

  // Whether a frame's header is the one expected: all but the offset (the sender's
  // own diagnostics) and reserved.
  static bool same_frame(const slot_header& want, const slot_header& got) noexcept {
    return want.magic == got.magic && want.version == got.version && want.flags == got.flags &&
           want.bytes == got.bytes && want.sender == got.sender && want.desc == got.desc;
  }

  // Frame i's payload goes back to its slot, its first `bytes` copied there from
  // where it landed; false when it was in its slot already.
  bool to_slot(std::uint64_t i, std::size_t bytes) noexcept {
    std::byte*& d = recv_dst_[i % depth_];
    std::byte* slot = recv_.payload(i);
    if (d == nullptr || d == slot) return false;
    std::memcpy(slot, d, bytes);
    d = slot;
    return true;
  }

  void on_slot_complete() {
    ++arrived_local_;
    arrived_.store(arrived_local_, std::memory_order_release);
    if (state_.load(std::memory_order_relaxed) == link_state::closed)
      remaining_.store(remaining_.load(std::memory_order_relaxed) - 1, std::memory_order_release);
  }

  void on_garbage(const std::string& what) { garbage(what); }

  bool on_control(const control_frame& c) {
    if (c.version != tcp_wire_version)
      return garbage("control frame version " + std::to_string(c.version) + ", this build speaks " +
                     std::to_string(tcp_wire_version)),
             false;
    switch (c.type) {
      case control_type::credit:
        if (c.value == 0 || c.value > spent_credits_)
          return garbage("a credit of " + std::to_string(c.value) + " slots when only " +
                         std::to_string(spent_credits_) + " were outstanding"),
                 false;
        for (std::uint64_t i = frames_started() - spent_credits_, end = i + c.value; i < end; ++i)
          in_flight_bytes_ -= started_bytes_[i % depth_];
        spent_credits_ -= c.value;
        credits_ += c.value;
        return true;
      case control_type::closing: {
        if (state_.load(std::memory_order_relaxed) != link_state::ok) return garbage("a second closing frame"), false;
        const closing_info info = decode_closing(c.value);
        if (info.remaining > depth_)
          return garbage("a closing frame announcing " + std::to_string(info.remaining) + " more slots (depth is " +
                         std::to_string(depth_) + ")"),
                 false;
        std::lock_guard lock(mutex_);
        code_ = errc::peer_lost;
        if (info.code == errc::timeout && (info.culprit < 0 || info.culprit == rank_)) {
          code_ = errc::timeout;  // it gave up waiting for this rank: not a loss
          why_ = who() + " timed out waiting and closed its connection";
        } else if ((info.code == errc::peer_lost || info.code == errc::timeout) && info.culprit >= 0 &&
                   info.culprit != rank_) {
          code_ = info.code;
          blame_ = info.culprit;
          why_ = who() + (info.code == errc::timeout ? " timed out waiting for rank " : " lost rank ") +
                 std::to_string(info.culprit) + " and closed its connection; look at rank " +
                 std::to_string(info.culprit) + " for the cause";
        } else {
          why_ = who() +
                 " closed its connection (it finished and destroyed its communicator, or it aborted or "
                 "failed: see its own output) while this rank still needs it";
        }
        remaining_.store(info.remaining, std::memory_order_release);
        state_.store(link_state::closed, std::memory_order_release);
        return true;
      }
    }
    return garbage("a control frame of unknown type " + std::to_string(static_cast<unsigned>(c.type))), false;
  }

  void append_control(control_type type, std::uint64_t value) {
    control_frame c;
    c.type = type;
    c.value = value;
    std::memcpy(ctl_ + ctl_len_, &c, sizeof c);
    ctl_len_ += sizeof c;
  }

  // Control frames go only between data frames, never inside one.
  void stage_control(credit_timing when) {
    if (frame_off_ > 0 || ctl_off_ < ctl_len_) return;
    ctl_off_ = ctl_len_ = 0;
    if (closing_) {
      if (!closing_sent_) {
        posted_limit_ = posted_.load(std::memory_order_acquire);
        append_control(control_type::closing, encode_closing(posted_limit_ - sent_local_, close_why_));
        closing_sent_ = true;
      }
      return;  // no credits after closing: this rank reads no more slots
    }
    const std::uint64_t released = released_.load(std::memory_order_acquire);
    const bool frame_goes = posted_.load(std::memory_order_acquire) != sent_local_ && next_may_start();
    if (released != credited_ && (frame_goes || !credits_may_wait(released, when))) {
      append_control(control_type::credit, released - credited_);
      credited_ = released;
    }
  }

  bool consume_written(std::size_t k) {
    const std::size_t c = std::min(k, ctl_len_ - ctl_off_);
    ctl_off_ += c;
    k -= c;
    const std::uint64_t before = sent_local_;
    while (k > 0) {
      const std::size_t bytes = send_.header(sent_local_)->bytes;
      if (frame_off_ == 0) {  // this frame starts now: it spends a credit, and its bytes the window
        --credits_;
        ++spent_credits_;
        started_bytes_[sent_local_ % depth_] = bytes;
        in_flight_bytes_ += bytes;
      }
      const std::size_t len = sizeof(slot_header) + bytes;
      const std::size_t d = std::min(k, len - frame_off_);
      frame_off_ += d;
      k -= d;
      if (frame_off_ == len) {
        frame_off_ = 0;
        ++sent_local_;
      }
    }
    if (sent_local_ == before) return false;
    sent_.store(sent_local_, std::memory_order_release);
    return true;
  }

  // Whether a frame of `bytes` may start with `credits` left and `out_bytes` not yet
  // credited back: a credit, and room in the send window (always, when nothing is out).
  bool may_start(std::uint64_t credits, std::size_t out_bytes, std::size_t bytes) const noexcept {
    if (credits == 0) return false;
    if (window_bytes_ == 0 || out_bytes == 0) return true;
    return out_bytes + bytes <= std::max(window_bytes_, window_frames_ * bytes);
  }
  // Frames whose first byte has been written: those sent, and the one half written.
  std::uint64_t frames_started() const noexcept { return sent_local_ + (frame_off_ > 0 ? 1 : 0); }
  // The same for the next posted frame (sent_local_, posted: its header is written).
  bool next_may_start() const noexcept {
    return may_start(credits_, in_flight_bytes_, send_.header(sent_local_)->bytes);
  }

  void finish_tx() {
    tx_done_ = true;
    ::shutdown(fd_.get(), SHUT_WR);
  }

  const int rank_;
  const int peer_;
  plait::detail::fd_handle fd_;
  const std::size_t slot_bytes_;
  const std::size_t depth_;
  slot_ring send_;
  slot_ring recv_;
  // Per send slot: where its payload is read from when not the slot (post_from);
  // written by the executor before it publishes the slot, read by the I/O side.
  std::unique_ptr<const std::byte*[]> external_;
  // Per receive slot: a frame the executor expects, to land in its memory. `index`
  // (frame index + 1, 0: none) is stored last by the executor and cleared by the I/O
  // side when that frame's header arrives.
  struct landing {
    std::atomic<std::uint64_t> index{0};
    slot_header header;
    std::byte* dst = nullptr;
  };
  std::unique_ptr<landing[]> landings_;
  // Per receive slot: where its payload was read to (the slot, or where it landed);
  // written by the I/O side before arrived_, read by the executor after it.
  std::unique_ptr<std::byte*[]> recv_dst_;
  // Per frame started and not yet credited back (by frame index modulo depth): its
  // payload bytes. I/O side only.
  std::unique_ptr<std::size_t[]> started_bytes_;
  const std::size_t window_bytes_;   // link_config::send_window_bytes (0: no cap)
  const std::size_t window_frames_;  // link_config::send_window_frames

  // Shared counters, one writer each.
  alignas(64) std::atomic<std::uint64_t> posted_{0};  // executor
  std::atomic<std::uint64_t> released_{0};            // executor
  alignas(64) std::atomic<std::uint64_t> sent_{0};    // progress
  std::atomic<std::uint64_t> arrived_{0};             // progress
  std::atomic<std::uint64_t> remaining_{0};           // progress: frames a closed peer still sends
  std::atomic<link_state> state_{link_state::ok};     // progress

  // Failure, written once per state change under the mutex, read by health().
  mutable std::mutex mutex_;
  errc code_ = errc::peer_lost;
  std::string why_;
  int blame_ = peer_;         // the rank health() names: the peer, or the rank it lost
  close_reason close_why_{};  // what this rank's closing frame tells the peer

  // Executor only.
  alignas(64) std::uint64_t posted_local_ = 0;
  std::uint64_t released_local_ = 0;
  bool send_after_failure_ = false;

  // I/O side only: receive side.
  alignas(64) std::uint64_t arrived_local_ = 0;
  frame_reader reader_;
  bool rx_done_ = false;

  // I/O side only: send side.
  std::uint64_t sent_local_ = 0;
  std::size_t frame_off_ = 0;        // bytes of frame sent_local_ already written
  std::uint64_t credits_;            // frames that may start now
  std::uint64_t spent_credits_ = 0;  // frames started and not yet credited back
  std::uint64_t credited_ = 0;       // releases already returned as credits
  std::uint64_t sent_at_leave_ = 0;  // sent_local_ when this rank last left a call (pump_tx(leaving))
  bool exchanged_ = false;  // at the last pump_tx(leaving): this rank had sent the peer frames since the one before
  std::size_t in_flight_bytes_ = 0;  // payload bytes of the spent_credits_ frames
  std::byte ctl_[2 * sizeof(control_frame)];
  std::size_t ctl_len_ = 0, ctl_off_ = 0;
  bool want_writable_ = false;
  bool closing_ = false, closing_sent_ = false;
  std::uint64_t posted_limit_ = 0;
  bool tx_done_ = false;
};

}  // namespace plait::transport::tcp_detail
