// frame_reader: turns the bytes of one non-blocking socket into frames (tcp_wire.hpp).
//
// Used by the link's I/O side only. A slot's payload is read straight into the
// destination the sink gives for it; everything else lands in a 64 KiB staging buffer
// and is parsed from there, frames split across any number of reads included. After a
// large slot (16 KiB and more) the reader asks for no more than one header beyond the
// payload in progress, so the next large payload is read straight into its destination
// too, not staged and copied; after a small one it reads up to 64 KiB at once, many
// small frames in one call. The sink (tcp_link) decides what a frame means:
//   std::byte* on_slot_header(const slot_header&)  payload destination, nullptr to stop
//   void on_slot_complete()                         the whole payload is in place
//   bool on_control(const control_frame&)           false to stop
//   void on_garbage(const std::string& what)        neither magic: the stream is corrupt
// The sink checks a header before the reader uses its length; the reader allocates
// nothing after construction.
#pragma once

#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include <plait/transport/detail/tcp_wire.hpp>
#include <plait/wire.hpp>

namespace plait::transport::tcp_detail {

enum class read_status {
  drained,        // nothing more to read now
  end_of_stream,  // the peer closed its end (cleanly or not: the sink's state says)
  failed,         // the socket reported an error (errno in `error`)
  stopped,        // the sink refused a frame
};

struct read_result {
  read_status status = read_status::drained;
  int error = 0;
  bool news = false;  // a slot completed or a control frame was applied
};

class frame_reader {
 public:
  // Zeroed here, at connect: small frames land in staging, and a page of it touched
  // for the first time mid-run would be a page fault on the hot path.
  frame_reader() : staging_(new std::byte[staging_bytes]()) {}

  // Reads until the socket would block, ends, fails, or the sink stops.
  template <class Sink>
  read_result pump(int fd, Sink& sink) {
    read_result r;
    for (;;) {
      if (!parse(sink, r.news)) return r.status = read_status::stopped, r;
      if (begin_ == end_) {
        begin_ = end_ = 0;
      } else if (begin_ > 0) {  // a partial frame header: move it to the front
        std::memmove(staging_.get(), staging_.get() + begin_, end_ - begin_);
        end_ -= begin_;
        begin_ = 0;
      }
      // The payload in progress first, straight into its slot; what follows it into staging.
      // After a large slot, staging holds at most one header's bytes (parse() took the
      // rest), so the room asked for ends at the next header.
      std::size_t room = staging_bytes - end_;
      if (large_ && end_ < sizeof(plait::detail::slot_header)) room = sizeof(plait::detail::slot_header) - end_;
      iovec iov[2];
      int n = 0;
      if (payload_left_ > 0) iov[n++] = {payload_dst_, payload_left_};
      iov[n++] = {staging_.get() + end_, room};
      const std::size_t asked = payload_left_ + room;
      ++reads_;
      const ssize_t k = ::readv(fd, iov, n);
      if (k == 0) return r.status = read_status::end_of_stream, r;
      if (k < 0) {
        const int e = errno;
        if (e == EINTR) continue;
        if (e == EAGAIN || e == EWOULDBLOCK) return r;
        r.status = read_status::failed;
        r.error = e;
        return r;
      }
      std::size_t got = static_cast<std::size_t>(k);
      if (payload_left_ > 0) {
        const std::size_t d = std::min(got, payload_left_);
        payload_dst_ += d;
        payload_left_ -= d;
        got -= d;
        if (payload_left_ == 0) {
          sink.on_slot_complete();
          r.news = true;
        }
      }
      end_ += got;
      if (static_cast<std::size_t>(k) < asked) {  // the socket is drained for now
        if (!parse(sink, r.news)) r.status = read_status::stopped;
        return r;
      }
    }
  }

  // Bytes of an unfinished frame are held (the stream ended inside a frame).
  bool mid_frame() const noexcept { return payload_left_ > 0 || end_ != begin_; }

  // The payload being read now: bytes still to come, and (redirect) where they go
  // instead, its bytes so far having been moved there by the caller.
  std::size_t payload_left() const noexcept { return payload_left_; }
  void redirect(std::byte* dst) noexcept { payload_dst_ = dst; }

  // Diagnostics: readv calls made, and payload bytes copied out of staging.
  std::uint64_t reads() const noexcept { return reads_; }
  std::uint64_t staged_payload_bytes() const noexcept { return staged_payload_bytes_; }

  static constexpr std::size_t staging_bytes = 64 * 1024;
  static constexpr std::size_t large_slot_bytes = 16 * 1024;

 private:
  // Delivers every whole frame in staging; false when the sink stopped.
  template <class Sink>
  bool parse(Sink& sink, bool& news) {
    for (;;) {
      const std::size_t avail = end_ - begin_;
      if (payload_left_ > 0) {
        if (avail == 0) return true;
        const std::size_t d = std::min(avail, payload_left_);
        std::memcpy(payload_dst_, staging_.get() + begin_, d);
        staged_payload_bytes_ += d;
        payload_dst_ += d;
        payload_left_ -= d;
        begin_ += d;
        if (payload_left_ == 0) {
          sink.on_slot_complete();
          news = true;
        }
        continue;
      }
      if (avail < sizeof(std::uint32_t)) return true;
      const std::byte* p = staging_.get() + begin_;
      std::uint32_t magic;
      std::memcpy(&magic, p, sizeof magic);
      if (magic == plait::detail::slot_magic) {
        plait::detail::slot_header h;
        if (avail < sizeof h) return true;
        std::memcpy(&h, p, sizeof h);
        begin_ += sizeof h;
        std::byte* dst = sink.on_slot_header(h);  // checks h.bytes against the slot size
        if (dst == nullptr) return false;
        large_ = h.bytes >= large_slot_bytes;
        if (h.bytes == 0) {
          sink.on_slot_complete();
          news = true;
        } else {
          payload_dst_ = dst;
          payload_left_ = h.bytes;
        }
      } else if (magic == control_magic) {
        control_frame c;
        if (avail < sizeof c) return true;
        std::memcpy(&c, p, sizeof c);
        begin_ += sizeof c;
        if (!sink.on_control(c)) return false;
        news = true;
      } else {
        sink.on_garbage("a frame starting with " + hex32(magic) + ", which is neither a slot (" +
                        hex32(plait::detail::slot_magic) + ") nor a control frame (" + hex32(control_magic) + ")");
        return false;
      }
    }
  }

  std::unique_ptr<std::byte[]> staging_;
  std::size_t begin_ = 0, end_ = 0;  // unparsed bytes in staging
  std::byte* payload_dst_ = nullptr;
  std::size_t payload_left_ = 0;
  bool large_ = false;  // the last slot's payload was large_slot_bytes or more
  std::uint64_t reads_ = 0, staged_payload_bytes_ = 0;
};

}  // namespace plait::transport::tcp_detail
